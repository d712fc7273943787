#!/usr/bin/env bash
# Checks that PostgreSQL, RabbitMQ and Redis answer on localhost; starts them when they are
# installed but stopped; otherwise says exactly what to run.
set -u
ok=1

answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() {  # port, name
  for _ in $(seq 1 60); do answers "$1" && return 0; sleep 1; done
  return 1
}

ensure() {  # port, name, start command (empty if not installed)
  local port=$1 name=$2 start=$3
  if answers "$port"; then echo "ok: $name on 127.0.0.1:$port"; return; fi
  if [ -n "$start" ]; then
    echo "starting $name: $start"
    bash -c "$start" >/dev/null 2>&1 || true
    if wait_for "$port"; then echo "ok: $name on 127.0.0.1:$port"; return; fi
  fi
  ok=0
  echo "MISSING: $name does not answer on 127.0.0.1:$port."
}

pg_start=""
if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
  pg_start="pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | head -1) main start"
fi
rabbit_start=""
command -v rabbitmq-server >/dev/null && rabbit_start="rabbitmq-server -detached"
redis_start=""
command -v redis-server >/dev/null && redis_start="redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no"

ensure 5432 PostgreSQL "$pg_start"
ensure 5672 RabbitMQ "$rabbit_start"
ensure 6379 Redis "$redis_start"

if [ $ok = 0 ]; then
  cat <<'MSG'
Start the missing services, either from your distribution's packages, e.g.
  sudo apt-get install postgresql rabbitmq-server redis-server
or with Docker (the compose file wants its passwords in the environment; point DATABASE_URL,
CELERY_BROKER_URL and RENQ_REDIS_URL at them):
  docker compose -f docker/docker-compose.yml up -d postgres rabbitmq redis
then run the make target again.
MSG
  exit 1
fi
