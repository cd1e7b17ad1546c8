#!/usr/bin/env bash
# Set up and start the portal with its Celery worker and beat and one simulated agent per
# demo node, on the embedded default (or DATABASE_URL / REDIS_URL when set).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
CELERY=${VENV:-.venv}/bin/celery
PORT=${PORT:-8000}
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-config.settings.local}
export AGENT_PORTAL_URL="http://127.0.0.1:${PORT}"
mkdir -p var/broker var/log var/agents var/shared-storage
"$PY" manage.py migrate --noinput -v0
"$PY" manage.py seed_demo --agent-tokens var/agents

pids=()
stop() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT INT TERM

# The workload runtime: containers when Podman is here (the job image is built once, then
# cached under var/images), else the process runtime (jobs as their own uid when root).
RUNTIME_TEST_IMAGE=""
if command -v podman >/dev/null 2>&1; then
  source scripts/test-containers.sh
fi
if [ -n "$RUNTIME_TEST_IMAGE" ]; then
  export AGENT_RUNTIME=container AGENT_DEFAULT_IMAGE="$RUNTIME_TEST_IMAGE"
  RUNTIME_BANNER="containers (Podman, image $RUNTIME_TEST_IMAGE)"
else
  export AGENT_RUNTIME=process
  RUNTIME_BANNER="processes (no container engine here: demo isolation only)"
fi

# Pages are pushed (server-sent events over Redis pub/sub) when Redis is configured: then the
# portal runs under uvicorn (ASGI), where the stream is a coroutine. The embedded default has no
# Redis: Django's runserver (WSGI) serves it, the stream answers 204 and pages poll.
if [ -n "${REDIS_URL:-}" ]; then
  ${VENV:-.venv}/bin/uvicorn config.asgi:application --host 127.0.0.1 --port "${PORT}" \
    --log-level warning >var/log/web.log 2>&1 &
  WEB_BANNER="uvicorn (ASGI): pages pushed by server-sent events"
else
  "$PY" manage.py runserver "127.0.0.1:${PORT}" --noreload >var/log/web.log 2>&1 &
  WEB_BANNER="runserver (WSGI): pages poll (push needs REDIS_URL)"
fi
pids+=($!)
"$CELERY" -A config worker -Q scheduler,default,provisioning,telemetry,billing \
  --pool threads --concurrency 4 --loglevel INFO >var/log/worker.log 2>&1 &
pids+=($!)
"$CELERY" -A config beat --schedule var/celerybeat-schedule --loglevel INFO >var/log/beat.log 2>&1 &
pids+=($!)

# Wait for the web server before the agents register.
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/${PORT}") 2>/dev/null && break
  sleep 0.2
done
while IFS=$'\t' read -r node gpus; do
  PORTAL_URL="$AGENT_PORTAL_URL" NODE_TOKEN_FILE="var/agents/${node}.token" AGENT_SIMULATE=1 \
    AGENT_SIM_GPUS="$gpus" AGENT_HOSTNAME="$node" AGENT_WORKDIR="var/agents/${node}" \
    AGENT_SHARED_ROOT="${AGENT_SHARED_ROOT:-var/shared-storage}" \
    "$PY" -m agent >"var/log/agent-${node}.log" 2>&1 &
  pids+=($!)
done <var/agents/agents.tsv

cat <<MSG

  GPU Cloud portal   http://127.0.0.1:${PORT}/
  API docs           http://127.0.0.1:${PORT}/api/docs/
  Served by          ${WEB_BANNER}
  Logs               var/log/ (web, worker, beat, one per simulated agent)
  Jobs run as        ${RUNTIME_BANNER}

  Log in as researcher@gpucloud.example / researcher-demo-pass (or the operator above).
  Try a demo job: command  python3 -m agent.workload --seconds 60  with a checkpoint dir.
  Ctrl-C stops everything.

MSG
wait "${pids[0]}"
