/* err: see err.h. */
#include "src/core/err.h"

#include <stdarg.h>
#include <stdio.h>

int zt_err_set(zt_err *e, int code, const char *fmt, ...) {
  if (!e) return code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  e->code = code;
  return code;
}
