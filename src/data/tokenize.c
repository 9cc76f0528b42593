/* tokenize: the byte-level tokenizer behind `ztrain tokenize`. Each byte is
 * one token, so any text works and the vocabulary is 256. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/data/data.h"

int zt_tokenize_text(const char *in, const char *out, const char *val_path,
                     double val_fraction, zt_err *e) {
  if (val_path && !(val_fraction > 0 && val_fraction < 1))
    return zt_err_set(e, ZT_EINPUT, "--val-fraction must be in (0, 1), got %g",
                      val_fraction);
  FILE *f = fopen(in, "rb");
  if (!f) return zt_err_set(e, ZT_EINPUT, "cannot read %s: %s", in, strerror(errno));
  size_t cap = 1 << 20, n = 0;
  uint8_t *text = malloc(cap);
  size_t got;
  while (text && (got = fread(text + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) text = realloc(text, cap *= 2);
  }
  int read_err = ferror(f);
  fclose(f);
  if (!text) return zt_err_set(e, ZT_ERUNTIME, "out of memory reading %s", in);
  if (read_err) {
    free(text);
    return zt_err_set(e, ZT_EINPUT, "error reading %s", in);
  }
  uint32_t *tok = malloc((n ? n : 1) * sizeof *tok);
  for (size_t i = 0; i < n; i++) tok[i] = text[i];
  free(text);
  size_t ntrain = val_path ? (size_t)((double)n * (1 - val_fraction)) : n;
  int rc = zt_tokens_write(out, tok, (int64_t)ntrain, 2, 256, e);
  if (!rc && val_path)
    rc = zt_tokens_write(val_path, tok + ntrain, (int64_t)(n - ntrain), 2, 256, e);
  free(tok);
  return rc;
}
