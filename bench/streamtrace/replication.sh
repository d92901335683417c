#!/bin/bash
# replication.sh OUT: waits for the next throwaway cluster `pgwake bench`
# starts (/tmp/pgwake-pgcluster-*), then writes pg_stat_replication every
# 100 ms to OUT: time, application, state, bytes the walsender has not sent
# yet (current WAL - sent_lsn), bytes not confirmed (current WAL -
# flush_lsn), write_lag ms, active backends. Stop it with kill.
out=$1
before=$(ls -d /tmp/pgwake-pgcluster-*/ 2>/dev/null)
for _ in $(seq 1 300); do
  for d in /tmp/pgwake-pgcluster-*/; do
    echo "$before" | grep -qx "$d" && continue
    port=$(ls -a "$d/sock/" 2>/dev/null | grep -o '^\.s\.PGSQL\.[0-9]*$' | grep -o '[0-9]*$' | head -1)
    [ -n "$port" ] || continue
    sleep 2
    echo "SELECT to_char(clock_timestamp(), 'HH24:MI:SS.MS'), application_name, state,
      pg_wal_lsn_diff(pg_current_wal_lsn(), sent_lsn)::bigint,
      pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint,
      extract(epoch FROM write_lag) * 1000,
      (SELECT count(*) FROM pg_stat_activity WHERE state = 'active')
    FROM pg_stat_replication \\watch 0.1" |
      exec psql -h "$d/sock" -p "$port" -U postgres -d postgres -At -F' ' > "$out" 2>&1
  done
  sleep 0.2
done
