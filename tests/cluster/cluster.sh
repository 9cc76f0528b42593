# cluster.sh: a small real cluster on this one machine, for the tests in
# tests/cluster/ (sourced, not run). Each "node" is a network namespace
# with its own UTS hostname (node1, node2, ...) and address on a private
# bridge, running its own slurmd; slurmctld runs beside the bridge as host
# "ctl". Jobs go in through sbatch/srun as on a production cluster, and
# ranks start with srun --mpi=pmix (direct launch: what Slurm sites use,
# and the only launch Debian's Open MPI supports under Slurm): Open MPI
# then sees separate hosts, so ranks of one node talk over shared memory
# and ranks of two over TCP on the bridge.
#
#   zc_up N [CPUS]    start N nodes of CPUS declared cpus (default 4)
#   zc_down           stop every daemon by its PID, remove namespaces, bridge
#   zc_node_pids K    every process that runs inside node K
#
# Needs root, iproute2, unshare and Debian's slurmctld/slurmd/slurm-client;
# zc_up returns 77 (ctest's "skipped") when the machine refuses namespaces
# or lacks Slurm, with the reason on stderr. The state lives in $ZC
# (default ./cluster); SLURM_CONF is exported for the clients.

ZC_NET=${ZC_NET:-10.213.7}     # /24 of the bridge; .1 the controller, .(10+K) node K
ZC_BR=${ZC_BR:-ztbr7}
ZC_PORT=${ZC_PORT:-17817}      # slurmctld; slurmd listens on +1
ZC_NODES=0

zc_skip() { echo "cluster: skipped: $*" >&2; return 77; }

zc_ns() { echo "zt7n$1"; }

zc_node_pids() { ip netns pids "$(zc_ns $1)" 2>/dev/null; }

zc_down() {
  local k p
  [ -n "${ZC:-}" ] || return 0
  for k in $(seq 1 "$ZC_NODES"); do
    for p in $(zc_node_pids $k); do kill -9 "$p" 2>/dev/null; done
    ip netns del "$(zc_ns $k)" 2>/dev/null
    # the kernel frees a namespace late (its last mount may outlive the
    # processes): take its link down by hand
    ip link del "zt7v$k" 2>/dev/null
  done
  [ -f "$ZC/slurmctld.pid" ] && kill "$(cat "$ZC/slurmctld.pid")" 2>/dev/null
  for _ in $(seq 50); do
    [ -f "$ZC/slurmctld.pid" ] && kill -0 "$(cat "$ZC/slurmctld.pid")" 2>/dev/null || break
    sleep 0.1
  done
  [ -f "$ZC/slurmctld.pid" ] && kill -9 "$(cat "$ZC/slurmctld.pid")" 2>/dev/null
  ip link del "$ZC_BR" 2>/dev/null
  ZC_NODES=0
  return 0
}

zc_write_conf() {
  local n=$1 cpus=$2 k
  cat > "$ZC/slurm.conf" <<EOF
ClusterName=ztest
SlurmctldHost=ctl($ZC_NET.1)
SlurmctldPort=$ZC_PORT
SlurmdPort=$((ZC_PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
# Slurm holds a requeued job for the credential lifetime (120 s by
# default) and looks at the queue every sched_interval (60 s): shortened
# here so that the requeue test takes seconds, not minutes
AuthInfo=cred_expire=10
SchedulerParameters=sched_interval=2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=pmix
JobRequeue=1
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$ZC/state
SlurmdSpoolDir=$ZC/spool/%n
SlurmctldPidFile=$ZC/slurmctld.pid
SlurmdPidFile=$ZC/slurmd.%n.pid
SlurmctldLogFile=$ZC/slurmctld.log
SlurmdLogFile=$ZC/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
EOF
  for k in $(seq 1 "$n"); do
    echo "NodeName=node$k NodeAddr=$ZC_NET.$((10 + k)) CPUs=$cpus State=UNKNOWN" >> "$ZC/slurm.conf"
  done
  echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$ZC/slurm.conf"
}

zc_up() {
  local n=$1 cpus=${2:-4} k
  [ "$(id -u)" = 0 ] || { zc_skip "needs root for network namespaces"; return 77; }
  for c in slurmctld slurmd sbatch srun ip nsenter unshare; do
    command -v $c > /dev/null || { zc_skip "$c is not installed (cluster/install-deps.sh --cluster)"; return 77; }
  done
  ZC=${ZC:-$PWD/cluster}
  mkdir -p "$ZC"
  mkdir -p "$ZC/state"
  for k in $(seq 1 "$n"); do mkdir -p "$ZC/spool/node$k"; done
  export SLURM_CONF=$ZC/slurm.conf
  zc_write_conf "$n" "$cpus"
  ip link del "$ZC_BR" 2>/dev/null
  if ! ip link add "$ZC_BR" type bridge 2>"$ZC/ip.err"; then
    zc_skip "this machine refuses a bridge: $(cat "$ZC/ip.err")"; return 77
  fi
  ip addr add "$ZC_NET.1/24" dev "$ZC_BR" && ip link set "$ZC_BR" up || return 1
  ZC_NODES=$n
  for k in $(seq 1 "$n"); do
    local ns; ns=$(zc_ns $k)
    ip netns del "$ns" 2>/dev/null
    ip link del "zt7v$k" 2>/dev/null
    ip netns add "$ns" || { zc_skip "this machine refuses network namespaces"; return 77; }
    ip link add "zt7v$k" type veth peer name eth0 netns "$ns" &&
      ip link set "zt7v$k" master "$ZC_BR" up &&
      ip netns exec "$ns" ip addr add "$ZC_NET.$((10 + k))/24" dev eth0 &&
      ip netns exec "$ns" ip link set eth0 up &&
      ip netns exec "$ns" ip link set lo up || return 1
  done
  # the controller: the host's network (the bridge), its own hostname
  unshare --uts sh -c "hostname ctl && exec slurmctld -i" > "$ZC/slurmctld.out" 2>&1 ||
    { echo "cluster: slurmctld did not start:" >&2; tail -5 "$ZC/slurmctld.log" "$ZC/slurmctld.out" >&2; return 1; }
  for k in $(seq 1 "$n"); do
    # nsenter, not ip netns exec: that remounts /sys, hiding the cgroup tree
    # slurmd reads. A node has its own /dev/shm, and its own config
    # directory whose mpi.conf gives PMIx a temporary directory of its own:
    # Slurm's PMIx plugin names its files per job, not per node, under
    # /tmp, which the nodes share (as they share everything else: the
    # build, the test's folder)
    mkdir -p "$ZC/tmp/node$k" "$ZC/conf/node$k"
    cp "$ZC/slurm.conf" "$ZC/conf/node$k/slurm.conf"
    echo "PMIxCliTmpDirBase=$ZC/tmp/node$k" > "$ZC/conf/node$k/mpi.conf"
    SLURM_CONF=$ZC/conf/node$k/slurm.conf TMPDIR=$ZC/tmp/node$k \
    nsenter --net=/var/run/netns/$(zc_ns $k) unshare --uts --mount --propagation private sh -c \
      "mount -t tmpfs -o size=2g tmpfs /dev/shm && hostname node$k && exec slurmd" \
      > "$ZC/slurmd.$k.out" 2>&1 ||
      { echo "cluster: slurmd of node$k did not start:" >&2; tail -5 "$ZC/slurmd.node$k.log" >&2; return 1; }
  done
  # the daemons fork into the background and write their PID files
  for _ in $(seq 100); do
    local up=1
    [ -s "$ZC/slurmctld.pid" ] || up=0
    for k in $(seq 1 "$n"); do [ -s "$ZC/slurmd.node$k.pid" ] || up=0; done
    [ $up = 1 ] && break
    sleep 0.1
  done
  # every node idle
  for _ in $(seq 150); do
    [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle')" = "$n" ] && return 0
    sleep 0.2
  done
  echo "cluster: the nodes did not come up:" >&2
  sinfo -N >&2
  tail -5 "$ZC/slurmctld.log" >&2
  return 1
}
