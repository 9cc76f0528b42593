#!/usr/bin/env bash
# zreshard on checkpoints that ztrain writes (a tiny gpt with a tied head
# and a tiny llama with GQA, untied): info and verify, checksums recomputed
# independently in Python, a flipped data byte, truncated, non-HDF5 and
# hostile files, export to safetensors (F32 and BF16, read back by
# tests/ref/read_safetensors.py against h5py, and every exported header
# against the tensor names and shapes the plan's model has, derived here
# from docs/checkpoint-format.md's table), convert to other layouts (same
# values, chunks that tile the target's TP shards, loadable by ztrain),
# layouts the model cannot take, version 1 files (refused by export and
# convert without --force), files whose checksums match but whose data
# hold NaN and infinity, and hostile records (plan, topology, state,
# names) refused by all four commands with the same message.
# Usage: zreshard.sh ZTRAIN ZRESHARD
set -u
Z=$(realpath "$1")
R=$(realpath "$2")
REF=$(cd "$(dirname "$0")/../ref" && pwd)
PY=/usr/bin/python3
. "$(dirname "$0")/common.sh"
zt_scratch

# run NAME WANT_RC PATTERN -- zreshard args: the exit code and a pattern in
# stdout+stderr (fixed string; "" matches anything).
run() {
  local name=$1 want=$2 pat=$3
  shift 4
  "$R" "$@" > out.txt 2>&1
  local rc=$?
  if [ "$rc" != "$want" ] || ! grep -qF -- "$pat" out.txt; then
    bad "$name: rc $rc (want $want), output: $(head -c 600 out.txt)"
  else
    ok
  fi
}

# Independent checks in Python: checksums summed here over per-element
# XXH3 calls (libxxhash through ctypes; the index and sum logic is this
# file's own), and a comparison of two files' tensors with chunk shapes.
cat > check.py <<'PY'
import ctypes, ctypes.util, json, sys
import h5py, numpy as np

lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
xxh3 = lib.XXH3_64bits_withSeed
xxh3.restype = ctypes.c_uint64
xxh3.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64]
# known answer: XXH3 of no bytes, seed 0
assert xxh3(None, 0, 0) == 0x2D06800538D394C2, "libxxhash is not XXH3"

def checksum(a):
    buf = np.ascontiguousarray(a, dtype="<f4").reshape(-1).tobytes()
    cbuf = ctypes.create_string_buffer(buf, len(buf))
    base = ctypes.addressof(cbuf)
    return sum(xxh3(base + 4 * i, 4, i) for i in range(len(buf) // 4)) % 2**64

def tensors(f):
    out = {}
    for g in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
        if g in f:
            for k, d in f[g].items():
                out[f"{g}/{k}"] = d
    return out

def sums(path):
    """every tensor's stored checksum equals the one computed here"""
    with h5py.File(path) as f:
        ts = tensors(f)
        wrong = [k for k, d in ts.items()
                 if int(d.attrs["checksum"]) != checksum(d.astype("<f4")[...])]
        for k in wrong:
            print("checksum differs:", k)
        print(f"{len(ts) - len(wrong)} of {len(ts)} checksums recomputed in Python agree")
        return 1 if wrong or not ts else 0

def count(path):
    with h5py.File(path) as f:
        print(len(tensors(f)))
    return 0

def shard_chunk(name, shape, tp, kv_heads):
    """the target's TP shard of a tensor, by Megatron's rules (docs/parallelism.md)"""
    s = list(shape)
    base = name.split("/")[-1]
    if base in ("embed.tokens", "head.weight") or base.endswith(
            ("attn.q.weight", "mlp.up.weight", "mlp.up.bias", "mlp.gate.weight")):
        s[0] //= tp
    elif base.endswith(("attn.qkv.weight", "attn.qkv.bias")):
        s[0] //= 3 * tp if tp > 1 else 1
    elif base.endswith(("attn.k.weight", "attn.v.weight")):
        s[0] //= min(tp, kv_heads)
    elif base.endswith(("attn.out.weight", "mlp.down.weight")):
        s[1] //= tp
    return tuple(s)

def same(src, dst, tp, dtype="fp32", optim="yes", max_bytes="0"):
    """dst holds src's tensors (exactly; bf16: rounded to nearest even),
    each in chunks that tile the tp shards, and dst's record says so"""
    problems, tp = [], int(tp)
    with h5py.File(src) as a, h5py.File(dst) as b:
        plan = json.loads(a.attrs["plan"])
        kv = plan["model"]["kv_heads"]
        ta, tb = tensors(a), tensors(b)
        want = {k: v for k, v in ta.items() if optim == "yes" or k.startswith("model/")}
        if set(want) != set(tb):
            problems.append(f"tensor sets differ: {sorted(set(want) ^ set(tb))[:6]}")
        for k in sorted(set(want) & set(tb)):
            x, y = want[k][...], tb[k].astype("<f4")[...]
            if dtype == "bf16":
                u = x.astype("<f4").view("<u4").astype(np.uint64)
                lo, hi = u & 0xFFFF0000, (u & 0xFFFF0000) + 0x10000
                v = lambda t: t.astype(np.uint32).view("<f4").astype(np.float64)
                dl, dh = np.abs(x - v(lo)), np.abs(v(hi) - x)
                pick = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where((lo >> 16) & 1, hi, lo)))
                x = pick.astype(np.uint32).view("<f4")
            if not np.array_equal(x.view("<u4"), y.view("<u4")):
                problems.append(f"{k}: values differ")
            shard = shard_chunk(k, x.shape, tp, kv)
            c = tb[k].chunks
            if c is None:
                problems.append(f"{k}: not chunked")
            elif int(max_bytes) == 0 and c != shard:
                problems.append(f"{k}: chunks {c}, the tp {tp} shard is {shard}")
            elif any(s % ci for s, ci, full in zip(shard, c, x.shape) if s != full):
                problems.append(f"{k}: chunks {c} do not tile the tp {tp} shard {shard}")
            elif int(max_bytes) and np.prod(c) * (2 if dtype == "bf16" else 4) > int(max_bytes):
                problems.append(f"{k}: chunks {c} over {max_bytes} bytes")
        if "master" in b.get("optim", {}):
            m = b["optim/master"]
            if set(m) != set(b["model"]) or any(m[k].id != b["model"][k].id for k in m):
                problems.append("optim/master is not hard links to /model")
        elif optim == "yes" and "optim" in a:
            problems.append("no optim/master")
        topo = json.loads(b.attrs["topology"])
        if b.attrs["format_version"] != 2 or topo["tp"] != tp:
            problems.append(f"format_version {b.attrs['format_version']}, topology {topo}")
        if b.attrs["step"] != a.attrs["step"] or b.attrs["plan"] != a.attrs["plan"]:
            problems.append("step or plan not copied")
    for p in problems:
        print("FAIL:", p)
    print(f"{len(tb)} tensors compared with {src}")
    return 1 if problems else 0

def model_names(model):
    """name -> shape of every /model tensor, by docs/checkpoint-format.md"""
    V, T, C, L = model["vocab"], model["seq"], model["dim"], model["layers"]
    H, K, F = model["heads"], model["kv_heads"], model["ffn_dim"]
    hd, gpt = C // H, model["kind"] == "gpt"
    out = {"embed.tokens": (V, C)}
    if gpt:
        out["embed.positions"] = (T, C)
    for i in range(L):
        b = f"blocks.{i}."
        if gpt:
            out.update({b + "norm1.weight": (C,), b + "norm1.bias": (C,),
                        b + "attn.qkv.weight": (3 * C, C), b + "attn.qkv.bias": (3 * C,),
                        b + "attn.out.weight": (C, C), b + "attn.out.bias": (C,),
                        b + "norm2.weight": (C,), b + "norm2.bias": (C,),
                        b + "mlp.up.weight": (4 * C, C), b + "mlp.up.bias": (4 * C,),
                        b + "mlp.down.weight": (C, 4 * C), b + "mlp.down.bias": (C,)})
        else:
            out.update({b + "norm1.weight": (C,), b + "attn.q.weight": (H * hd, C),
                        b + "attn.k.weight": (K * hd, C), b + "attn.v.weight": (K * hd, C),
                        b + "attn.out.weight": (C, C), b + "norm2.weight": (C,),
                        b + "mlp.up.weight": (F, C), b + "mlp.gate.weight": (F, C),
                        b + "mlp.down.weight": (C, F)})
    out["final_norm.weight"] = (C,)
    if gpt:
        out["final_norm.bias"] = (C,)
    if not model["tied"]:
        out["head.weight"] = (V, C)
    return out

def names(st, ckpt):
    """the safetensors header names exactly the plan's model's tensors, with
    their shapes, in one tiling of the data, and string metadata only"""
    import struct
    blob = open(st, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__")
    with h5py.File(ckpt) as f:
        want = model_names(json.loads(f.attrs["plan"])["model"])
    got = {k: tuple(v["shape"]) for k, v in header.items()}
    problems = []
    if set(got) != set(want):
        problems.append(f"extra {sorted(set(got) - set(want))}, missing {sorted(set(want) - set(got))}")
    problems += [f"{k}: shape {got[k]}, the model has {want[k]}" for k in got
                 if k in want and got[k] != want[k]]
    if not all(isinstance(v, str) for v in meta.values()):
        problems.append("non-string metadata")
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    if spans and (spans[0][0] != 0 or any(a[1] != b[0] for a, b in zip(spans, spans[1:]))
                  or spans[-1][1] != len(blob) - 8 - n):
        problems.append("data offsets do not tile the data")
    for p in problems:
        print("FAIL:", p)
    print(f"{len(got)} names of {len(want)} model tensors in the header")
    return 1 if problems else 0

def nanify(src, dst, name, where="0"):
    """dst: src with NaN, +inf and -inf from element `where` of tensor
    `name`, and its checksum recomputed: a diverged run's file"""
    import shutil
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        d = f[name]
        x = d[...].astype("<f4")
        i = int(where)
        x.reshape(-1)[i:i + 3] = [np.nan, np.inf, -np.inf]
        d[...] = x
        d.attrs.modify("checksum", np.uint64(checksum(x)))
    return 0

def flip(path, name, index):
    """flips one bit of element `index` of a tensor in the file's bytes"""
    index = int(index)
    with h5py.File(path) as f:
        d = f[name]
        if d.chunks is None:
            off = d.id.get_offset()
        else:  # element index within the first chunk (index < chunk size)
            off = d.id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as fh:
        fh.seek(off + 4 * index + 2)
        b = fh.read(1)
        fh.seek(off + 4 * index + 2)
        fh.write(bytes([b[0] ^ 0x10]))
    return 0

def downgrade(src, dst):
    """a version 1 file as ztrain wrote it before version 2: format,
    format_version 1, step and plan; /model and /optim moments, no
    checksums, no master links, no record"""
    with h5py.File(src) as a, h5py.File(dst, "w") as b:
        for k in ("format", "step", "plan"):
            b.attrs.create(k, a.attrs[k])
        b.attrs.create("format_version", np.int64(1))
        for k, d in tensors(a).items():
            b.create_dataset(k, data=d[...], dtype="<f4")
    return 0

sys.exit(globals()[sys.argv[1]](*sys.argv[2:]))
PY
chk() { $PY check.py "$@"; }
# st_ok NAME FILE.st CKPT: the export holds the checkpoint's /model values
# and its header names exactly the plan's model's tensors
st_ok() {
  $PY "$REF/read_safetensors.py" "$2" "$3" > st.txt && chk names "$2" "$3" >> st.txt && ok ||
    bad "$1: $(cat st.txt)"
}

$PY -c "
import numpy as np
np.random.seed(7); np.random.randint(0, 256, 20000).astype('<u2').tofile('tok.bin')"
cat > gpt.lua <<'LUA'
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4}
train = {micro_batch = 2, global_batch = 4, steps = 3, log_every = 0}
data = {train = "tok.bin"}
LUA
cat > llama.lua <<'LUA'
local zt = require "ztrain"
model = zt.llama{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 64}
train = {micro_batch = 2, global_batch = 4, steps = 3, log_every = 0}
data = {train = "tok.bin"}
LUA

run help 0 "Usage: zreshard info" -- --help
run version 0 "zreshard " -- --version
run no-command 2 "no command given" --
run bad-command 2 "unknown command 'reshard'" -- reshard x.h5
run bad-option 2 "see zreshard --help" -- info --bogus x.h5
run bad-tp 2 "--tp needs an integer" -- convert x.h5 -o y.h5 --tp two
run bad-dtype 2 "--dtype takes fp32 or bf16" -- export x.h5 -o y.st --dtype f16
run bad-format 2 "--format takes safetensors or hf" -- export x.h5 -o y.st --format gguf
run no-output 2 "needs -o PATH" -- convert x.h5 --tp 2
run stray-option 2 "does not apply to zreshard verify" -- verify x.h5 --tp 2
run stray-force 2 "--force (verify only reports) does not apply to zreshard verify" -- verify x.h5 --force
run missing 2 "No such file" -- verify nope.h5
echo "this is not HDF5" > text.h5
run not-hdf5 2 "is not an HDF5 file" -- verify text.h5

for arch in gpt llama; do
  "$Z" $arch.lua --save $arch.h5 > /dev/null || { bad "ztrain $arch did not write a checkpoint"; continue; }
  n=$(chk count $arch.h5)
  src=$arch.h5
  # info and verify; checksums against Python's
  run $arch-info 0 "all $n checksums verify" -- info $src
  grep -q "model/embed.tokens  *\[256, 32\]  *f32 .* ok" out.txt || bad "$arch-info: no embed.tokens line"
  grep -q "written by: world 1 = dp 1 x tp 1 x pp 1, zero 0" out.txt || bad "$arch-info: topology"
  run $arch-info-no-verify 0 "checksums not verified" -- info $src --no-verify
  run $arch-verify 0 "all $n checksums verify" -- verify $src
  ZRESHARD_BLOCK_ELEMS=7 run $arch-verify-blocks 0 "all $n checksums verify" -- verify $src
  chk sums $src > sums.txt && ok || bad "$arch: $(cat sums.txt)"

  # one flipped bit in /model/embed.tokens' data
  cp $src flip.h5
  chk flip flip.h5 model/embed.tokens 77
  run $arch-flip-verify 1 "FAIL model/embed.tokens: MISMATCH (stored checksum" -- verify flip.h5
  grep -q "1 of $n tensors fail verification" out.txt || bad "$arch-flip-verify: summary"
  run $arch-flip-info 1 "MISMATCH" -- info flip.h5
  run $arch-flip-export 2 "model/embed.tokens fails its checksum" -- export flip.h5 -o flip.st
  run $arch-flip-convert 2 "model/embed.tokens fails its checksum" -- convert flip.h5 -o flip2.h5
  [ ! -e flip.st ] && [ ! -e flip2.h5 ] && ! ls ./*.tmp.* > /dev/null 2>&1 && ok ||
    bad "$arch: output or temp file left after a refused export/convert"

  # truncated
  head -c $(($(stat -c %s $src) / 2)) $src > trunc.h5
  run $arch-truncated 2 "truncated" -- verify trunc.h5
  run $arch-truncated-info 2 "cannot be opened" -- info trunc.h5

  # export
  run $arch-export 0 "wrote $arch.st" -- export $src --format safetensors -o $arch.st
  st_ok "$arch export f32" $arch.st $src
  ZRESHARD_BLOCK_ELEMS=5 run $arch-export-bf16 0 "as BF16" -- export $src -o $arch.bf16.st --dtype bf16
  st_ok "$arch export bf16" $arch.bf16.st $src

  # convert to tp 2 (and 4: llama's 2 kv heads then replicated)
  for tp in 2 4; do
    extra=()
    [ $tp = 4 ] && extra=(--dp 2 --zero 1)
    run $arch-convert-tp$tp 0 "tp $tp" -- convert $src -o $arch.tp$tp.h5 --tp $tp --dtype fp32 "${extra[@]}"
    chk same $src $arch.tp$tp.h5 $tp > same.txt && ok || bad "$arch convert tp $tp: $(cat same.txt)"
    run $arch-convert-tp$tp-verify 0 "all $n checksums verify" -- verify $arch.tp$tp.h5
    chk sums $arch.tp$tp.h5 > sums.txt && ok || bad "$arch tp $tp: $(cat sums.txt)"
  done
  run $arch-convert-record 0 "world 8 = dp 2 x tp 4 x pp 1, zero 1" -- info $arch.tp4.h5 --no-verify
  ZRESHARD_CHUNK_BYTES=256 run $arch-convert-small-chunks 0 "tp 2" -- convert $src -o small.h5 --tp 2
  chk same $src small.h5 2 fp32 yes 256 > same.txt && ok || bad "$arch small chunks: $(cat same.txt)"
  run $arch-convert-bf16 0 "as bf16" -- convert $src -o $arch.bf16.h5 --tp 2 --dtype bf16 --weights-only
  chk same $src $arch.bf16.h5 2 bf16 no > same.txt && ok || bad "$arch convert bf16: $(cat same.txt)"
  run $arch-convert-bf16-verify 0 "checksums verify" -- verify $arch.bf16.h5
  # a converted chunked file with a flipped bit inside a chunk
  cp $arch.tp2.h5 flip.h5
  chk flip flip.h5 optim/exp_avg/embed.tokens 3
  run $arch-flip-chunked 1 "FAIL optim/exp_avg/embed.tokens: MISMATCH" -- verify flip.h5

  # layouts the model cannot take
  run $arch-tp3 2 "tp = 3 does not divide heads = 4; tp values that work for this model: 1, 2, 4" \
    -- convert $src -o bad.h5 --tp 3
  run $arch-pp3 2 "pp = 3 exceeds the model's 2 layers" -- convert $src -o bad.h5 --pp 3
  [ ! -e bad.h5 ] && ok || bad "$arch: refused convert wrote bad.h5"

  # version 1 files store no checksums: info and verify say so (exit 1),
  # export and convert refuse them; with --force all three go on, warning
  chk downgrade $src $arch.v1.h5
  rm -f v1.st v1conv.h5
  run $arch-v1-info 1 "its tensors cannot be verified" -- info $arch.v1.h5
  grep -q "the plan's; version 1 records no topology" out.txt || bad "$arch-v1-info: topology"
  grep -q "no checksums: format version 1" out.txt || bad "$arch-v1-info: no summary"
  run $arch-v1-info-force 0 "warning: $arch.v1.h5 has no checksums (format version 1)" -- info $arch.v1.h5 --force
  run $arch-v1-info-no-verify 0 "checksums not verified (--no-verify)" -- info $arch.v1.h5 --no-verify
  run $arch-v1-verify 1 "has no checksums (format version 1)" -- verify $arch.v1.h5
  run $arch-v1-export 2 "stores no checksums: its" -- export $arch.v1.h5 -o v1.st
  run $arch-v1-convert 2 "nothing written (--force writes them unverified)" -- convert $arch.v1.h5 -o v1conv.h5 --tp 2
  [ ! -e v1.st ] && [ ! -e v1conv.h5 ] && ok || bad "$arch v1: a refused export/convert wrote its output"
  run $arch-v1-export-force 0 "written unverified (--force)" -- export $arch.v1.h5 -o v1.st --force
  st_ok "$arch v1 export" v1.st $arch.v1.h5
  run $arch-v1-convert-force 0 "written unverified (--force)" -- convert $arch.v1.h5 -o v1conv.h5 --tp 2 -f
  grep -q "format version 2" out.txt || bad "$arch v1 convert: $(cat out.txt)"
  chk same $arch.v1.h5 v1conv.h5 2 > same.txt && ok || bad "$arch v1 convert: $(cat same.txt)"
  run $arch-v1-convert-verify 0 "all $n checksums verify" -- verify v1conv.h5
  # --no-verify, the old spelling, is --force for export and convert
  run $arch-v1-export-no-verify 0 "written unverified (--force)" -- export $arch.v1.h5 -o v1b.st --no-verify

  # checksums that match, data that do not: NaN and infinities as a
  # diverged run writes them, in a weight and in a moment
  w=blocks.1.attn.out.weight
  chk nanify $src nan.h5 model/$w 5
  rm -f nan.st nan2.h5
  chk sums nan.h5 > sums.txt && ok || bad "$arch nan: checksums not recomputed: $(cat sums.txt)"
  run $arch-nan-verify 1 "FAIL model/$w: NON-FINITE (3 values are NaN or infinite)" -- verify nan.h5
  grep -q "^1 of $n tensors fail verification" out.txt || bad "$arch-nan-verify: summary: $(cat out.txt)"
  run $arch-nan-info 1 "1 of $n tensors fail verification: model/$w" -- info nan.h5
  grep -q "model/$w .*NON-FINITE (3 values are NaN or infinite)" out.txt || bad "$arch-nan-info: line"
  run $arch-nan-export 2 "tensor model/$w holds 3 non-finite values (NaN or infinity); nothing written" \
    -- export nan.h5 -o nan.st
  run $arch-nan-convert 2 "tensor model/$w holds 3 non-finite values" -- convert nan.h5 -o nan2.h5
  [ ! -e nan.st ] && [ ! -e nan2.h5 ] && ! ls ./*.tmp.* > /dev/null 2>&1 && ok ||
    bad "$arch nan: output or temp file left after a refused export/convert"
  run $arch-nan-info-force 0 "fail verification: model/$w (--force)" -- info nan.h5 --force
  run $arch-nan-export-force 0 "warning: tensor model/$w holds 3 non-finite values" -- export nan.h5 -o nan.st --force
  st_ok "$arch nan export --force" nan.st nan.h5
  run $arch-nan-convert-force 0 "written as it is (--force)" -- convert nan.h5 -o nan2.h5 --force --tp 2
  chk same nan.h5 nan2.h5 2 > same.txt && ok || bad "$arch nan convert --force: $(cat same.txt)"
  chk nanify $src nan.h5 optim/exp_avg_sq/embed.tokens 0
  run $arch-nan-moment-verify 1 "FAIL optim/exp_avg_sq/embed.tokens: NON-FINITE (3 values" -- verify nan.h5
  run $arch-nan-moment-convert 2 "tensor optim/exp_avg_sq/embed.tokens holds 3 non-finite" -- convert nan.h5 -o nan2.h5
  # export reads /model only: what it writes verifies
  run $arch-nan-moment-export 0 "wrote nan.st" -- export nan.h5 -o nan.st
  run $arch-nan-moment-weights-only 0 "weights only" -- convert nan.h5 -o nan3.h5 --weights-only
done

# a version 1 file whose plan records no layout: info says so, convert
# needs the whole target
$PY - <<'PY'
import json, h5py
with h5py.File("gpt.v1.h5", "r") as a, h5py.File("v1np.h5", "w") as b:
    plan = json.loads(a.attrs["plan"])
    del plan["parallel"]
    for k in ("format", "format_version", "step"):
        b.attrs[k] = a.attrs[k]
    b.attrs["plan"] = json.dumps(plan)
    a.copy("model", b)
PY
run v1-no-layout-info 0 "written by: unknown (version 1 records no topology" -- info v1np.h5 --force
run v1-no-layout-convert 2 "v1np.h5 records no topology; give all of --tp, --pp, --dp and --zero" \
  -- convert v1np.h5 -o v1np2.h5 --tp 2 --force
run v1-no-layout-convert-all 0 "topology world 4 = dp 2 x tp 2 x pp 1, zero 1" \
  -- convert v1np.h5 -o v1np2.h5 --tp 2 --pp 1 --dp 2 --zero 1 --force
run v1-no-layout-convert-verify 0 "all 28 checksums verify" -- verify v1np2.h5

# ztrain loads a converted file at the target layout and at another one
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
if [ -e llama.tp2.h5 ]; then
  "$Z" llama.lua --load llama.tp2.h5 --steps 4 > load.txt 2>&1 && ok || bad "ztrain --load of a converted file: $(tail -3 load.txt)"
  "$Z" llama.lua --load llama.bf16.h5 --steps 4 > load.txt 2>&1
  [ $? = 2 ] && ok || bad "ztrain --load of a bf16 file should be refused: $(tail -3 load.txt)"
fi

# hostile files: each is refused, never a crash. want: the exit codes of
# info, verify, export and convert; a file all four refuse (2222) must be
# refused with the same message by each (they share one check of the
# structure and the record), and nothing may be written.
cat > hostile.py <<'PY'
import json, shutil, h5py, numpy as np
cases = []
base = "gpt.h5"
def case(name, fn, want, pat):
    want = {2: "2222", 1: "1122"}.get(want, want)
    path = f"h_{name}.h5"
    shutil.copy(base, path)
    with h5py.File(path, "r+") as f:
        fn(f)
    cases.append(f"{path}\t{want}\t{pat}")
case("5dims", lambda f: f.create_dataset("model/x", data=np.zeros((1, 1, 1, 1, 2), "f4")), 2, "has 5 dimensions")
case("scalar", lambda f: f.create_dataset("model/x", data=np.float32(1)), 2, "has 0 dimensions")
case("longname", lambda f: f.create_dataset("model/" + "a" * 100, data=np.zeros(2, "f4")), 2, "not a tensor name")
case("space", lambda f: f.create_dataset("model/a b", data=np.zeros(2, "f4")), 2, "not a tensor name")
case("utf8", lambda f: f.create_dataset("model/\u00e9\x1b[31m", data=np.zeros(2, "f4")), 2, "not a tensor name")
def soft(f): f["model/s"] = h5py.SoftLink("/model/embed.tokens")
case("softlink", soft, 2, "soft or external link")
def ext(f): f["model/e"] = h5py.ExternalLink("/etc/passwd", "/x")
case("extlink", ext, 2, "soft or external link")
def extgroup(f):
    del f["optim"]
    f["optim"] = h5py.ExternalLink("other.h5", "/optim")
case("extgroup", extgroup, 2, "/optim is a soft or external link")
case("external", lambda f: f.create_dataset("model/x", (4,), "f4", external=[("/etc/hostname", 0, 16)]), 2, "external files")
def virtual(f):
    lay = h5py.VirtualLayout(shape=(4,), dtype="f4")
    lay[:] = h5py.VirtualSource("other.h5", "x", shape=(4,))
    f.create_virtual_dataset("model/v", lay)
case("virtual", virtual, 2, "virtual dataset")
case("unwritten", lambda f: f.create_dataset("model/x", (100000, 1000), "f4"), 2, "bytes stored")
case("zero-dim", lambda f: f.create_dataset("model/x", (0, 4), "f4"), 2, "out of range")
case("int", lambda f: f.create_dataset("model/x", data=np.arange(4)), 2, "neither float32 nor bf16")
case("f64", lambda f: f.create_dataset("model/x", data=np.zeros(4)), 2, "neither float32 nor bf16")
case("f16", lambda f: f.create_dataset("model/x", data=np.zeros(4, "f2")), 2, "neither float32 nor bf16")
case("gzip", lambda f: f.create_dataset("model/x", data=np.zeros(64, "f4"), compression="gzip"), 2, "filters")
def fmt_int(f):
    del f.attrs["format"]
    f.attrs["format"] = np.arange(3)
case("format-int", fmt_int, 2, "attribute format is not a string")
def fmt_other(f): f.attrs["format"] = "something-else"
case("format-other", fmt_other, 2, "not a ztrain checkpoint")
def version3(f): f.attrs["format_version"] = np.int64(3)
case("version3", version3, 2, "format version 3")
def step_array(f):
    del f.attrs["step"]
    f.attrs["step"] = np.arange(1000)
case("step-array", step_array, 2, "attribute step is not a scalar integer")
def neg_step(f): f.attrs["step"] = np.int64(-5)
case("neg-step", neg_step, 2, "negative step")
def sum_str(f):
    del f["model/embed.tokens"].attrs["checksum"]
    f["model/embed.tokens"].attrs["checksum"] = "0"
case("checksum-string", sum_str, 2, "checksum is not a scalar unsigned 64-bit integer")
def sum_signed(f):
    del f["model/embed.tokens"].attrs["checksum"]
    f["model/embed.tokens"].attrs["checksum"] = np.int64(-1)
case("checksum-signed", sum_signed, 2, "checksum is not a scalar unsigned 64-bit integer")
def no_sum(f): del f["model/final_norm.bias"].attrs["checksum"]
case("no-checksum", no_sum, 1, "model/final_norm.bias")
def model_dataset(f):
    del f["model"]
    f["model"] = np.zeros(3, "f4")
case("model-dataset", model_dataset, 2, "/model is not a group")
def no_model(f): del f["model"]
case("no-model", no_model, 2, "no /model group")
def no_moment(f): del f["optim/exp_avg_sq"]
case("no-moment", no_moment, 2, "incomplete optimizer state")
def plan(f):
    p = f.attrs["plan"]
    return p.decode() if isinstance(p, bytes) else p
def plan_junk(f): f.attrs["plan"] = "{\x1b[2J not json"
case("plan-junk", plan_junk, 2, "the plan attribute is not a JSON object")
def plan_layers(f): f.attrs["plan"] = plan(f).replace('"layers":2', '"layers":1000000000')
case("plan-layers", plan_layers, 2, "layers is missing or not an integer in 1..100000")
def plan_dim(f): f.attrs["plan"] = plan(f).replace('"dim":32', '"dim":64')
case("plan-dim", plan_dim, 2, "has shape [256, 32], the model expects [256, 64]")
def plan_heads(f): f.attrs["plan"] = plan(f).replace('"heads":4', '"heads":3')
case("plan-heads", plan_heads, 2, "the plan's model: zt.gpt: dim 32 is not divisible by heads 3")
def plan_edit(**kw):
    def fn(f):
        p = json.loads(plan(f))
        for k, v in kw.items():
            if v is None:
                p["model"].pop(k)
            else:
                p["model"][k] = v
        f.attrs["plan"] = json.dumps(p)
    return fn
case("plan-float", plan_edit(dim=32.5), 2, "dim is missing or not an integer")
case("plan-string", plan_edit(vocab="256"), 2, "vocab is missing or not an integer")
case("plan-negative", plan_edit(heads=-4), 2, "heads is missing or not an integer in 1..65536")
case("plan-huge", lambda f: f.attrs.modify("plan", plan(f).replace('"seq":16', '"seq":' + "9" * 40)), 2,
     "the plan attribute is not a JSON object")
case("plan-no-layers", plan_edit(layers=None), 2, "layers is missing")
case("plan-kind", plan_edit(kind="bert"), 2, "model kind is neither")
case("plan-tied", plan_edit(tied="yes"), 2, "tied (boolean) missing or malformed")
def plan_no_model(f): f.attrs["plan"] = '{"train": {}}'
case("plan-no-model", plan_no_model, 2, "the plan has no model section")
case("plan-deep", lambda f: f.attrs.modify("plan", "[" * 100000 + "]" * 100000), 2,
     "the plan attribute is not a JSON object")
def no_plan(f): del f.attrs["plan"]
case("plan-missing", no_plan, 2, "has no plan attribute")
# the report of issue 9: a tensor named ".." beside the model's
def dotdot(f): f.create_dataset("model/..", data=np.zeros(3, "f4"))
case("dotdot", dotdot, 2, "/model/.. is not a tensor of the plan's model")
def extra(f): f.create_dataset("optim/exp_avg/extra.weight", data=np.zeros(2, "f4"))
case("extra", extra, 2, "optim/exp_avg/extra.weight is not a tensor of the plan's model")
def master_extra(f): f.create_dataset("optim/master/x.weight", data=np.zeros(2, "f4"))
case("master-extra", master_extra, 2, "/optim/master/x.weight is not a tensor of the plan's model")
def master_missing(f): del f["optim/master/final_norm.bias"]
case("master-missing", master_missing, 2, "tensor /optim/master/final_norm.bias is missing")
def moment_missing(f): del f["optim/exp_avg/blocks.0.mlp.up.bias"]
case("moment-missing", moment_missing, 2, "tensor /optim/exp_avg/blocks.0.mlp.up.bias is missing")
def topo(text):
    def fn(f): f.attrs["topology"] = text
    return fn
case("topology-junk", topo('{"world": "x"}'), 2, "the topology attribute: dp is missing or not an integer")
case("topology-array", topo('[1, 2]'), 2, "the topology attribute is not a JSON object")
case("topology-world", topo('{"world": 3, "dp": 1, "tp": 1, "pp": 1, "zero": 0}'), 2,
     "the topology attribute: world 3 is not dp 1 x tp 1 x pp 1")
case("topology-tp", topo('{"world": 3, "dp": 1, "tp": 3, "pp": 1, "zero": 0}'), 2,
     "the topology attribute records a layout the model cannot take: zt.gpt: tp = 3 does not divide heads = 4")
case("topology-pp", topo('{"world": 3, "dp": 1, "tp": 1, "pp": 3, "zero": 0}'), 2,
     "records pp 3, more stages than the model's 2 layers")
case("topology-zero", topo('{"world": 1, "dp": 1, "tp": 1, "pp": 1, "zero": 7}'), 2,
     "zero is missing or not an integer in 0..3")
case("topology-negative", topo('{"world": 1, "dp": -1, "tp": 1, "pp": 1, "zero": 0}'), 2,
     "dp is missing or not an integer in 1..16777216")
case("topology-huge", topo('{"world": 1, "dp": 1e300, "tp": 1, "pp": 1, "zero": 0}'), 2,
     "dp is missing or not an integer")
case("topology-sp", topo('{"world": 1, "dp": 1, "tp": 1, "pp": 1, "zero": 0, "sequence_parallel": "yes"}'),
     2, "sequence_parallel is not a boolean")
case("topology-deep", topo('{"a":' * 5000 + '1' + '}' * 5000), 2, "the topology attribute is not a JSON object")
def no_topo(f): del f.attrs["topology"]
case("topology-missing", no_topo, 2, "has no topology attribute (format version 2 records one)")
def state_junk(f): f.attrs["state"] = "not json"
case("state-junk", state_junk, 2, "the state attribute is not a JSON object")
def script_huge(f):
    del f["script"]
    f.create_dataset("script", (1,), "f4")
case("script-type", script_huge, 2, "/script is not a byte array")
open("hostile.txt", "w").write("\n".join(cases) + "\n")
PY
if $PY hostile.py; then
  while IFS=$'\t' read -r file want pat; do
    k=0
    msgs=()
    for cmd in info verify export convert; do
      args=("$cmd" "$file")
      [ $cmd = export ] && args+=(-o hostile.out.st)
      [ $cmd = convert ] && args+=(-o hostile.out.h5)
      run "hostile ${file#h_} $cmd" "${want:$k:1}" "$pat" -- "${args[@]}"
      msgs+=("$(sed -n 's/^zreshard [a-z]*: error: //p' out.txt)")
      k=$((k + 1))
    done
    if [ "$want" = 2222 ]; then
      [ "${msgs[0]}" = "${msgs[1]}" ] && [ "${msgs[0]}" = "${msgs[2]}" ] && [ "${msgs[0]}" = "${msgs[3]}" ] &&
        ok || bad "hostile ${file#h_}: the commands refuse it differently: ${msgs[*]}"
    fi
    [ ! -e hostile.out.st ] && [ ! -e hostile.out.h5 ] && ok || bad "hostile ${file#h_}: output written"
  done < hostile.txt
else
  bad "hostile.py could not make the files"
fi

# random damage: flipped bits (mostly in the metadata at the start); any
# outcome but a crash (0, 1 or 2) is acceptable
$PY - "$R" > fuzz.txt <<'PY' && ok || bad "random damage: $(tail -5 fuzz.txt)"
import os, random, subprocess, sys
import h5py
src = open("gpt.h5", "rb").read()
random.seed(11)
codes, crashes = {}, []
for k in range(60):
    b = bytearray(src)
    for _ in range(random.choice([1, 2, 4, 8])):
        i = random.randrange(min(len(b), 12000)) if random.random() < 0.8 else random.randrange(len(b))
        b[i] ^= 1 << random.randrange(8)
    open("fuzz.h5", "wb").write(b)
    for cmd in (["verify"], ["export", "-o", "fuzz.st"], ["convert", "-o", "fuzz2.h5", "--tp", "2"]):
        p = subprocess.run([sys.argv[1], cmd[0], "fuzz.h5"] + cmd[1:], capture_output=True, timeout=120)
        codes[p.returncode] = codes.get(p.returncode, 0) + 1
        if p.returncode not in (0, 1, 2):
            crashes.append(f"case {k} {cmd[0]}: rc {p.returncode} {p.stderr[-200:]!r}")
print("exit codes over 180 runs:", dict(sorted(codes.items())))
print("\n".join(crashes))
sys.exit(1 if crashes else 0)
PY

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
