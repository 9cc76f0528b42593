/* ztrain_plan_search: `ztrain plan SCRIPT.lua --world N --mem-per-rank GiB
 * [--ranks-per-node R] [--link intra=GB/s,inter=GB/s] [--peak TFLOP/s]
 * [--gemm-eff F] [--mem-bw GB/s] [--top K] [-e STMT]...`: the ranked
 * table of the layouts of the script's model that fit (src/plan/search.h).
 * Memory per layout comes from `peak`, or, when NULL, from the memory
 * planner (src/plan/memory.h) on each candidate's own plan; argv[0] is
 * "plan". Returns the exit code (0, or 2 for bad input or nothing fits). */
#ifndef ZT_CLI_PLAN_SEARCH_H
#define ZT_CLI_PLAN_SEARCH_H

#include "src/plan/search.h"

int zt_cli_plan_search(int argc, char **argv, zt_peak_fn peak, void *peak_ctx);

#endif
