#!/usr/bin/env bash
# Bad input to the cluster launcher and job templates (cluster/launch.sh,
# cluster/*.sbatch): a variable with a bad value, a hostfile with fewer
# slots than ranks, an srun without PMIx, a job script without its model
# script: each one message naming what is wrong, exit 2, and nothing
# started (the fake launchers here record any call).
# Usage: bad_input.sh ZTRAIN
set -u
Z=$(realpath "$1")
C=$(cd "$(dirname "$0")/../../cluster" && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; cd "$W"
pass=0 fail=0
# fakes first on PATH: an srun whose plugins lack PMIx, an mpirun; both
# note that they ran
mkdir bin
cat > bin/srun <<'SH'
#!/bin/sh
[ "$1" = "--mpi=list" ] && { echo "MPI plugin types are..."; echo "	none"; echo "	pmi2"; exit 0; }
echo "srun $*" >> "$(dirname "$0")/../started"; exit 0
SH
cat > bin/mpirun <<'SH'
#!/bin/sh
echo "mpirun $*" >> "$(dirname "$0")/../started"; exit 0
SH
chmod +x bin/srun bin/mpirun
export PATH=$W/bin:$PATH ZTRAIN=$Z

expect() { # NAME WANT(regex) CMD...: exit 2, one line matching WANT, nothing started
  local name=$1 want=$2; shift 2
  rm -f started
  "$@" > out.txt 2> err.txt; local rc=$?
  if [ $rc = 2 ] && [ "$(grep -c . err.txt)" = 1 ] && grep -Eq "$want" err.txt && [ ! -e started ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1)); echo "FAIL [$name]: exit $rc, $(cat err.txt)$( [ -e started ] && echo ", started: $(cat started)")"
  fi
}
printf 'a slots=2\nb slots=1\n# c slots=9\n' > hosts
expect launcher "ZT_LAUNCHER=ssh: use auto, srun or mpirun" env ZT_LAUNCHER=ssh bash "$C/launch.sh" x.lua
expect np "ZT_NP=four: must be a positive integer" env ZT_NP=four bash "$C/launch.sh" x.lua
expect threads "ZT_THREADS=0: must be a positive integer" env ZT_THREADS=0 bash "$C/launch.sh" x.lua
expect cpus "SLURM_CPUS_PER_TASK=2x: must be a positive integer" env SLURM_CPUS_PER_TASK=2x bash "$C/launch.sh" x.lua
expect requeue "ZT_REQUEUE=yes: use 0 or 1" env ZT_REQUEUE=yes bash "$C/launch.sh" x.lua
expect slots "ZT_NP=4 ranks but .*hosts has 3 slots" env ZT_NP=4 ZT_HOSTFILE=hosts ZT_LAUNCHER=mpirun bash "$C/launch.sh" x.lua
expect hostfile "ZT_HOSTFILE=nope cannot be read" env ZT_HOSTFILE=nope ZT_LAUNCHER=mpirun bash "$C/launch.sh" x.lua
expect pmix "this srun has no PMIx plugin" env SLURM_JOB_ID=7 bash "$C/launch.sh" x.lua
expect nojob "ZT_LAUNCHER=srun outside a Slurm allocation" env -u SLURM_JOB_ID ZT_LAUNCHER=srun bash "$C/launch.sh" x.lua
expect binary "ZTRAIN=/nonexistent is not an executable" env ZTRAIN=/nonexistent bash "$C/launch.sh" x.lua
for t in ztrain ztrain-nodes; do
  expect "$t noscript" "give the script" env SLURM_JOB_ID=7 SLURM_SUBMIT_DIR=$W bash "$C/$t.sbatch"
  expect "$t missing" "the script nope.lua cannot be read" env SLURM_JOB_ID=7 SLURM_SUBMIT_DIR=$W bash "$C/$t.sbatch" nope.lua
done
[ ! -e runs ] || { fail=$((fail + 1)); echo "FAIL: a run directory was made for bad input"; }
# the good case reaches the launcher, with what it needs
rm -f started
ZT_NP=3 ZT_HOSTFILE=hosts ZT_LAUNCHER=mpirun bash "$C/launch.sh" x.lua > out.txt 2>&1 &&
  grep -q "mpirun --hostfile hosts -np 3 $Z x.lua" started && pass=$((pass + 1)) ||
  { fail=$((fail + 1)); echo "FAIL [good]: $(cat out.txt started 2>/dev/null)"; }
echo "cluster bad input: $pass passed, $fail failed"
[ $fail = 0 ]
