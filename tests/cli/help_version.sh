#!/usr/bin/env bash
# The Unix-tool conventions: --help and --version print to stdout and exit 0,
# an unknown option or a missing script exits 2 with a pointer to --help.
set -u
Z=$(realpath "$1")
fail=0
check() { # NAME EXPECTED_RC PATTERN STREAM -- args
  local name=$1 want=$2 pat=$3 stream=$4
  shift 5
  "$Z" "$@" > out.txt 2> err.txt
  local rc=$?
  local file=out.txt
  [ "$stream" = err ] && file=err.txt
  if [ "$rc" != "$want" ] || ! grep -q -- "$pat" "$file"; then
    echo "FAIL $name: rc $rc (want $want), $stream: $(head -c 300 "$file")"
    fail=$((fail + 1))
  fi
}
cd "$(mktemp -d)"
check help 0 "Usage: ztrain" out -- --help
check help-short 0 "Usage: ztrain" out -- -h
check version 0 "^ztrain [0-9]" out -- --version
check unknown-option 2 "see ztrain --help" err -- --bogus x.lua
check no-script 2 "no script given" err --
check two-scripts 2 "one script expected" err -- a.lua b.lua
check missing-script 2 "cannot open nope.lua" err -- nope.lua
check tokenize-missing 2 "cannot read nope.txt" err -- tokenize nope.txt out.bin
[ ! -e out.bin ] || { echo "FAIL tokenize wrote out.bin"; fail=$((fail + 1)); }
echo "$((8 - fail)) passed, $fail failed"
[ "$fail" = 0 ]
