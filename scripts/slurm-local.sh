#!/usr/bin/env bash
# A real one-node Slurm on loopback, for detcheck's `--launcher srun` tests (tests/slurm.rs,
# python/tests/test_slurm.py) and for trying the launcher by hand (docs/slurm.md).
#
#   scripts/slurm-local.sh start    # install (apt, once), configure, start munged, slurmctld, slurmd
#   scripts/slurm-local.sh status   # what runs, and `sinfo`
#   scripts/slurm-local.sh stop     # end exactly the daemons `start` started (their pid files)
#
# Debian's packages (slurmctld, slurmd, slurm-client, munge: Slurm 22.05) with
# --no-install-recommends; no systemd: the daemons are started by hand, as root. The node is this
# host (`hostname -s`) at 127.0.0.1 with `nproc` CPUs, one partition `debug`, proctrack/linuxproc
# and task/none (no cgroups needed), MpiDefault=none (pmix and pmi2 are there for `--mpi=`).
# Everything Slurm keeps (state, spool, logs, pid files) is under $DETCHECK_SLURM_DIR
# (/var/lib/detcheck-slurm); its slurm.conf is linked from /etc/slurm/slurm.conf when that path
# is free or already ours, so `srun`, `sbatch` and `sinfo` find it without SLURM_CONF.
#
# Idempotent: `start` with everything up only waits for the node; a daemon that was already
# running before `start` (a munged of the machine's) is used and never stopped. Needs root.
set -euo pipefail

DIR=${DETCHECK_SLURM_DIR:-/var/lib/detcheck-slurm}
CONF=$DIR/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf
# How long `start` waits for the node to be idle.
WAIT_SECONDS=${DETCHECK_SLURM_WAIT:-60}
PACKAGES=(slurmctld slurmd slurm-client munge)

say() { echo "slurm-local: $*"; }
die() {
    echo "slurm-local: error: $*" >&2
    exit 1
}

# The pid in a pid file when that process is alive, else nothing.
live_pid() {
    local file=$1 pid
    [[ -s $file ]] || return 1
    pid=$(tr -dc '0-9' <"$file")
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return 0
    [[ $(id -u) -eq 0 ]] || die "installing ${missing[*]} needs root (apt-get)"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
}

write_config() {
    local host cpus
    host=$(hostname -s)
    cpus=$(nproc)
    mkdir -p "$DIR/ctld" "$DIR/spool" "$DIR/run"
    cat >"$CONF.new" <<EOF
# Written by detcheck's scripts/slurm-local.sh: a one-node Slurm on loopback.
ClusterName=detcheck
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
KillWait=2
# A time limit is enforced within a few seconds (detcheck's fault tests use 1 minute).
OverTimeLimit=0
MessageTimeout=10
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.new" "$CONF"
    mkdir -p "$(dirname "$ETC_CONF")"
    if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then
        :
    elif [[ -e $ETC_CONF || -L $ETC_CONF ]]; then
        say "$ETC_CONF exists and is not ours: use SLURM_CONF=$CONF"
    else
        ln -s "$CONF" "$ETC_CONF"
    fi
}

start_munged() {
    if pgrep -x munged >/dev/null; then
        return 0 # the machine's, or ours from an earlier start: used, never restarted
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    chmod 0755 /run/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        say "creating /etc/munge/munge.key"
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 0400 /etc/munge/munge.key
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    # Ours: `stop` ends it.
    cp /run/munge/munged.pid "$DIR/run/munged.pid"
}

start_daemons() {
    export SLURM_CONF=$CONF
    if ! live_pid "$DIR/run/slurmctld.pid" >/dev/null; then
        /usr/sbin/slurmctld -f "$CONF" || die "slurmctld did not start: see $DIR/slurmctld.log"
    fi
    if ! live_pid "$DIR/run/slurmd.pid" >/dev/null; then
        /usr/sbin/slurmd -f "$CONF" || die "slurmd did not start: see $DIR/slurmd.log"
    fi
}

wait_idle() {
    export SLURM_CONF=$CONF
    local host state waited=0
    host=$(hostname -s)
    while :; do
        state=$(sinfo -h -N -n "$host" -o '%T' 2>/dev/null | head -n1 || true)
        case $state in
        idle | mixed | allocated) break ;;
        down* | drain* | fail*) scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
        esac
        if ((waited >= WAIT_SECONDS * 10)); then
            die "the node $host is not idle after ${WAIT_SECONDS}s (state: '${state:-no answer}'); see $DIR/slurmctld.log and $DIR/slurmd.log"
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    say "up: node $host is $state ($(nproc) CPUs); SLURM_CONF=$CONF"
}

stop_daemon() {
    local name=$1 file=$2 pid
    if pid=$(live_pid "$file"); then
        kill "$pid"
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        say "stopped $name (pid $pid)"
    fi
    rm -f "$file"
}

case ${1:-} in
start)
    install_packages
    [[ $(id -u) -eq 0 ]] || die "starting the daemons needs root"
    write_config
    start_munged
    start_daemons
    wait_idle
    ;;
stop)
    stop_daemon slurmd "$DIR/run/slurmd.pid"
    stop_daemon slurmctld "$DIR/run/slurmctld.pid"
    stop_daemon munged "$DIR/run/munged.pid"
    ;;
status)
    for d in munged slurmctld slurmd; do
        if pid=$(live_pid "$DIR/run/$d.pid"); then
            say "$d: running (pid $pid, started by slurm-local.sh)"
        elif [[ $d == munged ]] && pgrep -x munged >/dev/null; then
            say "munged: running (not started by slurm-local.sh)"
        else
            say "$d: not running"
        fi
    done
    if [[ -e $CONF ]]; then SLURM_CONF=$CONF sinfo -N 2>/dev/null || say "sinfo: no answer"; fi
    ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
