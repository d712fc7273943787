#!/bin/bash
# Fresh GPU pool processes: start the README's embedding worker, kill -9 its pool process N
# times 7 s apart (Celery forks a new one each time), and count the pool processes whose
# threads died at start ("Exception in thread", e.g. EBADF from a file descriptor closed under
# them). Run by hand from the project root: bench/pool_refork.sh [N] [LOG]
set -u
n=${1:-12}
log=${2:-/tmp/renq-pool-refork.log}
.venv/bin/celery -A renq_site worker -l info --concurrency 1 -n "refork$$@%h" \
  -Q embedding.realtime,embedding.api,embedding.batch,embedding.offline > "$log" 2>&1 &
parent=$!
sleep 12
for _ in $(seq "$n"); do
  kill -9 "$(pgrep -P "$parent" | head -1)" 2>/dev/null
  sleep 7
done
kill -TERM "$parent"; sleep 3; kill -9 "$parent" 2>/dev/null; pkill -9 -P "$parent" 2>/dev/null
echo "$log: $(grep -c 'Exception in thread' "$log") pool processes whose threads died," \
  "$(grep -c 'exited with' "$log") killed (one more started first)"
