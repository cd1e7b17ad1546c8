#!/usr/bin/env bash
# Run the test suite against real PostgreSQL, Redis and headless Chromium.
# Uses DATABASE_URL / REDIS_URL when set, else servers answering on the default local ports,
# else starts throwaway instances from the installed server binaries (installing Debian's
# packages when running as root and they are missing). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
TMP=$(mktemp -d -t gpuportal-test.XXXXXX)
cleanup() {
  [ -f "$TMP/redis.pid" ] && kill "$(cat "$TMP/redis.pid")" 2>/dev/null || true
  if [ -f "$TMP/pg/postmaster.pid" ]; then
    as_pg "$PG_BIN/pg_ctl" -D "$TMP/pg" -m immediate stop >/dev/null 2>&1 || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
is_root() { [ "$(id -u)" = 0 ]; }
apt_install() {
  if is_root && command -v apt-get >/dev/null; then
    echo "test: installing $* from Debian's packages"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
  else
    echo "test: $* is missing and cannot be installed (not root or no apt-get)" >&2
    return 1
  fi
}
as_pg() { if is_root; then runuser -u postgres -- "$@"; else "$@"; fi; }

# PostgreSQL
if [ -z "${DATABASE_URL:-}" ]; then
  if port_open 127.0.0.1 5432; then
    export DATABASE_URL="postgres://postgres@127.0.0.1:5432/gpuportal"
  else
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -z "$PG_BIN" ]; then apt_install postgresql; PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1); fi
    mkdir -p "$TMP/pg" "$TMP/sock"
    is_root && chown -R postgres "$TMP" && chmod 755 "$TMP"
    as_pg "$PG_BIN/initdb" -D "$TMP/pg" -U postgres --auth=trust -E UTF8 >/dev/null
    as_pg "$PG_BIN/pg_ctl" -D "$TMP/pg" -l "$TMP/pg.log" -w \
      -o "-p 55432 -k $TMP/sock -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off" start >/dev/null
    export DATABASE_URL="postgres://postgres@127.0.0.1:55432/gpuportal"
    echo "test: started a throwaway PostgreSQL on port 55432"
  fi
fi

# Redis
if [ -z "${REDIS_URL:-}" ]; then
  if port_open 127.0.0.1 6379; then
    export REDIS_URL="redis://127.0.0.1:6379/15"
  else
    command -v redis-server >/dev/null || apt_install redis-server
    redis-server --port 56379 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
      --pidfile "$TMP/redis.pid" --logfile "$TMP/redis.log" --dir "$TMP"
    for _ in $(seq 50); do port_open 127.0.0.1 56379 && break; sleep 0.1; done
    export REDIS_URL="redis://127.0.0.1:56379/15"
    echo "test: started a throwaway Redis on port 56379"
  fi
fi

# Chromium for the browser tests
if [ -z "${CHROMIUM_PATH:-}" ]; then
  CHROMIUM_PATH=$(command -v chromium || command -v chromium-browser || true)
  if [ -z "$CHROMIUM_PATH" ]; then apt_install chromium && CHROMIUM_PATH=$(command -v chromium); fi
  export CHROMIUM_PATH
fi

. scripts/test-slurm.sh "$TMP"  # a throwaway Slurm cluster for tests/slurm (or the reason it skips)
source scripts/test-containers.sh  # Podman, runc and the job image for the container tests
export DJANGO_SETTINGS_MODULE=config.settings.test
# -p tests.lanes: the unit lane (tests/unit, no database) runs first, and the time each tests/
# directory took is printed before pytest's closing line (tests/lanes.py).
# tests/embedded is a second lane: the embedded default's fallbacks (SQLite, file cache, no
# Redis) under config.settings.embedded_test. It runs after the main suite when no test path
# is named, and alone when it is the path named.
named=0 embedded=0
for arg in "$@"; do
  case "$arg" in
    tests/embedded*) embedded=1 ;;
    tests*|*.py|*::*) named=1 ;;
  esac
done
# PyTorch (CPU) for the torch.distributed gang proof, only when the stack tests run (the whole
# suite, or a path under tests/stack): installed into the venv when missing, else that test skips.
want_torch=$((1 - named))
case " $* " in *" tests/stack"*|*" tests "*) want_torch=1 ;; esac
if [ "$want_torch" = 1 ] && [ "$embedded" = 0 ] && ! "$PY" -c "import torch" 2>/dev/null; then
  echo "test: installing PyTorch (CPU) for the torch.distributed test"
  "$PY" -m pip install -q -r requirements-torch.txt \
    || echo "test: PyTorch could not be installed; the torch.distributed test skips" >&2
fi
if [ "$embedded" = 0 ]; then
  echo "test: PostgreSQL $DATABASE_URL, Redis $REDIS_URL, Chromium ${CHROMIUM_PATH:-none}"
  "$PY" -m pytest -p tests.lanes "$@"
fi
if [ "$embedded" = 1 ] || [ "$named" = 0 ]; then
  echo "test: the embedded lane (SQLite, file cache, no Redis)"
  lane=(); [ "$embedded" = 1 ] || lane=(tests/embedded)
  DJANGO_SETTINGS_MODULE=config.settings.embedded_test "$PY" -m pytest -p tests.lanes "${lane[@]}" "$@" \
    || { status=$?; [ "$status" = 5 ] || exit "$status"; }  # 5: -k/-m left none to run
fi
