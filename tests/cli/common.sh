# common: what the shell tests share. Source it: . "$(dirname "$0")/common.sh"

# zt_setup "$@" for a test called as TEST.sh ZTRAIN [MPIRUN...]: Z (the
# binary's absolute path), MPI (the launcher's words), HERE (tests/), then
# zt_scratch.
zt_setup() {
  Z=$(realpath "$1")
  shift
  MPI=("$@")
  HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  zt_scratch
}

# A scratch folder in $W, removed when the test exits; the test runs in it.
zt_scratch() {
  W=$(mktemp -d)
  trap 'rm -rf "$W"' EXIT
  cd "$W"
}

# zt_tokens FILE SEED COUNT [VOCAB]: COUNT random uint16 tokens below VOCAB
# (default 256), the same for the same SEED.
zt_tokens() {
  /usr/bin/python3 -c "
import numpy as np
np.random.seed($2); np.random.randint(0, ${4:-256}, $3).astype('<u2').tofile('$1')"
}

# Counters for a test of many checks: `ok` counts one that passed, `bad
# WHAT` one that failed (and says what); the test ends on its own verdict.
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
