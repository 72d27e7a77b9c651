#!/usr/bin/env bash
# Start a real one-node Slurm (Debian's 22.05 packages) on this machine, for the Slurm tests (tests/test_slurm.py).
#
#   sudo bash .ci/slurm-up.sh        installs slurmctld, slurmd and slurm-client when missing, writes
#                                    /etc/slurm/slurm.conf (one node: this host on 127.0.0.1, all its CPUs and
#                                    memory, partition `debug`), starts both daemons as root and waits for the node
#
# Runs as root (CI does). Idempotent: a Slurm that already answers `sinfo` is left alone. No accounting database
# and no munge (auth/none, cred/none), no cgroups (proctrack/pgid, task/none): enough to submit with sbatch, run
# job steps with srun and follow them with squeue, which is what snakemake-executor-plugin-slurm needs. GPUs cannot
# be faked here; the tests check GPU requests in the submitted sbatch lines instead.
# The config stays at the default /etc/slurm/slurm.conf: the jobstep plugin drops SLURM_CONF (plugin issue #164).
set -euo pipefail

if sinfo --noheader --responding >/dev/null 2>&1 && [ -n "$(sinfo --noheader --responding 2>/dev/null)" ]; then
    echo "slurm-up: a Slurm controller already answers; nothing to do"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "slurm-up: run as root (it installs packages and starts slurmctld and slurmd)" >&2
    exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client >/dev/null
fi

host=$(hostname -s)
node=$(slurmd -C | head -n 1)                 # NodeName=<host> CPUs=... RealMemory=...
cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node")
memory=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node")

mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
cat >/etc/slurm/slurm.conf <<EOF
# Written by speedrun's .ci/slurm-up.sh: a one-node test cluster.
ClusterName=speedrun-ci
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MinJobAge=300
ReturnToService=2
SchedulerType=sched/backfill
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${memory} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

slurmctld
slurmd
for _ in $(seq 60); do
    state=$(sinfo --noheader --nodes "$host" --format %t 2>/dev/null || true)
    case "$state" in
        idle*|mix*|alloc*) echo "slurm-up: node ${host} is ${state} (${cpus} CPUs, ${memory} MB)"; exit 0 ;;
        down*|drain*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
echo "slurm-up: the node did not come up; see /var/log/slurm/slurmctld.log and slurmd.log" >&2
sinfo >&2 || true
exit 1
