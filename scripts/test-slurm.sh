#!/usr/bin/env bash
# A throwaway Slurm cluster for the tests: munged, slurmdbd (accounting on MariaDB), slurmctld and
# two slurmd (nodes gpu-a and gpu-b, four A100 GRES each whose "device files" are links to /dev/null) on this host,
# every path in a temp dir, every port chosen free, torn down at exit.
#
# Sourced by scripts/test.sh (`. scripts/test-slurm.sh "$TMP"`) so that it can export SLURM_CONF
# (and PORTAL_TEST_SLURM=1) for pytest. Installs Debian's slurm-wlm, slurmdbd and munge when it
# runs as root and they are missing. When Slurm cannot be had, it says why and exports
# PORTAL_TEST_SLURM_SKIP with the reason; the tests under tests/slurm then skip with it.
# Run on its own (`bash scripts/test-slurm.sh`) it starts the cluster and prints the environment,
# then waits until interrupted.

# A throwaway MariaDB for slurmdbd (datadir under $1, port $2, no grants: loopback only, and it
# lives as long as the test run). Installs Debian's mariadb-server when root and missing.
slurm_mariadb() {
  local d=$1 port=$2
  if ! command -v mariadbd >/dev/null || ! command -v mariadb-install-db >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "test: installing mariadb-server from Debian's packages (Slurm's accounting store)"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q mariadb-server mariadb-client >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -q mariadb-server mariadb-client >/dev/null 2>&1; }
    fi
  fi
  if ! command -v mariadbd >/dev/null || ! command -v mariadb-install-db >/dev/null; then
    export PORTAL_TEST_SLURM_SKIP="MariaDB (slurmdbd's accounting store) is neither answering on 127.0.0.1:3306 nor installable"
    echo "test: $PORTAL_TEST_SLURM_SKIP" >&2
    return 1
  fi
  mkdir -p "$d/mysql"
  mariadb-install-db --user=root --datadir="$d/mysql" --auth-root-authentication-method=normal \
    >"$d/log/mariadb-install.log" 2>&1
  mariadbd --user=root --datadir="$d/mysql" --bind-address=127.0.0.1 --port="$port" \
    --socket="$d/mysql.sock" --pid-file="$d/mariadb.pid" --skip-grant-tables \
    --log-error="$d/log/mariadb.log" >/dev/null 2>&1 &
  local i
  for i in $(seq 150); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    export PORTAL_TEST_SLURM_SKIP="the throwaway MariaDB did not start (see $d/log/mariadb.log)"
    echo "test: $PORTAL_TEST_SLURM_SKIP" >&2
    return 1
  fi
  echo "test: started a throwaway MariaDB on port $port for slurmdbd"
}

slurm_main() {
  local -  # the caller's set -e/-o pipefail stay the caller's: a failed step here means a skip
  set +e +o pipefail
  local base=${1:-$(mktemp -d -t gpuportal-slurm.XXXXXX)}
  local d="$base/slurm"
  mkdir -p "$d/spool/ctld" "$d/spool/gpu-a" "$d/spool/gpu-b" "$d/log" "$d/shared"
  chmod 755 "$base" "$d" "$d/shared"
  SLURM_TEST_DIR=$d

  if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v munged >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "test: installing slurm-wlm, slurmdbd and munge from Debian's packages"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm slurmdbd munge >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm slurmdbd munge >/dev/null 2>&1; }
    fi
  fi
  if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v munged >/dev/null; then
    export PORTAL_TEST_SLURM_SKIP="Slurm (slurm-wlm, slurmdbd, munge) is not installed and cannot be (not root or no apt-get)"
    echo "test: $PORTAL_TEST_SLURM_SKIP" >&2
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    export PORTAL_TEST_SLURM_SKIP="the throwaway Slurm cluster needs root (slurmd starts jobs as their user)"
    echo "test: $PORTAL_TEST_SLURM_SKIP" >&2
    return 0
  fi

  local ports
  ports=$(python3 - <<'EOF'
import socket
socks = []
for _ in range(5):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
)
  read -r CTLD_PORT DBD_PORT NODE_A_PORT NODE_B_PORT MYSQL_PORT <<<"$ports"
  local cluster="t$(date +%s%N | tail -c 9)"
  SLURM_TEST_DB="slurm_acct_$cluster"
  # slurmdbd's accounting store: a MariaDB answering on 3306, else a throwaway one of our own
  local mysql_port=3306
  if ! (exec 3<>/dev/tcp/127.0.0.1/3306) 2>/dev/null; then
    slurm_mariadb "$d" "$MYSQL_PORT" || return 0
    mysql_port=$MYSQL_PORT
  fi
  SLURM_TEST_MYSQL_PORT=$mysql_port

  # munge: its own key and socket
  dd if=/dev/urandom of="$d/munge.key" bs=1024 count=1 status=none
  chmod 400 "$d/munge.key"
  munged --force --socket="$d/munge.sock" --key-file="$d/munge.key" --pid-file="$d/munged.pid" \
    --log-file="$d/log/munged.log" --seed-file="$d/munge.seed" 2>>"$d/log/munged.log" || {
      export PORTAL_TEST_SLURM_SKIP="munged did not start (see $d/log/munged.log)"; return 0; }

  # Slurm 22.05 drops a GPU GRES that has no File=; the "devices" are links to /dev/null
  # (a character device, so slurmd accepts them), nothing is ever opened
  local n
  for n in a b; do
    mkdir -p "$d/dev/$n"
    for i in 0 1 2 3; do ln -sf /dev/null "$d/dev/$n/nvidia$i"; done
  done
  cat >"$d/gres.conf" <<EOF
AutoDetect=off
NodeName=gpu-a Name=gpu Type=a100 File=$d/dev/a/nvidia[0-3]
NodeName=gpu-b Name=gpu Type=a100 File=$d/dev/b/nvidia[0-3]
EOF
  cat >"$d/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$d/munge.sock
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$d/log/slurmdbd.log
PidFile=$d/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$mysql_port
StorageUser=root
StorageLoc=$SLURM_TEST_DB
EOF
  chmod 600 "$d/slurmdbd.conf"
  cat >"$d/slurm.conf" <<EOF
ClusterName=$cluster
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$d/munge.sock
CredType=cred/munge
StateSaveLocation=$d/spool/ctld
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1,defer_batch
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
GresTypes=gpu
PriorityType=priority/multifactor
PreemptType=preempt/qos
PreemptMode=REQUEUE
PreemptExemptTime=00:00:00
JobRequeue=1
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$d/munge.sock
AccountingStorageEnforce=associations,limits,qos
AccountingStorageTRES=gres/gpu,gres/gpu:a100
JobCompType=jobcomp/none
MinJobAge=300
KillWait=2
OverTimeLimit=0
InactiveLimit=0
SlurmdTimeout=30
MessageTimeout=5
UnkillableStepTimeout=5
NodeName=gpu-a NodeHostname=localhost NodeAddr=127.0.0.1 Port=$NODE_A_PORT CPUs=16 RealMemory=65536 Gres=gpu:a100:4 State=UNKNOWN
NodeName=gpu-b NodeHostname=localhost NodeAddr=127.0.0.1 Port=$NODE_B_PORT CPUs=16 RealMemory=65536 Gres=gpu:a100:4 State=UNKNOWN
PartitionName=gpu Nodes=gpu-a,gpu-b Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  export SLURM_CONF="$d/slurm.conf"

  slurm_stop() {
    local -
    set +e
    local f
    # this cluster's jobs first, so that no slurmstepd outlives its slurmd
    scancel --full --quiet --user=root 2>/dev/null
    sleep 0.5
    for f in "$SLURM_TEST_DIR"/slurmd-gpu-a.pid "$SLURM_TEST_DIR"/slurmd-gpu-b.pid \
             "$SLURM_TEST_DIR"/slurmctld.pid "$SLURM_TEST_DIR"/slurmdbd.pid "$SLURM_TEST_DIR"/munged.pid; do
      [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
    done
    sleep 0.5
    mysql -h 127.0.0.1 -P "$SLURM_TEST_MYSQL_PORT" -u root -e "DROP DATABASE IF EXISTS \`$SLURM_TEST_DB\`" 2>/dev/null
    [ -f "$SLURM_TEST_DIR/mariadb.pid" ] && kill "$(cat "$SLURM_TEST_DIR/mariadb.pid")" 2>/dev/null
    true
  }

  slurmdbd 2>>"$d/log/slurmdbd.log" || true
  local i
  for i in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$DBD_PORT") 2>/dev/null && break; sleep 0.1; done
  # the cluster and the QOS ladder (the preemptible tier is preemptable by every other one)
  sacctmgr -i add cluster "$cluster" >/dev/null 2>&1
  sacctmgr -i add qos scavenger PreemptMode=requeue Priority=0 >/dev/null 2>&1
  sacctmgr -i add qos low,high,urgent >/dev/null 2>&1
  sacctmgr -i modify qos where name=normal,low,high,urgent set Preempt=scavenger >/dev/null 2>&1
  slurmctld -f "$d/slurm.conf" 2>>"$d/log/slurmctld.log" || true
  for i in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$CTLD_PORT") 2>/dev/null && break; sleep 0.1; done
  slurmd -f "$d/slurm.conf" -N gpu-a 2>>"$d/log/slurmd-gpu-a.log" || true
  slurmd -f "$d/slurm.conf" -N gpu-b 2>>"$d/log/slurmd-gpu-b.log" || true
  for i in $(seq 100); do
    [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c idle)" = 2 ] && break
    sleep 0.1
  done
  if [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c idle)" != 2 ]; then
    export PORTAL_TEST_SLURM_SKIP="the throwaway Slurm cluster did not come up (logs in $d/log)"
    echo "test: $PORTAL_TEST_SLURM_SKIP" >&2
    sinfo 2>&1 | head -5 >&2
    return 0
  fi
  export PORTAL_TEST_SLURM=1 PORTAL_TEST_SLURM_SHARED="$d/shared"
  echo "test: Slurm cluster $cluster up (slurmctld :$CTLD_PORT, slurmdbd :$DBD_PORT, nodes gpu-a gpu-b)"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -u
  slurm_main "$@"
  trap 'slurm_stop' EXIT
  trap 'kill $! 2>/dev/null; exit 130' INT TERM
  echo "export SLURM_CONF=$SLURM_CONF PORTAL_TEST_SLURM_SHARED=${PORTAL_TEST_SLURM_SHARED:-}"
  [ -n "${PORTAL_TEST_SLURM_SKIP:-}" ] && exit 1
  sleep infinity &
  wait $!  # (a foreground sleep would hold off the INT/TERM trap until it ended)
else
  slurm_main "$@"
  if declare -F slurm_stop >/dev/null; then
    _prev_exit_trap=$(trap -p EXIT | sed -e "s/^trap -- '//" -e "s/' EXIT\$//")
    # shellcheck disable=SC2064
    trap "slurm_stop; ${_prev_exit_trap:-true}" EXIT
    # killed rather than ended, the run still stops its daemons (through the EXIT trap)
    if [ -z "$(trap -p TERM)" ]; then trap 'exit 143' TERM; fi
    if [ -z "$(trap -p INT)" ]; then trap 'exit 130' INT; fi
  fi
fi
