/* gemm_path: which GEMM kernels this process runs, and the right ones on
 * any x86-64 CPU without a variable set by the user.
 *
 * OpenBLAS built with DYNAMIC_ARCH picks its kernels once, in its library
 * constructor, before main runs; a CPU it does not recognise gets its
 * oldest ones (Debian's 0.3.21 on Sapphire Rapids: "Prescott", a quarter
 * of the speed). OPENBLAS_CORETYPE overrides the choice, but only if it is
 * in the environment when the library starts, so zt_cpu_gemm_select
 * compares the running kernels with what the CPU supports (cpuid) and, when
 * they are below it, sets OPENBLAS_CORETYPE and executes the program again
 * (before MPI starts, so it works under mpirun and srun alike). Then it
 * checks the kernels it will train with against a plain loop, and refuses
 * kernels that compute wrong results (older OpenBLAS builds do on some CPUs
 * when forced).
 *
 * Where ztrain is built with oneDNN, float GEMMs run on its sgemm instead
 * (it detects the CPU itself, by cpuid, and made whole training steps
 * faster here), after the same self-check; OpenBLAS, with the kernels
 * chosen as above, is the fallback and does the double GEMMs. A user's
 * OPENBLAS_CORETYPE asks for OpenBLAS's kernels: it keeps the float GEMMs
 * on OpenBLAS. docs/performance.md has the measurements behind this. */
#ifndef ZT_CPU_GEMM_PATH_H
#define ZT_CPU_GEMM_PATH_H

#include <stddef.h>

/* Vector ISA levels, in the order of what they allow. */
enum { ZT_ISA_UNKNOWN = 0, ZT_ISA_SSE, ZT_ISA_AVX, ZT_ISA_AVX2, ZT_ISA_AVX512 };

typedef enum {
  ZT_GEMM_DETECTED, /* OpenBLAS's own choice, and the right one */
  ZT_GEMM_CHOSEN,   /* chosen by ztrain: OpenBLAS detected a lesser core */
  ZT_GEMM_USER,     /* OPENBLAS_CORETYPE set by the user */
  ZT_GEMM_FALLBACK  /* the self-check refused the chosen kernels */
} zt_gemm_how;

typedef struct zt_gemm_path {
  char lib[64];       /* "OpenBLAS 0.3.21" */
  char core[32];      /* the kernels running (openblas_get_corename) */
  char detected[32];  /* what OpenBLAS detected by itself, when not running */
  char refused[32];   /* kernels the self-check refused, or "" */
  zt_gemm_how how;
  int core_isa;       /* ISA level of the running kernels */
  int cpu_isa;        /* best ISA level the CPU and the OS support */
  int flops_per_cycle; /* fp32 FLOPs per cycle and core at cpu_isa */
  int check_ok;       /* the running kernels passed the self-check */
  int onednn;         /* float GEMMs run on oneDNN's sgemm */
  char onednn_lib[48]; /* "oneDNN 2.6.3" when built with it, else "" */
  int onednn_isa;     /* the ISA level oneDNN runs at */
  char onednn_note[64]; /* why oneDNN does not run the GEMMs, or "" */
  int gemm_isa;       /* ISA level of the float GEMMs that run */
  char warning[3][512]; /* for the banner: "" or one sentence each */
} zt_gemm_path;

/* Call first in main, before anything uses BLAS and before MPI starts:
 * may execute the program again with the right kernels (then it does not
 * return). argv must be main's. Hooks for tests: ZT_TEST_OPENBLAS_DETECTS
 * = CORE makes the run start as if OpenBLAS had detected CORE;
 * ZT_TEST_GEMM_CORRUPT = CORE, "oneDNN" or "any" corrupts the self-check's
 * product on those kernels. Returns 0, or -1 when no kernels pass the self-check
 * (the message is in why). */
int zt_cpu_gemm_select(char **argv, char *why, size_t n);

/* What zt_cpu_gemm_select found (zeroed before it ran). */
const zt_gemm_path *zt_cpu_gemm_path(void);

/* What runs the float GEMMs, e.g. "OpenBLAS 0.3.21 SkylakeX kernels
 * (AVX-512; chosen by ztrain, OpenBLAS detected Prescott)", and in other
 * the rest ("fallback OpenBLAS ..." under oneDNN, why oneDNN does not run
 * them, or ""). */
void zt_cpu_gemm_describe(char *buf, size_t n, char *other, size_t m);

/* The self-check: the backend's sgemm in the transpose combinations the
 * kernels use against a plain loop, on integer data (so every correct
 * order of summation gives the exact result). 0 when exact; else -1 with
 * the first wrong element in why. */
int zt_cpu_gemm_check(char *why, size_t n);

const char *zt_cpu_isa_name(int isa);

/* The highest clock the system states for this CPU, in GHz (0 when none):
 * cpufreq's maximum, else the nominal clock in the model name or
 * /proc/cpuinfo's cpu MHz; *from says which. Part of the CPU's peak
 * (threads x clock x flops_per_cycle), which must bound what the vector
 * units can do. */
double zt_cpu_clock_ghz(const char **from);

/* The cores this process may run on (its affinity mask). */
int zt_cpu_cores(void);

/* The float GEMM of the backend (cblas_sgemm's arguments; row-major):
 * oneDNN's or OpenBLAS's, as zt_cpu_gemm_select decided (before it runs:
 * oneDNN's where ztrain is built with it). */
void zt_cpu_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc);

#endif
