# common.sh for tests/cluster: a work folder (the nodes share the file
# system, as a cluster's nodes share /home), the model and data the tests
# share, and the cluster. Sources cluster.sh and tests/cli/common.sh (ok,
# bad, zt_tokens).
#   zct_setup ZTRAIN NODES   Z, HERE, W (the work folder, removed at exit
#       with the cluster), tok.bin and run.lua in it, NODES nodes up, SB
#       the one-node job template and what it needs exported; returns
#       zc_up's status (77: skipped)
. "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
. "$(dirname "${BASH_SOURCE[0]}")/../cli/common.sh"
zct_setup() {
  Z=$(realpath "$1")
  HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  W=$(mktemp -d)
  ZC=$W/cluster
  trap 'zc_down; [ -n "${ZCT_KEEP:-}" ] || rm -rf "$W"' EXIT
  cd "$W"
  zt_tokens tok.bin 7 20000
  cat > run.lua <<LUA
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 4, heads = 4}
train = {micro_batch = 1, global_batch = 8, steps = 10, log_every = 0, clip = 0.3,
         lr = zt.lr.cosine{peak = 2e-3, warmup = 3}, weight_decay = 0.1}
data = {train = "$W/tok.bin", shuffle = true}
LUA
  # ranks share 2 cores: yield when idle (mpirun does it by itself, srun not)
  export OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
  unset OPENBLAS_CORETYPE
  SB=$HERE/../cluster/ztrain.sbatch
  export ZT_CLUSTER_DIR=$HERE/../cluster ZTRAIN=$Z
  zc_up "$2" 4
}
