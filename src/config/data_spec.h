/* data_spec (config): turns the checked plan's data.train / data.val (the
 * Lua side normalised them to {blend, parts = {{weight, paths}}}) into a
 * zt_data_spec: globs expanded (sorted; one that matches nothing is an
 * error), Megatron-LM datasets named once, every path absolute; and
 * records what a run opened in the plan's JSON. Internal to src/config. */
#ifndef ZT_CONFIG_DATA_SPEC_H
#define ZT_CONFIG_DATA_SPEC_H

#include <lua.h>

#include "src/config/config.h"

/* With the source table (data.train's value) on top of L's stack. `key`
 * names it in messages ("data.train"). */
int zt_config_data_spec(lua_State *L, const char *key, zt_data_spec *s, zt_err *e);
void zt_data_spec_free(zt_data_spec *s);

#endif
