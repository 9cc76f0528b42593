/* gemm_path: see gemm_path.h. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "kernels/cpu/gemm_path.h"

#include <cblas.h>
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kernels/cpu/ops.h"

#ifdef ZT_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

/* Set by ztrain before it executes itself again, read (and removed) by the
 * next image: "sim:CORE" (the test hook: OPENBLAS_CORETYPE=CORE stands for
 * OpenBLAS's own detection), "chose:CORE:DETECTED" (ztrain set
 * OPENBLAS_CORETYPE=CORE), "fallback:REFUSED:DETECTED" (the self-check
 * refused REFUSED; OPENBLAS_CORETYPE=DETECTED, or unset when DETECTED is
 * empty). Every transition goes forward (none -> sim -> chose ->
 * fallback), so the program never executes itself more than three times.
 * A marker only counts while OPENBLAS_CORETYPE still says what it set, so
 * a user's own variable is never taken for ztrain's. */
#define STATE_VAR "ZT_GEMM_STATE"

static zt_gemm_path path;
/* Read by every float GEMM: a plain flag, set before any runs. On by
 * default, so that programs which never select (the unit tests) run the
 * kernels ztrain trains with. */
#ifdef ZT_HAVE_ONEDNN
static int use_onednn = 1;
#else
static int use_onednn = 0;
#endif

void zt_cpu_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc) {
#ifdef ZT_HAVE_ONEDNN
  /* dnnl_sgemm is row-major, like every call here; a status other than
   * success (arguments it refuses) leaves the call to OpenBLAS */
  if (use_onednn && order == CblasRowMajor &&
      dnnl_sgemm(ta == CblasTrans ? 'T' : 'N', tb == CblasTrans ? 'T' : 'N', m, n, k, alpha, a,
                 lda, b, ldb, beta, c, ldc) == dnnl_success)
    return;
#endif
  cblas_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const zt_gemm_path *zt_cpu_gemm_path(void) { return &path; }

const char *zt_cpu_isa_name(int isa) {
  switch (isa) {
    case ZT_ISA_SSE: return "SSE";
    case ZT_ISA_AVX: return "AVX";
    case ZT_ISA_AVX2: return "AVX2+FMA";
    case ZT_ISA_AVX512: return "AVX-512";
    default: return "unknown ISA";
  }
}

/* The vector ISA each of OpenBLAS's x86-64 cores (dynamic.c's names) is
 * written for. A name not listed (a later OpenBLAS's) is trusted. */
static int core_isa(const char *core) {
  static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
  static const char *const avx2[] = {"Haswell", "Zen", "Excavator"};
  static const char *const avx[] = {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"};
  static const char *const sse[] = {"Katmai", "Coppermine", "Northwood", "Prescott", "Banias",
                                    "Atom", "Core2", "Penryn", "Dunnington", "Nehalem",
                                    "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Nano",
                                    "Bobcat"};
#define ZT_IN(list, isa)                                                  \
  for (size_t i = 0; i < sizeof list / sizeof *list; i++)                 \
    if (!strcasecmp(core, list[i])) return isa;
  ZT_IN(avx512, ZT_ISA_AVX512)
  ZT_IN(avx2, ZT_ISA_AVX2)
  ZT_IN(avx, ZT_ISA_AVX)
  ZT_IN(sse, ZT_ISA_SSE)
#undef ZT_IN
  return ZT_ISA_UNKNOWN;
}

/* What the CPU and the OS allow (GCC's cpuid checks XCR0 too, so AVX-512
 * that the kernel does not save counts as absent). */
static int cpu_isa(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    return ZT_ISA_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ZT_ISA_AVX2;
  if (__builtin_cpu_supports("avx")) return ZT_ISA_AVX;
  if (__builtin_cpu_supports("sse3")) return ZT_ISA_SSE;
#endif
  return ZT_ISA_UNKNOWN;
}

/* fp32 FLOPs per cycle and core: vector width x 2 (FMA, or an add and a
 * multiply port) x 2 units. An upper bound: some parts have one AVX-512
 * FMA unit (Xeon Bronze/Silver) or split 512-bit work in two (Zen 4);
 * MFU's peak must never be below what a core can do. */
static int isa_flops_per_cycle(int isa) {
  switch (isa) {
    case ZT_ISA_SSE: return 8;
    case ZT_ISA_AVX: return 16;
    case ZT_ISA_AVX2: return 32;
    case ZT_ISA_AVX512: return 64;
    default: return 0;
  }
}

/* OpenBLAS's best core for a CPU at this ISA level, or NULL. */
static const char *best_core(int isa) {
  switch (isa) {
    case ZT_ISA_AVX512: return "SkylakeX";
#if defined(__x86_64__) || defined(__i386__)
    case ZT_ISA_AVX2: return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
#endif
    case ZT_ISA_AVX: return "Sandybridge";
    default: return NULL;
  }
}

/* snprintf that truncates without a word: every buffer here is a message
 * or a core name, and a cut message is still a message */
__attribute__((format(printf, 3, 4))) static void fmt(char *buf, size_t n, const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, n, f, ap);
  va_end(ap);
}

static void copy(char *dst, size_t n, const char *src) { fmt(dst, n, "%s", src ? src : ""); }

/* Executes this program again with the environment as now set. Returns
 * only on failure. */
static void reexec(char **argv) {
  fflush(stdout);
  fflush(stderr);
  execv("/proc/self/exe", argv);
}

int zt_cpu_gemm_check(char *why, size_t n) {
  /* m, n, k: the threaded path (the larger case) and the small-matrix
   * kernels (the smaller), with leading dimensions wider than the matrix
   * as on attention's strided views. Integer values in [-3, 3], alpha 0.5
   * and beta 1: every sum is exact in float, so the tolerance is zero and
   * any wrong kernel fails. The four combinations lay out the same logical
   * op(A) and op(B), so one plain product checks them all. */
  static const int cases[2][3] = {{101, 83, 203}, {17, 13, 29}};
  const char *corrupt = getenv("ZT_TEST_GEMM_CORRUPT"); /* test hook */
  const char *active = use_onednn ? "oneDNN" : openblas_get_corename();
  int bad = corrupt && *corrupt && (!strcasecmp(corrupt, "any") || !strcasecmp(corrupt, active));
  int rc = 0;
  for (int c = 0; c < 2 && !rc; c++) {
    int M = cases[c][0], N = cases[c][1], K = cases[c][2], ld = (M > N ? M : N) + (K > 3 ? K : 3) + 3;
    size_t sa = (size_t)ld * ld, sc = (size_t)M * ld;
    float *a = malloc(sa * sizeof *a), *b = malloc(sa * sizeof *b), *cc = malloc(sc * sizeof *cc);
    float *want = malloc(sc * sizeof *want);
    if (!a || !b || !cc || !want) {
      fmt(why, n, "out of memory");
      rc = -1;
    }
    /* op(A)[i,p], op(B)[p,j] and C0[i,j] by formula; want = 0.5 op(A) op(B) + C0 */
#define ZT_OPA(i, p) ((float)((int)(((i) * 2 + (p) * 3) % 7) - 3))
#define ZT_OPB(p, j) ((float)((int)(((p) * 5 + (j) * 2) % 7) - 3))
#define ZT_C0(i, j) ((float)((int)(((i) + (j)) % 5) - 2))
    if (!rc) { /* the plain product, with op(A) in a and op(B)^T in b for now */
      for (int i = 0; i < M; i++)
        for (int p = 0; p < K; p++) a[(size_t)i * ld + p] = ZT_OPA(i, p);
      for (int j = 0; j < N; j++)
        for (int p = 0; p < K; p++) b[(size_t)j * ld + p] = ZT_OPB(p, j);
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
          const float *x = a + (size_t)i * ld, *y = b + (size_t)j * ld;
          float s = 0; /* exact: integers far below 2^24 */
          for (int p = 0; p < K; p++) s += x[p] * y[p];
          want[(size_t)i * ld + j] = 0.5f * s + ZT_C0(i, j);
        }
    }
    for (int t = 0; t < 4 && !rc; t++) {
      int ta = t >> 1, tb = t & 1;
      for (int i = 0; i < M; i++)
        for (int p = 0; p < K; p++) a[ta ? (size_t)p * ld + i : (size_t)i * ld + p] = ZT_OPA(i, p);
      for (int p = 0; p < K; p++)
        for (int j = 0; j < N; j++) b[tb ? (size_t)j * ld + p : (size_t)p * ld + j] = ZT_OPB(p, j);
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) cc[(size_t)i * ld + j] = ZT_C0(i, j);
      zt_cpu_f32_gemm(ta, tb, M, N, K, 0.5f, a, ld, b, ld, 1.0f, cc, ld);
      if (bad) cc[(size_t)(M / 2) * ld + N / 2] += 1.0f;
      for (int i = 0; i < M && !rc; i++)
        for (int j = 0; j < N && !rc; j++)
          if (!(cc[(size_t)i * ld + j] == want[(size_t)i * ld + j])) {
            fmt(why, n, "%c%c %dx%dx%d: C[%d,%d] = %.9g, expected %.9g", ta ? 'T' : 'N',
                tb ? 'T' : 'N', M, N, K, i, j, cc[(size_t)i * ld + j], want[(size_t)i * ld + j]);
            rc = -1;
          }
    }
#undef ZT_OPA
#undef ZT_OPB
#undef ZT_C0
    free(a);
    free(b);
    free(cc);
    free(want);
  }
  return rc;
}

void zt_cpu_gemm_describe(char *buf, size_t n, char *other, size_t m) {
  const zt_gemm_path *p = &path;
  const char *isa = zt_cpu_isa_name(p->core_isa);
  char ob[256] = "";
  switch (p->how) {
    case ZT_GEMM_DETECTED:
      fmt(ob, sizeof ob, "%s %s kernels (%s; detected by OpenBLAS)", p->lib, p->core, isa);
      break;
    case ZT_GEMM_CHOSEN:
      fmt(ob, sizeof ob, "%s %s kernels (%s; chosen by ztrain, OpenBLAS detected %s)", p->lib,
          p->core, isa, p->detected);
      break;
    case ZT_GEMM_USER:
      fmt(ob, sizeof ob, "%s %s kernels (%s; OPENBLAS_CORETYPE=%s)", p->lib, p->core, isa,
          getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "?");
      break;
    case ZT_GEMM_FALLBACK:
      fmt(ob, sizeof ob, "%s %s kernels (%s; the self-check refused %s, OpenBLAS detected %s)",
          p->lib, p->core, isa, p->refused, p->core);
      break;
  }
  if (p->onednn) {
    fmt(buf, n, "%s sgemm (%s; detected by oneDNN)", p->onednn_lib, zt_cpu_isa_name(p->onednn_isa));
    fmt(other, m, "fallback %s", ob);
  } else {
    fmt(buf, n, "%s", ob);
    fmt(other, m, "%s", p->onednn_note);
  }
}

#ifdef ZT_HAVE_ONEDNN
static int onednn_isa(void) {
  int isa = (int)dnnl_get_effective_cpu_isa();
  /* dnnl_cpu_isa_t is a bit set: 0x20 AVX-512 (core), 0x8 AVX-512 (Xeon
   * Phi), 0x4 AVX2, 0x2 AVX, 0x1 SSE4.1 */
  return isa & 0x28 ? ZT_ISA_AVX512 : isa & 0x4 ? ZT_ISA_AVX2 : isa & 0x2 ? ZT_ISA_AVX
         : isa & 0x1 ? ZT_ISA_SSE : ZT_ISA_UNKNOWN;
}
#endif

int zt_cpu_gemm_select(char **argv, char *why, size_t n) {
  zt_gemm_path *p = &path;
  memset(p, 0, sizeof *p);
  const char *config = openblas_get_config();
  int words = 0;
  for (size_t i = 0; config[i] && i + 1 < sizeof p->lib; i++) {
    if (config[i] == ' ' && ++words == 2) break;
    p->lib[i] = config[i];
  }
  copy(p->core, sizeof p->core, openblas_get_corename());
  p->core_isa = core_isa(p->core);
  p->cpu_isa = cpu_isa();
  p->flops_per_cycle = isa_flops_per_cycle(p->cpu_isa);
  /* without DYNAMIC_ARCH OpenBLAS has one core and ignores the variable */
  int dynamic = strstr(config, "DYNAMIC_ARCH") != NULL;

  char state[160] = "", *kind = state, *a = "", *b = "";
  const char *s = getenv(STATE_VAR);
  if (s) {
    copy(state, sizeof state, s);
    unsetenv(STATE_VAR); /* nothing this process starts inherits it */
    char *c1 = strchr(state, ':');
    if (c1) {
      *c1 = 0, a = c1 + 1;
      char *c2 = strchr(a, ':');
      if (c2) *c2 = 0, b = c2 + 1;
    }
  }
  /* a copy: setenv below may free the string getenv returns */
  char env_buf[64] = "";
  copy(env_buf, sizeof env_buf, getenv("OPENBLAS_CORETYPE"));
  const char *env = env_buf[0] ? env_buf : NULL;
  const char *hook = getenv("ZT_TEST_OPENBLAS_DETECTS");
  if (!s && !env && hook && *hook) {
    char st[64];
    fmt(st, sizeof st, "sim:%s", hook);
    setenv("OPENBLAS_CORETYPE", hook, 1);
    setenv(STATE_VAR, st, 1);
    reexec(argv);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(STATE_VAR);
  }

  if (!strcmp(kind, "sim") && env && !strcasecmp(env, a)) {
    p->how = ZT_GEMM_DETECTED; /* stands for OpenBLAS's own choice */
  } else if (!strcmp(kind, "chose") && env && !strcasecmp(env, a)) {
    p->how = ZT_GEMM_CHOSEN;
    copy(p->detected, sizeof p->detected, b);
  } else if (!strcmp(kind, "fallback") && (*b ? env && !strcasecmp(env, b) : !env)) {
    p->how = ZT_GEMM_FALLBACK;
    copy(p->refused, sizeof p->refused, a);
    copy(p->detected, sizeof p->detected, p->core);
  } else {
    p->how = env ? ZT_GEMM_USER : ZT_GEMM_DETECTED;
  }

  const char *best = best_core(p->cpu_isa);
  if (p->how == ZT_GEMM_DETECTED && dynamic && p->core_isa != ZT_ISA_UNKNOWN &&
      p->core_isa < p->cpu_isa && best) {
    char st[96];
    fmt(st, sizeof st, "chose:%s:%s", best, p->core);
    setenv("OPENBLAS_CORETYPE", best, 1);
    setenv(STATE_VAR, st, 1);
    reexec(argv);
    fmt(p->warning[1], sizeof p->warning[1],
        "could not restart with OpenBLAS's %s kernels (/proc/self/exe: %s); running the %s "
        "kernels it detected", best, strerror(errno), p->core);
    if (env) setenv("OPENBLAS_CORETYPE", env, 1);
    else unsetenv("OPENBLAS_CORETYPE");
    unsetenv(STATE_VAR);
  }

  char bad[256] = "";
  use_onednn = 0;
  int openblas_ok = !zt_cpu_gemm_check(bad, sizeof bad);
  if (!openblas_ok && (p->how == ZT_GEMM_CHOSEN || p->how == ZT_GEMM_USER)) {
    /* back to what OpenBLAS detected: named when ztrain knows it, else
     * found again by OpenBLAS with the variable unset */
    char st[96];
    fmt(st, sizeof st, "fallback:%s:%s", p->core, p->detected);
    if (*p->detected) setenv("OPENBLAS_CORETYPE", p->detected, 1);
    else unsetenv("OPENBLAS_CORETYPE");
    setenv(STATE_VAR, st, 1);
    reexec(argv);
  }

#ifdef ZT_HAVE_ONEDNN
  const dnnl_version_t *v = dnnl_version();
  fmt(p->onednn_lib, sizeof p->onednn_lib, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
  p->onednn_isa = onednn_isa();
  if (p->how == ZT_GEMM_USER) {
    fmt(p->onednn_note, sizeof p->onednn_note, "%s unused: OPENBLAS_CORETYPE is set", p->onednn_lib);
  } else {
    char bad2[256];
    use_onednn = 1;
    if (zt_cpu_gemm_check(bad2, sizeof bad2)) {
      use_onednn = 0;
      fmt(p->onednn_note, sizeof p->onednn_note, "the self-check refused %s", p->onednn_lib);
      fmt(p->warning[2], sizeof p->warning[2],
          "the GEMM self-check refused %s's sgemm (%s); float GEMMs run on OpenBLAS's %s kernels",
          p->onednn_lib, bad2, p->core);
    }
  }
#endif
  p->onednn = use_onednn;
  if (!openblas_ok && !use_onednn) {
    fmt(why, n,
        "the GEMM self-check fails on %s's %s kernels (%s)%s; set OPENBLAS_CORETYPE to "
        "kernels that compute right (e.g. Prescott, the slowest and oldest)",
        p->lib, p->core, bad,
        p->how == ZT_GEMM_FALLBACK ? ", and they are the fallback from the refused ones" : "");
    return -1;
  }
  p->check_ok = 1;
  p->gemm_isa = use_onednn ? p->onednn_isa : p->core_isa;

  if (!openblas_ok)
    fmt(p->warning[0], sizeof p->warning[0],
        "the GEMM self-check refused OpenBLAS's %s kernels (%s); float GEMMs run on %s only, "
        "and double ones (tests) are not to be trusted", p->core, bad, p->onednn_lib);
  else if (p->how == ZT_GEMM_FALLBACK)
    fmt(p->warning[0], sizeof p->warning[0],
        "the GEMM self-check refused OpenBLAS's %s kernels (wrong results); running the %s "
        "kernels OpenBLAS detected", p->refused, p->core);
  else if (p->how == ZT_GEMM_CHOSEN && strcasecmp(p->core, a))
    fmt(p->warning[0], sizeof p->warning[0],
        "OpenBLAS runs its %s kernels although ztrain asked for %s", p->core, a);
  else if (p->how == ZT_GEMM_USER && p->core_isa != ZT_ISA_UNKNOWN && p->core_isa < p->cpu_isa)
    fmt(p->warning[0], sizeof p->warning[0],
        "OPENBLAS_CORETYPE=%s selects %s kernels (%s) on a CPU with %s: GEMM runs well "
        "below what the CPU can do; unset it and ztrain chooses", env, p->core,
        zt_cpu_isa_name(p->core_isa), zt_cpu_isa_name(p->cpu_isa));
  else if (!use_onednn && p->how == ZT_GEMM_DETECTED && p->core_isa != ZT_ISA_UNKNOWN &&
           p->core_isa < p->cpu_isa && !p->warning[1][0])
    fmt(p->warning[0], sizeof p->warning[0],
        "OpenBLAS runs %s kernels (%s) on a CPU with %s and %s", p->core,
        zt_cpu_isa_name(p->core_isa), zt_cpu_isa_name(p->cpu_isa),
        dynamic ? "has none better" : "was built for one CPU (no DYNAMIC_ARCH)");
  return 0;
}

/* The clock for the CPU's peak, in GHz. The peak must bound what the
 * vector units can do, so the highest clock the system states wins:
 * cpufreq's maximum (turbo included) where the kernel exposes it; else
 * the larger of the nominal clock in the model name ("@ 2.80GHz",
 * Intel's; all a VM usually shows) and /proc/cpuinfo's "cpu MHz" (the
 * current clock; AMD's names carry none). Not measured: a timing loop costs start-up time and
 * reads low exactly when the cores are busy, which is one of the things
 * the peak is there to reveal. A clock above the stated one (turbo in a
 * VM) shows as a measured rate above the peak, and then the measured
 * rate is the peak. */
double zt_cpu_clock_ghz(const char **from) {
  FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
  double khz = 0;
  if (f) {
    if (fscanf(f, "%lf", &khz) != 1) khz = 0;
    fclose(f);
    if (khz > 0) {
      *from = "cpufreq maximum";
      return khz / 1e6;
    }
  }
  double named = 0, mhz = 0;
  char line[512];
  f = fopen("/proc/cpuinfo", "r");
  while (f && fgets(line, sizeof line, f) && !(named > 0 && mhz > 0)) {
    if (!strncmp(line, "model name", 10) && named <= 0) {
      const char *at = strrchr(line, '@');
      if (at) named = strtod(at + 1, NULL);
      if (!strstr(line, "GHz")) named = 0;
    } else if (!strncmp(line, "cpu MHz", 7) && mhz <= 0) {
      const char *c = strchr(line, ':');
      if (c) mhz = strtod(c + 1, NULL);
    }
  }
  if (f) fclose(f);
  if (named > 0 && named >= mhz / 1e3) {
    *from = "nominal, in the model name";
    return named;
  }
  *from = "/proc/cpuinfo cpu MHz";
  return mhz / 1e3;
}

int zt_cpu_cores(void) {
  cpu_set_t set;
  if (!sched_getaffinity(0, sizeof set, &set)) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}
