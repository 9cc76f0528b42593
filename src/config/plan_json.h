/* plan_json: the plan as the run records it (the checkpoint's `plan`
 * attribute, the banner's source of truth for tools): one JSON object of
 * what the run trains and how it ran, so that a later run, zreshard, the
 * HF export and `ztrain sample` read the same record. */
#ifndef ZT_CONFIG_PLAN_JSON_H
#define ZT_CONFIG_PLAN_JSON_H

#include "src/config/config.h"
#include "src/config/dsconfig.h"

/* The record, compact JSON (malloc'd; NULL when out of memory); ds: the
 * DeepSpeed config the run took, or NULL. */
char *zt_config_plan_json(const zt_plan *p, const zt_dsconfig *ds);

#endif
