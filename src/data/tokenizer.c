/* tokenizer: the handle behind tokenizer.h. The byte tokenizer lives here;
 * "hf-bpe" is tok_bpe.c (C, on jansson and PCRE2) and "sentencepiece" is
 * tok_spm.cc (a shim over libsentencepiece). A file's kind is told by its
 * content, not its name: JSON is a tokenizer.json, anything else must load
 * as a SentencePiece model. */
#include "src/data/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "src/data/tok_impl.h"

struct zt_tok {
  const char *kind;
  int vocab, eos;
  zt_bpe *bpe;
  zt_spm *spm;
};

int zt_ids_push(zt_ids *a, const uint32_t *ids, int64_t n) {
  if (a->n + n > a->cap) {
    int64_t c = a->cap ? a->cap : 1024;
    while (c < a->n + n) c *= 2;
    uint32_t *v = realloc(a->v, (size_t)c * sizeof *v);
    if (!v) return -1;
    a->v = v;
    a->cap = c;
  }
  if (n) memcpy(a->v + a->n, ids, (size_t)n * sizeof *ids);
  a->n += n;
  return 0;
}

int zt_utf8_check(const char *text, size_t n, size_t *bad) {
  const unsigned char *s = (const unsigned char *)text;
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    /* the shortest form only, no surrogates, nothing above U+10FFFF */
    size_t k = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    int ok = k && i + k < n;
    for (size_t j = 1; ok && j <= k; j++) {
      unsigned d = s[i + j];
      ok = j == 1 ? d >= lo && d <= hi : (d & 0xC0) == 0x80;
    }
    if (!ok) {
      *bad = i;
      return -1;
    }
    i += k + 1;
  }
  return 0;
}

int zt_tok_open(zt_tok **t, const char *spec, zt_err *e) {
  *t = NULL;
  zt_tok *k = calloc(1, sizeof *k);
  if (!k) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  k->kind = "byte";
  k->vocab = 256;
  k->eos = -1;
  if (!spec || !strcmp(spec, "byte")) {
    *t = k;
    return ZT_OK;
  }
  struct stat st;
  int dir = !stat(spec, &st) && S_ISDIR(st.st_mode);
  FILE *f = dir ? NULL : fopen(spec, "rb");
  if (!f) {
    free(k);
    return zt_err_set(e, ZT_EINPUT, "tokenizer %s: cannot read it: %s", spec,
                      strerror(dir ? EISDIR : errno));
  }
  int c;
  while ((c = fgetc(f)) == ' ' || c == '\t' || c == '\n' || c == '\r') {}
  fclose(f);
  int rc;
  if (c == '{') {
    rc = zt_bpe_load(&k->bpe, spec, e);
    if (!rc) k->kind = "hf-bpe", k->vocab = zt_bpe_vocab(k->bpe), k->eos = zt_bpe_eos(k->bpe);
  } else {
    char why[1024];
    rc = zt_spm_load(&k->spm, spec, why, sizeof why);
    if (rc == ZT_EINPUT)
      zt_err_set(e, rc, "tokenizer %s: unknown tokenizer file or format: neither a Hugging "
                 "Face tokenizer.json nor a SentencePiece model (%s)", spec, why);
    else if (rc) zt_err_set(e, rc, "tokenizer %s: %s", spec, why);
    if (!rc) k->kind = "sentencepiece", k->vocab = zt_spm_vocab(k->spm), k->eos = zt_spm_eos(k->spm);
  }
  if (rc) {
    free(k);
    return rc;
  }
  *t = k;
  return ZT_OK;
}

void zt_tok_free(zt_tok *t) {
  if (!t) return;
  zt_bpe_free(t->bpe);
  if (t->spm) zt_spm_free(t->spm);
  free(t);
}

const char *zt_tok_kind(const zt_tok *t) { return t->kind; }
int zt_tok_vocab(const zt_tok *t) { return t->vocab; }
int zt_tok_eos(const zt_tok *t) { return t->eos; }
int zt_tok_cuttable(const zt_tok *t) { return t->spm ? 0 : t->bpe ? zt_bpe_cuttable(t->bpe) : 1; }

int zt_tok_encode_append(zt_tok *t, const char *text, size_t n, uint32_t **ids, int64_t *count,
                         int64_t *cap, zt_err *e) {
  zt_ids a = {*ids, *count, *cap};
  int rc = ZT_OK;
  if (t->bpe) rc = zt_bpe_encode(t->bpe, text, n, &a, e);
  else if (t->spm) {
    char why[1024];
    rc = zt_spm_encode(t->spm, text, n, &a, why, sizeof why);
    if (rc) zt_err_set(e, rc, "%s", why);
  } else {
    uint32_t buf[4096];
    for (size_t i = 0; i < n && !rc; i += 4096) {
      size_t m = n - i < 4096 ? n - i : 4096;
      for (size_t j = 0; j < m; j++) buf[j] = (uint8_t)text[i + j];
      if (zt_ids_push(&a, buf, (int64_t)m)) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
    }
  }
  *ids = a.v, *count = a.n, *cap = a.cap;
  return rc;
}

int zt_tok_encode(zt_tok *t, const char *text, size_t n, uint32_t **ids, int64_t *count,
                  zt_err *e) {
  uint32_t *v = NULL;
  int64_t m = 0, cap = 0;
  int rc = zt_tok_encode_append(t, text, n, &v, &m, &cap, e);
  if (!rc && !v && !(v = malloc(sizeof *v))) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  if (rc) {
    free(v);
    return rc;
  }
  *ids = v;
  *count = m;
  return ZT_OK;
}

int zt_tok_decode(zt_tok *t, const uint32_t *ids, int64_t n, char **text, size_t *len,
                  zt_err *e) {
  if (t->bpe) return zt_bpe_decode(t->bpe, ids, n, text, len, e);
  if (t->spm) {
    char why[1024];
    int rc = zt_spm_decode(t->spm, ids, n, text, len, why, sizeof why);
    return rc ? zt_err_set(e, rc, "%s", why) : ZT_OK;
  }
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

int zt_tok_train(const char *const *texts, const size_t *lens, int ntexts, int vocab,
                 const char *out, zt_err *e) {
  char why[1024];
  int rc = zt_spm_train(texts, lens, ntexts, vocab, out, why, sizeof why);
  return rc ? zt_err_set(e, rc, "%s", why) : ZT_OK;
}

int zt_tok_file_hash(const char *spec, char *hex, size_t n, zt_err *e) {
  if (!spec || !strcmp(spec, "byte")) {
    snprintf(hex, n, "%s", "");
    return ZT_OK;
  }
  FILE *f = fopen(spec, "rb");
  if (!f) return zt_err_set(e, ZT_EINPUT, "tokenizer %s: cannot read it: %s", spec, strerror(errno));
  XXH3_state_t *st = XXH3_createState();
  if (!st) {
    fclose(f);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  }
  XXH3_64bits_reset(st);
  char buf[1 << 16];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0) XXH3_64bits_update(st, buf, got);
  int bad = ferror(f);
  fclose(f);
  unsigned long long h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (bad) return zt_err_set(e, ZT_EINPUT, "tokenizer %s: error reading it", spec);
  snprintf(hex, n, "xxh3-64:%016llx", h);
  return ZT_OK;
}
