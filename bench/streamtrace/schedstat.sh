#!/bin/bash
# schedstat.sh OUT: every 0.5 s, appends each walsender's
# /proc/PID/schedstat to OUT: time, pid, then nanoseconds on CPU,
# nanoseconds runnable but waiting for a CPU, timeslices. The differences
# between two lines say how much of that time the walsender ran and how
# much it waited in the run queue. Stop it with kill.
out=$1
: > "$out"
while true; do
  t=$(date +%H:%M:%S.%N | cut -c1-12)
  for p in $(pgrep -f "postgres: walsender"); do
    echo "$t $p $(cat /proc/$p/schedstat 2>/dev/null)" >> "$out"
  done
  sleep 0.5
done
