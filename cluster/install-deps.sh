#!/usr/bin/env bash
# Installs the Debian packages ztrain needs that are missing (build, run and,
# unless --no-test, the test suite's references: PyTorch/h5py, python3-venv
# for tests/ref/venv.sh's transformers, chromium and python3-pil for the test
# of `ztrain report`, which renders its page and reads the screenshot;
# Slurm's daemons and client and iproute2 for the test cluster of
# tests/cluster/, which runs them from a private config: nothing is
# enabled or started here).
# Idempotent: installs nothing when everything is there. Needs root or sudo.
set -eu
build=(build-essential cmake ninja-build pkg-config
       openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools
       liblua5.4-dev libopenblas-openmp-dev libdnnl-dev libjansson-dev libxxhash-dev
       libpcre2-dev libsentencepiece-dev libutf8proc-dev
       liburing-dev)
test=(libcmocka-dev python3 python3-numpy python3-h5py python3-torch python3-venv procps
      chromium python3-pil python3-sentencepiece
      slurmctld slurmd slurm-client iproute2 util-linux)
want=("${build[@]}")
[ "${1:-}" = "--no-test" ] || want+=("${test[@]}")

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "install-deps: all ${#want[@]} packages present"; exit 0; }

echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}"
