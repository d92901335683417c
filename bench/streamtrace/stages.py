#!/usr/bin/env python3
"""stages.py TRACE: where the commit-to-broker time of the drain goes.

TRACE is the file a build with trace.patch writes (PGWAKE_TRACE): one line
per forwarded transaction: last event id, events, then unix microseconds of
the first event's `at`, the commit (pgoutput's commit time), the reader's
receipt of BEGIN, of COMMIT, the hand-over to the publisher, the
publisher's take, the send to NATS, the broker's acknowledgement, and the
walsender's send time of BEGIN (its XLogData header). The insert phase
(transactions of 500 events or more) and everything before it are left out.
"""
import statistics
import sys

rows = [list(map(int, l.split())) for l in open(sys.argv[1])]
last = max((i for i, r in enumerate(rows) if r[1] >= 500), default=-1)
rows = rows[last + 1:]
AT, COMMIT, BEGIN, RECV, HANDED, DEQ, SENT, ACKED, SERVER = 2, 3, 4, 5, 6, 7, 8, 9, 10
stages = [
    ("at -> commit record", AT, COMMIT),
    ("commit -> walsender sends BEGIN", COMMIT, SERVER),
    ("walsender -> reader has BEGIN", SERVER, BEGIN),
    ("BEGIN -> COMMIT read", BEGIN, RECV),
    ("handed -> publisher takes", HANDED, DEQ),
    ("taken -> sent (room, encode, send)", DEQ, SENT),
    ("sent -> broker ack", SENT, ACKED),
    ("at -> broker ack", AT, ACKED),
]


def pct(a, p):
    a = sorted(a)
    return a[min(len(a) - 1, int(p / 100 * len(a)))]


print("transactions", len(rows), "events", sum(r[1] for r in rows))
print("%-36s %8s %8s %8s %8s" % ("stage (ms)", "p50", "p90", "p99", "max"))
for name, a, b in stages:
    d = [(r[b] - r[a]) / 1000 for r in rows]
    print("%-36s %8.1f %8.1f %8.1f %8.1f" % (name, pct(d, 50), pct(d, 90), pct(d, 99), max(d)))
worst = sorted(rows, key=lambda r: r[ACKED] - r[AT])[-max(1, len(rows) // 50):]
print("the worst 2% of transactions (by at -> broker ack), mean ms per stage:")
for name, a, b in stages:
    print("  %-34s %8.1f" % (name, statistics.mean((r[b] - r[a]) / 1000 for r in worst)))
