# common: what the shell tests share. Source it: . "$(dirname "$0")/common.sh"

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
