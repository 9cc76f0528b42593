#!/usr/bin/env bash
# launch.sh: starts ztrain on every rank of the job, the way this machine
# launches MPI programs, and passes Slurm's preemption signal on to it.
#
#   cluster/launch.sh [ZTRAIN ARGS...]          (from an sbatch script, or a shell)
#
# Inside a Slurm allocation (SLURM_JOB_ID set) it runs `srun --mpi=pmix`:
# Slurm starts the ranks itself and PMIx wires them up (Debian's Open MPI
# supports no other Slurm launch; srun also gives each rank SLURM_LOCALID,
# which ztrain binds GPUs by). Elsewhere it runs `mpirun` with
# ZT_NP ranks (default: the cores) over ZT_HOSTFILE when given.
#
# Environment (all optional):
#   ZTRAIN         the binary (default: ztrain on PATH, else build/ztrain)
#   ZT_LAUNCHER    auto | srun | mpirun (default auto, as above)
#   ZT_NP          mpirun only: ranks to start
#   ZT_HOSTFILE    mpirun only: Open MPI hostfile ("host slots=N" lines)
#   ZT_NET_IF      network interface (or a.b.c.d/n) between nodes, for Open MPI's
#                  TCP transport and NCCL's bootstrap (default: theirs)
#   ZT_THREADS     OpenMP threads per rank (default: SLURM_CPUS_PER_TASK, else
#                  ztrain's own choice)
#   ZT_REQUEUE     1: after a signal's checkpoint, requeue the Slurm job
#                  (scontrol requeue), to go on with --resume auto
# SIGUSR1 or SIGTERM to this script reaches every rank as SIGUSR1: ztrain
# writes a checkpoint at the end of the step and exits 0; this script then
# says "launch: stopped by signal" on stderr and, with ZT_REQUEUE=1 under
# Slurm, requeues the job. The sbatch templates exec this script, so that
# Slurm's --signal=B:USR1@SECONDS lands here.
# Exit status: ztrain's; 2 for a bad variable here (the message says which).
set -u
here=$(cd "$(dirname "$0")" && pwd)

die() { echo "launch: error: $*" >&2; exit 2; }

: "${ZT_LAUNCHER:=auto}"
case "$ZT_LAUNCHER" in auto|srun|mpirun) ;;
  *) die "ZT_LAUNCHER=$ZT_LAUNCHER: use auto, srun or mpirun" ;; esac
if [ -z "${ZTRAIN:-}" ]; then
  ZTRAIN=$(command -v ztrain || echo "$here/../build/ztrain")
fi
[ -x "$ZTRAIN" ] || die "ZTRAIN=$ZTRAIN is not an executable (build ztrain or set ZTRAIN)"
int_var() { # NAME VALUE: a positive integer or unset
  [ -z "$2" ] || [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1=$2: must be a positive integer"
}
int_var ZT_NP "${ZT_NP:-}"
int_var ZT_THREADS "${ZT_THREADS:-}"
int_var SLURM_CPUS_PER_TASK "${SLURM_CPUS_PER_TASK:-}"
case "${ZT_REQUEUE:-0}" in 0|1) ;; *) die "ZT_REQUEUE=$ZT_REQUEUE: use 0 or 1" ;; esac

launcher=$ZT_LAUNCHER
if [ "$launcher" = auto ]; then
  if [ -n "${SLURM_JOB_ID:-}" ] && command -v srun > /dev/null; then launcher=srun; else launcher=mpirun; fi
fi

threads=${ZT_THREADS:-${SLURM_CPUS_PER_TASK:-}}
[ -n "$threads" ] && export OMP_NUM_THREADS=$threads
if [ -n "${ZT_NET_IF:-}" ]; then
  export OMPI_MCA_btl_tcp_if_include=$ZT_NET_IF OMPI_MCA_oob_tcp_if_include=$ZT_NET_IF
  # NCCL takes an interface name, not a subnet
  [[ "$ZT_NET_IF" == */* ]] || export NCCL_SOCKET_IFNAME=$ZT_NET_IF
fi
# NCCL: say why a collective failed instead of hanging in it
export NCCL_DEBUG=${NCCL_DEBUG:-WARN} TORCH_NCCL_ASYNC_ERROR_HANDLING=1 NCCL_ASYNC_ERROR_HANDLING=1

case $launcher in
  srun)
    [ -n "${SLURM_JOB_ID:-}" ] || die "ZT_LAUNCHER=srun outside a Slurm allocation (no SLURM_JOB_ID): use sbatch/salloc, or ZT_LAUNCHER=mpirun"
    command -v srun > /dev/null || die "ZT_LAUNCHER=srun but srun is not installed"
    srun --mpi=list 2>&1 | grep -qw pmix ||
      die "this srun has no PMIx plugin (srun --mpi=list: $(srun --mpi=list 2>&1 | tr '\n' ' ')); Open MPI needs it under Slurm: install Slurm's PMIx plugin, or set ZT_LAUNCHER=mpirun"
    # ranks on more cores than the node has: yield, do not spin (Open MPI
    # does it by itself under mpirun, not under srun)
    if [ -n "${SLURM_CPUS_ON_NODE:-}" ] && [ -n "${SLURM_NTASKS_PER_NODE:-}" ] &&
       [ "${SLURM_NTASKS_PER_NODE%%(*}" -gt "$SLURM_CPUS_ON_NODE" ] 2>/dev/null; then
      export OMPI_MCA_mpi_yield_when_idle=1
    fi
    cmd=(srun --mpi=pmix --kill-on-bad-exit=1 "$ZTRAIN" "$@") ;;
  mpirun)
    command -v mpirun > /dev/null || die "mpirun is not installed (Open MPI's openmpi-bin)"
    args=()
    if [ -n "${ZT_HOSTFILE:-}" ]; then
      [ -r "$ZT_HOSTFILE" ] || die "ZT_HOSTFILE=$ZT_HOSTFILE cannot be read"
      slots=$(awk '!/^[[:space:]]*(#|$)/ { n = 1; for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) { sub("slots=", "", $i); n = $i } s += n } END { print s + 0 }' "$ZT_HOSTFILE")
      [ -z "${ZT_NP:-}" ] || [ "$ZT_NP" -le "$slots" ] ||
        die "ZT_NP=$ZT_NP ranks but $ZT_HOSTFILE has $slots slots: add hosts or slots, or start at most $slots ranks"
      args+=(--hostfile "$ZT_HOSTFILE")
    fi
    [ -n "${ZT_NP:-}" ] && args+=(-np "$ZT_NP")
    cmd=(mpirun "${args[@]}" "$ZTRAIN" "$@") ;;
esac

stopped=0
forward() { stopped=1; [ -n "${pid:-}" ] && kill -USR1 "$pid" 2>/dev/null; }
trap forward USR1 TERM
echo "launch: ${cmd[*]}" >&2
"${cmd[@]}" &
pid=$!
# a trapped signal interrupts wait: wait again until the launcher is gone
while :; do
  wait "$pid"; rc=$?
  kill -0 "$pid" 2>/dev/null || break
done
if [ $stopped = 1 ] && [ $rc = 0 ]; then
  echo "launch: stopped by signal: the checkpoint is written; --resume auto goes on from it" >&2
  if [ "${ZT_REQUEUE:-0}" = 1 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "launch: requeueing job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0} ends)" >&2
    scontrol requeue "$SLURM_JOB_ID" || { echo "launch: error: scontrol requeue $SLURM_JOB_ID failed" >&2; exit 1; }
  fi
fi
if [ $rc != 0 ]; then
  echo "launch: ztrain exited with $rc; to go on from its newest checkpoint, start it again with --resume auto${SLURM_JOB_ID:+ (cluster/*.sbatch: sbatch again with ZT_RUN_DIR=$PWD)}" >&2
fi
exit $rc
