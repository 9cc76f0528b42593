#!/usr/bin/env bash
# The checkpoint loader never crashes on a damaged file header, under
# AddressSanitizer. A small valid checkpoint written by the plain ztrain
# (HDF5 1.10's file format, checksummed metadata) and its copy in the
# earliest format (no metadata checksums: what ztrain wrote before, and
# still loads; tests/ref/legacy_layout.py) are damaged deterministically
# (seeded): 200 copies, alternating between the two layouts, with 1-4
# flipped, overwritten or randomised bytes in the first 8 KiB (superblock,
# root group and its attributes, group B-trees and heaps, the /script
# dataset, small tensors) or inside an object header of a group or tensor;
# 15 truncations; the undamaged old-layout copy, which must load; and 5
# crafted files, refused by checks of the loader's own (a format attribute
# of 8 strings, integer and float types whose precision exceeds their size,
# a step past the range) or after an HDF5 over-read (a damaged attribute
# message length); the byte-level ones are crafted in the old layout,
# where no checksum stops them before the loader's checks. The damaged
# files of the current layout are also loaded by the plain ztrain, which
# must give the same verdict (no crash inside HDF5). Each is loaded by ztrain_asan (one process: the
# loader is the same code at any rank count; a few also on 2 ranks).
#
# Each load must end in exit 2 with exactly one "ztrain: error:" line naming
# the file and nothing written, or in exit 0 after "checkpoint F loaded",
# with weights and optimizer moments equal to the original's (their
# checksums, recomputed by the --save that follows the load) and the step
# the file holds. A signal, an unsuppressed ASan report, any other exit code
# or a run past 60 s fails the test. At least a third must be refused (about
# 55% are), so the test cannot pass by never reading the damage.
#
# What is excused, because it is HDF5 1.10.8's and cannot be fixed here:
# ASan reports from memcpy and like interceptors while HDF5 iterates an
# object header's messages (tests/asan/hdf5.supp; docs/testing.md says why
# that entry and not all of libhdf5). A fault is never excused: an
# over-read that goes far enough to crash fails the test (the file set is
# fixed, so such a file would fail every run, not now and then).
# ASan options: detect_leaks=0 (HDF5 and Open MPI keep allocations to exit;
# memory errors are the point here), allocator_may_return_null=1 (a damaged
# length makes HDF5 ask malloc for 2^63 bytes; glibc returns NULL and HDF5
# fails cleanly, ASan's default would abort), exitcode=99 for a report.
# The crafted files (but the huge step, which only the trainer's data
# position cannot take) also go to `zreshard verify`, whose reader is
# separate code: each must be refused (exit 2).
# Usage: fuzz_load.sh ZTRAIN ZTRAIN_ASAN SUPPRESSIONS ZRESHARD [MPIRUN...]
set -u
Z=$(realpath "$1")
ZA=$(realpath "$2")
SUPP=$(realpath "$3")
ZR=$(realpath "$4")
shift 4
. "$(dirname "$0")/common.sh"
zt_scratch
export OMP_NUM_THREADS=1
# a singleton without Open MPI's orted (a third less time per load); such
# singletons share a job id, so each run gets its own session folder
export OMPI_MCA_ess_singleton_isolated=1

zt_tokens ok.bin 1 4000
cat > small.lua <<'LUA'
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 1, heads = 2}
train = {micro_batch = 2, steps = 2, log_every = 0}
data = {train = "ok.bin"}
LUA
"$Z" small.lua --save ok.h5 > /dev/null 2>&1 || { echo "FAIL: could not write ok.h5"; exit 1; }
/usr/bin/python3 "$(dirname "$0")/../ref/legacy_layout.py" ok.h5 old.h5 ||
  { echo "FAIL: could not write old.h5"; exit 1; }

Z="$Z" ZA="$ZA" SUPP="$SUPP" ZR="$ZR" MPIRUN="$*" /usr/bin/python3 - <<'PY'
import concurrent.futures, os, random, re, shlex, subprocess, sys
import h5py, h5py.h5o, numpy as np

Z, ZA, SUPP, ZR = os.environ["Z"], os.environ["ZA"], os.environ["SUPP"], os.environ["ZR"]
MPIRUN = shlex.split(os.environ["MPIRUN"])
ASAN = ("suppressions=%s:detect_leaks=0:abort_on_error=0:exitcode=99:"
        "allocator_may_return_null=1" % SUPP)
STEP = 2
orig = open("ok.h5", "rb").read()
old = open("old.h5", "rb").read()
os.mkdir("f")

# ---- the files ------------------------------------------------------------
def headers(path):  # object headers: root group, groups, datasets
    heads = []
    with h5py.File(path, "r") as h:
        heads.append(h5py.h5o.get_info(h.id).addr)
        h.visititems(lambda name, obj: heads.append(h5py.h5o.get_info(obj.id).addr))
    return sorted(set(heads))
with h5py.File("ok.h5", "r") as h:
    sums = {g + "/" + k: int(h[g][k].attrs["checksum"])
            for g in ("model", "optim/exp_avg", "optim/exp_avg_sq") for k in h[g]}
layouts = [(orig, headers("ok.h5")), (old, headers("old.h5"))]

files = [("legacy.h5", old)]  # (name, bytes)
for k in range(200):
    r = random.Random(20240 + k)
    src, heads = layouts[k % 2]
    b = bytearray(src)
    for _ in range(r.choice((1, 1, 2, 3, 4))):
        w = r.random()
        if w < 0.5: o = r.randrange(8192)
        elif w < 0.75: o = r.randrange(2048)
        else: o = min(r.choice(heads) + r.randrange(272), len(b) - 1)
        kind = r.randrange(4)
        if kind == 0: b[o] ^= 1 << r.randrange(8)
        elif kind == 1: b[o] = r.randrange(256)
        elif kind == 2: b[o] = r.choice((0, 0xff, 0x7f, 0x80))
        else:
            for j in range(o, min(o + r.randint(2, 8), len(b))): b[j] = r.randrange(256)
    files.append(("d%03d.h5" % k, b))
for n in (1, 8, 48, 96, 400, 800, 1200, 1800, 3000, 6000, 8192, 20000, 100000,
          len(orig) - 4096, len(orig) - 1):
    files.append(("t%06d.h5" % n, orig[:n]))

def patch(pattern, at, new):  # the first occurrence of pattern in old.h5, bytes at `at` replaced
    i = old.find(pattern)
    if i < 0:
        sys.exit("FAIL: no %r in old.h5: the file layout changed; update the crafted cases"
                 % pattern)
    b = bytearray(old)
    b[i + at:i + at + len(new)] = new
    return b
# integer type (class 0 v1, signed LE, 8 bytes) of format_version: precision 64064
files.append(("c_int_prec.h5", patch(b"format_version\0\0\x10\x08\0\0\x08\0\0\0\0\0\x40\0",
                                     16 + 10, b"\x40\xfa")))
# IEEE float32 type (class 1 v1) of the first tensor in the file: precision 64032
files.append(("c_float_prec.h5", patch(b"\x11\x20\x1f\x00\x04\x00\x00\x00\x00\x00\x20\x00",
                                       10, b"\x20\xfa")))
# the format attribute message's dataspace size 8 -> 4104: HDF5 reads the
# value 4 KiB past the message (an over-read hdf5.supp silences)
files.append(("c_attr_dspace_len.h5", patch(b"\x01\x00\x07\x00\x08\x00\x08\x00format\0",
                                            7, b"\x10")))
for name in ("c_format_array.h5", "c_step_max.h5"):
    open("f/" + name, "wb").write(orig)
with h5py.File("f/c_format_array.h5", "r+") as h:
    del h.attrs["format"]
    h.attrs.create("format", np.array([b"ztrain-checkpoint"] * 8, dtype="S17"))
with h5py.File("f/c_step_max.h5", "r+") as h:
    h.attrs.modify("step", np.int64(2**63 - 1))
for name, b in files:
    open("f/" + name, "wb").write(b)
names = [n for n, _ in files] + ["c_format_array.h5", "c_step_max.h5"]

# ---- the loads ------------------------------------------------------------
def load(name, cmd=(), asan=True, timeout=60):
    path = "f/" + name
    out = "r/" + name + (".np2" if cmd else "")
    tmp = os.path.abspath(out + ".mpi")  # this run's own MPI session folder
    os.makedirs(tmp, exist_ok=True)
    env = dict(os.environ, ASAN_OPTIONS=ASAN, OMPI_MCA_orte_tmpdir_base=tmp)
    argv = list(cmd) + [ZA if asan else Z, "small.lua", "--load", path, "--steps", "0",
                        "--save", out]
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr, out
    except subprocess.TimeoutExpired as x:
        return "timeout", "", str(x), out

os.mkdir("r")
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    runs = dict(zip(names, pool.map(load, names)))

def one_error(name, err):
    lines = [l for l in err.splitlines() if l.startswith("ztrain: error:")]
    return len(lines) == 1 and name in lines[0], lines

fails, refused, loaded, damaged_step, msgs = [], 0, 0, [], {}
for name in names:
    rc, out, err, saved = runs[name]
    why = None
    if rc == "timeout":
        why = "no exit within 60 s (hang)"
    elif "ERROR: AddressSanitizer" in err:
        why = "ASan report"
    elif rc == 2:
        ok, lines = one_error(name, err)
        if not ok:
            why = "exit 2 with %d error lines %s" % (len(lines), lines[:2])
        elif os.path.exists(saved):
            why = "refused but wrote %s" % saved
        else:
            refused += 1
            m = re.sub(r"f/\S+\.h5", "F", lines[0])
            m = re.sub(r"(tensor|read) \S+", r"\1 T", m)
            msgs[m] = msgs.get(m, 0) + 1
    elif rc == 0:
        if "checkpoint f/%s loaded" % name not in out:
            why = "exit 0 without 'checkpoint ... loaded'"
        else:
            with h5py.File(saved, "r") as h:
                got = {g + "/" + k: int(h[g][k].attrs["checksum"])
                       for g in ("model", "optim/exp_avg", "optim/exp_avg_sq") for k in h[g]}
                step = int(h.attrs["step"])
            bad = sorted(k for k in sums if got.get(k) != sums[k])
            if bad:
                why = "loaded, but %d tensors differ from the original (%s)" % (len(bad), bad[0])
            elif step != STEP:
                # root attributes carry no checksum: a damaged step can load,
                # but it must be the step the file holds
                with h5py.File("f/" + name, "r") as h:
                    held = int(h.attrs["step"])
                if held != step:
                    why = "loaded step %d, the file holds %d" % (step, held)
                else:
                    damaged_step.append("%s (%d)" % (name, step))
                    loaded += 1
            else:
                loaded += 1
    else:
        why = "exit code %s" % rc
    if why:
        fails.append(name)
        print("FAIL %s: %s" % (name, why))
        for l in (err.splitlines() + out.splitlines())[:25]:
            print("    " + l)

# the plain ztrain on the damaged files of the current layout: HDF5 checks
# their metadata checksums, so no damage reaches its decoders (in the old
# layout about 1 in 300 damaged files crashes the plain build inside HDF5,
# which ASan's build here does not show: its heap layout differs)
current = ["d%03d.h5" % k for k in range(0, 200, 2)]
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    plain = dict(zip(current, pool.map(lambda n: load(n, asan=False), current)))
for name in current:
    if plain[name][0] != runs[name][0] and name not in fails:
        fails.append(name + " (plain)")
        print("FAIL %s: the plain ztrain exits %s, ztrain_asan %s" % (name, plain[name][0],
                                                                     runs[name][0]))
if runs["legacy.h5"][0] != 0 and "legacy.h5" not in fails:
    fails.append("legacy.h5")
    print("FAIL legacy.h5: the old layout does not load (exit %s)" % runs["legacy.h5"][0])
for name in [n for n in names if n.startswith("c_") and n not in fails]:
    if runs[name][0] != 2:
        fails.append(name)
        print("FAIL %s: crafted file not refused (exit %s)" % (name, runs[name][0]))
    if name == "c_step_max.h5":
        continue  # a huge step overflows only the trainer's data position; zreshard has none
    tmp = os.path.abspath("r/%s.zr.mpi" % name)  # its own MPI session folder, as in load()
    os.makedirs(tmp, exist_ok=True)
    zr = subprocess.run([ZR, "verify", "f/" + name], capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, OMPI_MCA_orte_tmpdir_base=tmp))
    if zr.returncode != 2:
        fails.append(name + " (zreshard)")
        print("FAIL %s: zreshard verify exits %s: %s" % (name, zr.returncode, zr.stderr[-300:]))

# a few on 2 ranks: same verdict, one message
if MPIRUN:
    pick = [n for n in names if runs[n][0] == 2 and n.startswith("d")][:3] + \
           [n for n in names if runs[n][0] == 0][:1]
    for name in pick:
        rc, out, err, saved = load(name, cmd=MPIRUN + ["-np", "2"], timeout=120)
        ok = rc == runs[name][0] and "ERROR: AddressSanitizer" not in err and \
            (rc != 2 or one_error(name, err)[0])
        if not ok:
            fails.append(name + " (np 2)")
            print("FAIL %s on 2 ranks: exit %s, on 1 rank %s" % (name, rc, runs[name][0]))
            for l in err.splitlines()[:15]:
                print("    " + l)

for m, c in sorted(msgs.items(), key=lambda x: -x[1]):
    print("  %4d  %s" % (c, m))
if damaged_step:
    print("loaded with a damaged step (root attributes carry no checksum): " +
          ", ".join(damaged_step))
n = len(names)
print("fuzz_load: %d files: %d refused, %d loaded, %d failed; HDF5's over-reads in its "
      "message decoder are suppressed (tests/asan/hdf5.supp)" % (n, refused, loaded, len(fails)))
if refused < n // 3:
    print("FAIL: only %d of %d refused: is the damage read at all?" % (refused, n))
    fails.append("refusals")
sys.exit(1 if fails else 0)
PY
