#!/usr/bin/env bash
# Set up and start the portal on the embedded default (or DATABASE_URL / REDIS_URL when set).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
PORT=${PORT:-8000}
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-portal.settings.local}
mkdir -p var/broker var/log
"$PY" manage.py migrate --noinput -v0
"$PY" manage.py seed_demo
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop EXIT INT TERM
if [ -x scripts/run-workers.sh ]; then
  bash scripts/run-workers.sh & pids+=($!)
fi
echo
echo "  GPU Cloud portal: http://127.0.0.1:${PORT}/"
echo "  API docs:         http://127.0.0.1:${PORT}/api/docs/"
echo "  Log in with the demo accounts listed above. Ctrl-C stops everything."
echo
"$PY" manage.py runserver "127.0.0.1:${PORT}" --noreload &
pids+=($!)
wait "${pids[-1]}"
