/* tokenizer: the handle behind tokenizer.h. The byte tokenizer lives here;
 * the BPE and SentencePiece kinds are added beside it. */
#include "src/data/tokenizer.h"

#include <stdlib.h>
#include <string.h>

struct zt_tok {
  const char *kind;
  int vocab, eos;
};

int zt_tok_open(zt_tok **t, const char *spec, zt_err *e) {
  *t = NULL;
  if (spec && strcmp(spec, "byte"))
    return zt_err_set(e, ZT_EINPUT,
                      "tokenizer %s: only the byte tokenizer (\"byte\") is "
                      "built into this ztrain", spec);
  zt_tok *k = calloc(1, sizeof *k);
  if (!k) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  k->kind = "byte";
  k->vocab = 256;
  k->eos = -1;
  *t = k;
  return ZT_OK;
}

void zt_tok_free(zt_tok *t) { free(t); }
const char *zt_tok_kind(const zt_tok *t) { return t->kind; }
int zt_tok_vocab(const zt_tok *t) { return t->vocab; }
int zt_tok_eos(const zt_tok *t) { return t->eos; }

int zt_tok_encode(zt_tok *t, const char *text, size_t n, uint32_t **ids,
                  int64_t *count, zt_err *e) {
  (void)t;
  uint32_t *out = malloc((n ? n : 1) * sizeof *out);
  if (!out) return zt_err_set(e, ZT_ERUNTIME, "out of memory encoding %zu bytes", n);
  for (size_t i = 0; i < n; i++) out[i] = (uint8_t)text[i];
  *ids = out;
  *count = (int64_t)n;
  return ZT_OK;
}

int zt_tok_decode(zt_tok *t, const uint32_t *ids, int64_t n, char **text,
                  size_t *len, zt_err *e) {
  char *out = malloc((size_t)n + 1);
  if (!out) return zt_err_set(e, ZT_ERUNTIME, "out of memory decoding %lld ids", (long long)n);
  for (int64_t i = 0; i < n; i++) {
    if (ids[i] >= (uint32_t)t->vocab) {
      free(out);
      return zt_err_set(e, ZT_EINPUT, "token id %u at %lld is not below the vocab %d",
                        ids[i], (long long)i, t->vocab);
    }
    out[i] = (char)ids[i];
  }
  out[n] = 0;
  *text = out;
  *len = (size_t)n;
  return ZT_OK;
}
