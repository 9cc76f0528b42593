/* `ztrain plan SCRIPT --world N --mem-per-rank GiB ...` with the test
 * double for memory (plan_search_double.h) in place of the memory planner
 * ztrain gives it: the same entry (src/cli/ztrain_plan_search.h), so the
 * search's filtering and ranking are tested on numbers the test controls.
 * Usage: plan_search_cli plan SCRIPT.lua ... */
#include <stdio.h>

#include "src/cli/ztrain_plan_search.h"
#include "src/config/config.h"
#include "tests/unit/plan_search_double.h"

typedef struct {
  zt_model_cfg model;
} ctx;

/* The double needs the model: load it the way the entry does. */
static int peak(const zt_candidate *c, void *p, int64_t *bytes, zt_err *e) {
  return test_double_peak(c, &((ctx *)p)->model, bytes, e);
}

int main(int argc, char **argv) {
  ctx x = {0};
  /* the script is the last argument that does not start with '-' after an option */
  const char *script = NULL;
  for (int i = 2; i < argc; i++)
    if (argv[i][0] != '-' && !(i > 2 && argv[i - 1][0] == '-' && argv[i - 1][1] != '\0'))
      script = argv[i];
  if (script) {
    zt_plan p = {0};
    zt_err e = {0};
    if (!zt_config_load(&p, script, NULL, 0, 0, NULL, &e)) x.model = p.model;
    x.model.recompute = NULL;
    zt_plan_free(&p);
  }
  return zt_cli_plan_search(argc - 1, argv + 1, peak, &x);
}
