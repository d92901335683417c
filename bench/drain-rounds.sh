#!/bin/bash
# drain-rounds.sh ROUNDS JOBS BUILD... : drains JOBS jobs with each bench/peers
# build in turn (the binaries $PEERS/peers-BUILD), ROUNDS times, pgwake alone,
# 10 workers, and prints per build the median of the harness's jobs/s and of
# jobs/s counted from the first job's start (jobs / (seconds - first start)).
# DATABASE_URL: the cluster (wal_level=logical); PEERS: where the builds are.
set -euo pipefail
R=$1 J=$2
shift 2
: "${DATABASE_URL:?set DATABASE_URL}"
PEERS=${PEERS:-.}
out=$(mktemp)
for _ in $(seq "$R"); do
	for b in "$@"; do
		line=$("$PEERS/peers-$b" --database-url "$DATABASE_URL" --systems pgwake --modes drain \
			--workers 10 --runs 1 --jobs "$J" 2>&1 | grep "result:")
		echo "$b $line" >>"$out"
	done
done
python3 - "$out" "$J" <<'PY'
import re, statistics, sys, collections
runs = collections.defaultdict(list)
jobs = int(sys.argv[2])
for line in open(sys.argv[1]):
    b = line.split()[0]
    get = lambda k: (m := re.search(k + r"=([0-9.]+)", line)) and float(m.group(1))
    rate, secs, first = get("jobs/s"), get("seconds"), get("first_start_ms")
    runs[b].append((rate, jobs / (secs - first / 1000) if first else None))
for b, v in runs.items():
    after = [a for _, a in v if a]
    print(f"{b:10} jobs/s {statistics.median(r for r, _ in v):8.0f}  from the first start "
          f"{statistics.median(after) if after else float('nan'):8.0f}  runs {[int(r) for r, _ in v]}")
PY
rm -f "$out"
