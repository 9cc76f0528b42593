/* tok_bpe: the "hf-bpe" tokenizer, a Hugging Face tokenizer.json whose
 * model is byte-level BPE (GPT-2, LLaMA 3), encoded the way HF `tokenizers`
 * does and checked token for token against it (tests/tok/).
 *
 * Encoding: added tokens are cut out of the text whole (longest match
 * first); each stretch between them goes through the pre-tokenizer stages
 * (Split regexes, ByteLevel with its GPT-2 regex), compiled with PCRE2 in
 * UTF + UCP mode since HF's Oniguruma patterns (\p{L}, lookahead) are PCRE
 * syntax; each piece's bytes are then merged pair by pair in merge-rank
 * order. Vocabulary entries are kept as raw bytes (GPT-2's byte-to-unicode
 * map undone at load), so a piece never has to be re-encoded as unicode.
 * Unicode normalizers (NFC as Qwen2 has, NFD, NFKC, NFKD) run on each
 * stretch through utf8proc. Anything else a tokenizer.json can say (other
 * normalizers and models, dropout, prefixes) is refused with the field's
 * name rather than guessed. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include <xxhash.h>

#include "src/data/tok_impl.h"

/* GPT-2's regex, which ByteLevel uses when use_regex is true. */
static const char gpt2_re[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* A pre-tokenizer stage: split on a regex (matches and gaps both kept:
 * HF's "Isolated"), optionally after prefixing a space (ByteLevel). */
typedef struct {
  pcre2_code *re; /* NULL: no split */
  int prefix_space, byte_level;
} stage;

typedef struct {
  char *s;
  size_t len;
  uint32_t id;
} added;

/* Open-addressed tables: byte strings to ids, id pairs to merges. */
typedef struct {
  uint32_t *slot; /* id + 1, 0 = empty */
  size_t mask;
} str_table;
typedef struct {
  uint64_t *key; /* (a << 32 | b) + 1, 0 = empty */
  uint32_t *rank, *id;
  size_t mask;
} pair_table;

/* Pieces repeat (words, spaces): a direct-mapped cache of short pieces'
 * ids saves the merging. An entry is replaced by the next piece that hashes
 * to its slot. */
#define CACHE_SLOTS (1 << 16)
#define CACHE_BYTES 24
#define CACHE_IDS 12
typedef struct {
  uint8_t len, nids; /* len 0: empty */
  char s[CACHE_BYTES];
  uint32_t ids[CACHE_IDS];
} cache_entry;

struct zt_bpe {
  cache_entry *cache;
  utf8proc_option_t norm[4]; /* normalizers, applied in order */
  int nnorm;
  int vocab, eos, ignore_merges;
  char **tok; /* id -> bytes (NULL: no such id) */
  uint32_t *toklen;
  str_table strs;
  pair_table pairs;
  uint32_t byte_id[256];
  stage st[8];
  int nst;
  added *add;
  int nadd;
  uint8_t add_first[256]; /* whether some added token starts with this byte */
  pcre2_match_data *md;
  char *work; /* scratch for pre-tokenized pieces */
  size_t work_cap;
  size_t *span; /* piece offsets/lengths, pairs */
  size_t span_cap;
};

static size_t pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c <<= 1;
  return c;
}

static uint32_t str_get(const zt_bpe *b, const char *s, size_t n) {
  size_t h = (size_t)XXH3_64bits(s, n) & b->strs.mask;
  for (;; h = (h + 1) & b->strs.mask) {
    uint32_t v = b->strs.slot[h];
    if (!v) return UINT32_MAX;
    if (b->toklen[v - 1] == n && !memcmp(b->tok[v - 1], s, n)) return v - 1;
  }
}

static void str_put(zt_bpe *b, uint32_t id) {
  size_t h = (size_t)XXH3_64bits(b->tok[id], b->toklen[id]) & b->strs.mask;
  for (;; h = (h + 1) & b->strs.mask) {
    uint32_t v = b->strs.slot[h];
    if (!v) {
      b->strs.slot[h] = id + 1;
      return;
    }
    if (b->toklen[v - 1] == b->toklen[id] && !memcmp(b->tok[v - 1], b->tok[id], b->toklen[id]))
      return; /* the first id of a byte string wins */
  }
}

static size_t pair_slot(const pair_table *p, uint64_t key) {
  size_t h = (size_t)XXH3_64bits(&key, sizeof key) & p->mask;
  while (p->key[h] && p->key[h] != key) h = (h + 1) & p->mask;
  return h;
}

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the
 * others for code points from 256 on, in byte order. */
static void byte_unicode(uint32_t cp_of[256], int byte_of[512]) {
  int n = 0;
  for (int i = 0; i < 512; i++) byte_of[i] = -1;
  for (int c = 0; c < 256; c++) {
    int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
    cp_of[c] = printable ? (uint32_t)c : (uint32_t)(256 + n++);
    byte_of[cp_of[c]] = c;
  }
}

/* Next code point of valid UTF-8 at *p (advances it). */
static uint32_t utf8_next(const unsigned char **p, const unsigned char *end) {
  const unsigned char *s = *p;
  uint32_t c = s[0];
  int extra = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
  if (extra) c &= 0x3F >> extra;
  for (int i = 1; i <= extra && s + i < end; i++) c = c << 6 | (s[i] & 0x3F);
  *p = s + 1 + extra > end ? end : s + 1 + extra;
  return c;
}

/* A vocabulary entry's raw bytes: its characters through the inverse
 * byte-to-unicode map. An entry with other characters (a special token
 * in the model's vocab) stays as its own UTF-8. */
static int entry_bytes(const char *s, size_t n, const int byte_of[512], char **out,
                       uint32_t *outn) {
  char *r = malloc(n + 1);
  if (!r) return -1;
  const unsigned char *p = (const unsigned char *)s, *end = p + n;
  size_t k = 0;
  while (p < end) {
    uint32_t c = utf8_next(&p, end);
    if (c >= 512 || byte_of[c] < 0) {
      memcpy(r, s, n);
      k = n;
      break;
    }
    r[k++] = (char)byte_of[c];
  }
  r[k] = 0;
  *out = r;
  *outn = (uint32_t)k;
  return 0;
}

static int compile(pcre2_code **re, const char *pat, size_t n, int literal, const char *path,
                   zt_err *e) {
  int code;
  PCRE2_SIZE off;
  *re = pcre2_compile((PCRE2_SPTR)pat, n, PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP),
                      &code, &off, NULL);
  if (!*re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    return zt_err_set(e, ZT_EINPUT, "tokenizer %s: pre_tokenizer pattern /%.*s/ at %zu: %s", path,
                      (int)n, pat, (size_t)off, msg);
  }
  pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* only faster; the interpreter works too */
  return ZT_OK;
}

static int refuse(zt_err *e, const char *path, const char *field, const char *what) {
  return zt_err_set(e, ZT_EINPUT,
                    "tokenizer %s: %s %s is not supported (ztrain reads byte-level BPE "
                    "tokenizer.json files as GPT-2's and LLaMA 3's)", path, field, what);
}

/* One pre-tokenizer (ByteLevel or Split) as stages. */
static int read_pretok(zt_bpe *b, json_t *pt, const char *path, zt_err *e) {
  const char *type = json_string_value(json_object_get(pt, "type"));
  if (!type) return refuse(e, path, "pre_tokenizer", "without a type");
  if (!strcmp(type, "Sequence")) {
    json_t *list = json_object_get(pt, "pretokenizers"), *it;
    size_t i;
    json_array_foreach(list, i, it) {
      int rc = read_pretok(b, it, path, e);
      if (rc) return rc;
    }
    return ZT_OK;
  }
  if (b->nst == (int)(sizeof b->st / sizeof *b->st))
    return refuse(e, path, "pre_tokenizer", "with more than 8 stages");
  stage *s = &b->st[b->nst];
  if (!strcmp(type, "ByteLevel")) {
    json_t *ur = json_object_get(pt, "use_regex");
    s->prefix_space = json_is_true(json_object_get(pt, "add_prefix_space"));
    s->byte_level = 1;
    b->nst++;
    return ur && json_is_false(ur) ? ZT_OK : compile(&s->re, gpt2_re, strlen(gpt2_re), 0, path, e);
  }
  if (!strcmp(type, "Split")) {
    const char *beh = json_string_value(json_object_get(pt, "behavior"));
    if (!beh || strcmp(beh, "Isolated"))
      return refuse(e, path, "pre_tokenizer.behavior", beh ? beh : "(missing)");
    if (json_is_true(json_object_get(pt, "invert")))
      return refuse(e, path, "pre_tokenizer.invert", "true");
    json_t *pat = json_object_get(pt, "pattern");
    json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    json_t *p = rx ? rx : lit;
    if (!json_is_string(p)) return refuse(e, path, "pre_tokenizer.pattern", "without Regex or String");
    b->nst++;
    return compile(&s->re, json_string_value(p), json_string_length(p), !rx, path, e);
  }
  return refuse(e, path, "pre_tokenizer type", type);
}

/* A Unicode normalizer, or a Sequence of them, as utf8proc options. */
static int read_norm(zt_bpe *b, json_t *n, const char *path, zt_err *e) {
  const char *type = json_string_value(json_object_get(n, "type"));
  if (type && !strcmp(type, "Sequence")) {
    json_t *it;
    size_t i;
    json_array_foreach(json_object_get(n, "normalizers"), i, it) {
      int rc = read_norm(b, it, path, e);
      if (rc) return rc;
    }
    return ZT_OK;
  }
  static const char *const names[] = {"NFC", "NFD", "NFKC", "NFKD"};
  static const utf8proc_option_t opts[] = {
      UTF8PROC_STABLE | UTF8PROC_COMPOSE, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
      UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
      UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
  for (int k = 0; type && k < 4; k++)
    if (!strcmp(type, names[k])) {
      if (b->nnorm == 4) return refuse(e, path, "normalizer", "with more than 4 steps");
      b->norm[b->nnorm++] = opts[k];
      return ZT_OK;
    }
  return refuse(e, path, "normalizer", type ? type : "(untyped)");
}

/* "a b" (tokenizers < 0.20) or ["a", "b"] (newer). */
static int merge_parts(json_t *m, const char **a, size_t *an, const char **bp, size_t *bn) {
  if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
      json_is_string(json_array_get(m, 1))) {
    *a = json_string_value(json_array_get(m, 0));
    *an = json_string_length(json_array_get(m, 0));
    *bp = json_string_value(json_array_get(m, 1));
    *bn = json_string_length(json_array_get(m, 1));
    return 0;
  }
  const char *s = json_string_value(m), *sp = s ? strchr(s + (*s == ' '), ' ') : NULL;
  if (!sp) return -1;
  *a = s, *an = (size_t)(sp - s), *bp = sp + 1, *bn = strlen(sp + 1);
  return 0;
}

static int read_model(zt_bpe *b, json_t *model, json_t *addl, const char *path, zt_err *e) {
  const char *type = json_string_value(json_object_get(model, "type"));
  if (!type || strcmp(type, "BPE")) return refuse(e, path, "model.type", type ? type : "(missing)");
  json_t *d = json_object_get(model, "dropout");
  if (d && !json_is_null(d) && json_number_value(d) > 0) return refuse(e, path, "model.dropout", "> 0");
  static const char *const unset[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    const char *v = json_string_value(json_object_get(model, unset[i]));
    if (v && *v) return refuse(e, path, unset[i], v);
  }
  if (json_is_true(json_object_get(model, "byte_fallback")))
    return refuse(e, path, "model.byte_fallback", "true");
  b->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
  json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
  if (!json_is_object(vocab) || !json_is_array(merges))
    return zt_err_set(e, ZT_EINPUT, "tokenizer %s: model.vocab (an object) or model.merges "
                      "(an array) is missing", path);
  /* the vocabulary: model entries and added tokens, ids below 2^31 */
  const char *key;
  json_t *v, *it;
  size_t i;
  json_int_t top = -1;
  json_object_foreach(vocab, key, v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 30))
      return zt_err_set(e, ZT_EINPUT, "tokenizer %s: model.vocab[\"%s\"] is not an id", path, key);
    if (json_integer_value(v) > top) top = json_integer_value(v);
  }
  json_array_foreach(addl, i, it) {
    json_t *id = json_object_get(it, "id");
    if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 30) ||
        !json_is_string(json_object_get(it, "content")) ||
        !json_string_length(json_object_get(it, "content")))
      return zt_err_set(e, ZT_EINPUT, "tokenizer %s: added_tokens[%zu] needs an id and a content",
                        path, i);
    static const char *const opts[] = {"single_word", "lstrip", "rstrip"};
    for (int k = 0; k < 3; k++)
      if (json_is_true(json_object_get(it, opts[k])))
        return refuse(e, path, "added_tokens[].", opts[k]);
    if (json_integer_value(id) > top) top = json_integer_value(id);
  }
  /* ids index tables: a sparse one (a hostile file) must not cost gigabytes */
  size_t entries = json_object_size(vocab) + json_array_size(addl);
  if ((size_t)top >= 2 * entries + 65536)
    return zt_err_set(e, ZT_EINPUT, "tokenizer %s: id %lld is far beyond its %zu entries", path,
                      (long long)top, entries);
  b->vocab = (int)top + 1;
  b->tok = calloc((size_t)b->vocab, sizeof *b->tok);
  b->toklen = calloc((size_t)b->vocab, sizeof *b->toklen);
  b->strs.mask = pow2_at_least(2 * (size_t)b->vocab) - 1;
  b->strs.slot = calloc(b->strs.mask + 1, sizeof *b->strs.slot);
  if (!b->tok || !b->toklen || !b->strs.slot) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  uint32_t cp_of[256];
  int byte_of[512];
  byte_unicode(cp_of, byte_of);
  json_object_foreach(vocab, key, v) {
    uint32_t id = (uint32_t)json_integer_value(v);
    if (b->tok[id]) return zt_err_set(e, ZT_EINPUT, "tokenizer %s: id %u appears twice in model.vocab", path, id);
    if (entry_bytes(key, strlen(key), byte_of, &b->tok[id], &b->toklen[id]))
      return zt_err_set(e, ZT_ERUNTIME, "out of memory");
    str_put(b, id);
  }
  for (int c = 0; c < 256; c++) {
    char s[1] = {(char)c};
    b->byte_id[c] = str_get(b, s, 1);
    if (b->byte_id[c] == UINT32_MAX)
      return zt_err_set(e, ZT_EINPUT, "tokenizer %s: model.vocab has no entry for byte 0x%02X "
                        "(U+%04X): not a byte-level BPE vocabulary", path, c, cp_of[c]);
  }
  /* merges: (left id, right id) -> (rank, id of the joined bytes) */
  size_t nm = json_array_size(merges);
  b->pairs.mask = pow2_at_least(2 * nm + 1) - 1;
  b->pairs.key = calloc(b->pairs.mask + 1, sizeof *b->pairs.key);
  b->pairs.rank = malloc((b->pairs.mask + 1) * sizeof *b->pairs.rank);
  b->pairs.id = malloc((b->pairs.mask + 1) * sizeof *b->pairs.id);
  if (!b->pairs.key || !b->pairs.rank || !b->pairs.id) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  char *joined = NULL;
  size_t jcap = 0;
  json_array_foreach(merges, i, it) {
    const char *a, *c;
    size_t an, cn;
    char *ab = NULL, *cb = NULL;
    uint32_t abn, cbn;
    if (merge_parts(it, &a, &an, &c, &cn))
      return free(joined), zt_err_set(e, ZT_EINPUT, "tokenizer %s: model.merges[%zu] is not a pair", path, i);
    if (entry_bytes(a, an, byte_of, &ab, &abn) || entry_bytes(c, cn, byte_of, &cb, &cbn))
      return free(ab), free(joined), zt_err_set(e, ZT_ERUNTIME, "out of memory");
    uint32_t ia = str_get(b, ab, abn), ic = str_get(b, cb, cbn);
    if (abn + cbn > jcap) {
      char *bigger = realloc(joined, jcap = 2 * (abn + cbn));
      if (!bigger) return free(ab), free(cb), free(joined), zt_err_set(e, ZT_ERUNTIME, "out of memory");
      joined = bigger;
    }
    memcpy(joined, ab, abn);
    memcpy(joined + abn, cb, cbn);
    uint32_t ij = str_get(b, joined, abn + cbn);
    free(ab);
    free(cb);
    if (ia == UINT32_MAX || ic == UINT32_MAX || ij == UINT32_MAX) {
      free(joined);
      return zt_err_set(e, ZT_EINPUT, "tokenizer %s: model.merges[%zu] (\"%.*s\" + \"%.*s\") "
                        "names a token not in model.vocab", path, i, (int)an, a, (int)cn, c);
    }
    uint64_t k = ((uint64_t)ia << 32 | ic) + 1;
    size_t h = pair_slot(&b->pairs, k);
    if (!b->pairs.key[h]) { /* a repeated merge keeps its first rank, as HF does */
      b->pairs.key[h] = k;
      b->pairs.rank[h] = (uint32_t)i;
      b->pairs.id[h] = ij;
    }
  }
  free(joined);
  /* added tokens: matched whole in the text, decoded as their content */
  b->nadd = (int)json_array_size(addl);
  b->add = calloc((size_t)b->nadd + 1, sizeof *b->add);
  if (!b->add) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  b->eos = -1;
  json_array_foreach(addl, i, it) {
    json_t *c = json_object_get(it, "content");
    added *a = &b->add[i];
    a->len = json_string_length(c);
    a->s = malloc(a->len + 1);
    if (!a->s) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
    memcpy(a->s, json_string_value(c), a->len + 1);
    a->id = (uint32_t)json_integer_value(json_object_get(it, "id"));
    b->add_first[(unsigned char)a->s[0]] = 1;
    if (!b->tok[a->id]) { /* content may hold a NUL: copied by length */
      if (!(b->tok[a->id] = malloc(a->len + 1))) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
      memcpy(b->tok[a->id], a->s, a->len + 1);
      b->toklen[a->id] = (uint32_t)a->len;
    }
  }
  /* the end-of-text token: GPT-2's, LLaMA 3's, then other common names */
  static const char *const eos[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};
  for (int k = 0; k < 4 && b->eos < 0; k++)
    for (int a = 0; a < b->nadd && b->eos < 0; a++)
      if (!strcmp(b->add[a].s, eos[k])) b->eos = (int)b->add[a].id;
  return ZT_OK;
}

int zt_bpe_load(zt_bpe **out, const char *path, zt_err *e) {
  *out = NULL;
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root)
    return zt_err_set(e, ZT_EINPUT, "tokenizer %s: not valid JSON (line %d: %s)", path, je.line, je.text);
  zt_bpe *b = calloc(1, sizeof *b);
  int rc = b ? ZT_OK : zt_err_set(e, ZT_ERUNTIME, "out of memory");
  json_t *model = json_object_get(root, "model"), *norm = json_object_get(root, "normalizer");
  json_t *pt = json_object_get(root, "pre_tokenizer"), *addl = json_object_get(root, "added_tokens");
  if (!rc && !json_is_object(model))
    rc = zt_err_set(e, ZT_EINPUT, "tokenizer %s: JSON without a \"model\": not a Hugging Face "
                    "tokenizer.json", path);
  if (!rc && norm && !json_is_null(norm)) rc = read_norm(b, norm, path, e);
  if (!rc && pt && !json_is_null(pt)) rc = read_pretok(b, pt, path, e);
  if (!rc && addl && !json_is_array(addl)) rc = refuse(e, path, "added_tokens", "that is not an array");
  if (!rc) rc = read_model(b, model, addl, path, e);
  /* ByteLevel maps bytes to its alphabet last: stages after it would see
   * that alphabet, which ztrain never builds; without it BPE sees raw text */
  if (!rc && (!b->nst || !b->st[b->nst - 1].byte_level))
    rc = refuse(e, path, "pre_tokenizer", b->nst ? "that does not end with ByteLevel"
                                                 : "without ByteLevel (not byte-level BPE)");
  if (!rc && (!(b->md = pcre2_match_data_create(4, NULL)) ||
              !(b->cache = calloc(CACHE_SLOTS, sizeof *b->cache))))
    rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  json_decref(root);
  if (rc) zt_bpe_free(b);
  else *out = b;
  return rc;
}

void zt_bpe_free(zt_bpe *b) {
  if (!b) return;
  for (int i = 0; b->tok && i < b->vocab; i++) free(b->tok[i]);
  free(b->tok);
  free(b->toklen);
  free(b->strs.slot);
  free(b->pairs.key);
  free(b->pairs.rank);
  free(b->pairs.id);
  for (int i = 0; i < b->nst; i++) pcre2_code_free(b->st[i].re);
  for (int i = 0; b->add && i < b->nadd; i++) free(b->add[i].s);
  free(b->add);
  pcre2_match_data_free(b->md);
  free(b->work);
  free(b->span);
  free(b->cache);
  free(b);
}

int zt_bpe_vocab(const zt_bpe *b) { return b->vocab; }
int zt_bpe_eos(const zt_bpe *b) { return b->eos; }

int zt_bpe_cuttable(const zt_bpe *b) {
  for (int k = 0; k < b->nst; k++)
    if (b->st[k].prefix_space) return 0;
  return 1;
}

static uint32_t pair_rank(const zt_bpe *b, uint32_t l, uint32_t r, uint32_t *id) {
  uint64_t k = ((uint64_t)l << 32 | r) + 1;
  size_t h = pair_slot(&b->pairs, k);
  if (!b->pairs.key[h]) return UINT32_MAX;
  *id = b->pairs.id[h];
  return b->pairs.rank[h];
}

/* Min-heap of (rank << 32 | position): the pair to merge next is the one
 * of lowest rank, leftmost of equals. */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
  size_t i = (*n)++;
  while (i && h[(i - 1) / 2] > v) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
  h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
  uint64_t top = h[0], v = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && h[c + 1] < h[c]) c++;
    if (h[c] >= v) break;
    h[i] = h[c], i = c;
  }
  h[i] = v;
  return top;
}

/* A long piece: the same merges in O(n log n), symbols in a linked list
 * and candidate pairs in a heap; a popped pair whose symbols have changed
 * since it was pushed no longer has its rank, and is dropped. */
static int bpe_long(const zt_bpe *b, uint32_t *ids, size_t n, size_t *m) {
  int32_t *next = malloc(n * sizeof *next), *prev = malloc(n * sizeof *prev);
  uint64_t *heap = malloc(2 * n * sizeof *heap);
  if (!next || !prev || !heap) return free(next), free(prev), free(heap), -1;
  size_t hn = 0;
  uint32_t id;
  for (size_t i = 0; i < n; i++) {
    next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    prev[i] = (int32_t)i - 1;
    uint32_t r = i + 1 < n ? pair_rank(b, ids[i], ids[i + 1], &id) : UINT32_MAX;
    if (r != UINT32_MAX) heap_push(heap, &hn, (uint64_t)r << 32 | i);
  }
  while (hn) {
    uint64_t top = heap_pop(heap, &hn);
    uint32_t rank = (uint32_t)(top >> 32), at = (uint32_t)top;
    if (ids[at] == UINT32_MAX || next[at] < 0) continue; /* merged away */
    int32_t nx = next[at];
    if (pair_rank(b, ids[at], ids[nx], &id) != rank) continue; /* changed */
    ids[at] = id;
    ids[nx] = UINT32_MAX;
    next[at] = next[nx];
    if (next[nx] >= 0) prev[next[nx]] = (int32_t)at;
    uint32_t r;
    if (prev[at] >= 0 && (r = pair_rank(b, ids[prev[at]], ids[at], &id)) != UINT32_MAX)
      heap_push(heap, &hn, (uint64_t)r << 32 | (uint32_t)prev[at]);
    if (next[at] >= 0 && (r = pair_rank(b, ids[at], ids[next[at]], &id)) != UINT32_MAX)
      heap_push(heap, &hn, (uint64_t)r << 32 | at);
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (ids[i] != UINT32_MAX) ids[k++] = ids[i];
  *m = k;
  free(next);
  free(prev);
  free(heap);
  return 0;
}

/* One piece's bytes to ids: start from single bytes, then join the pair
 * of lowest merge rank (leftmost of equals) until no pair merges. Short
 * pieces (nearly all) by rescanning, long ones with a heap. */
static int bpe_piece(zt_bpe *b, const char *s, size_t n, zt_ids *out) {
  if (b->ignore_merges) { /* LLaMA 3: a piece in the vocabulary is one token */
    uint32_t id = str_get(b, s, n);
    if (id != UINT32_MAX) return zt_ids_push(out, &id, 1);
  }
  cache_entry *c = NULL;
  if (n <= CACHE_BYTES) {
    c = &b->cache[XXH3_64bits(s, n) & (CACHE_SLOTS - 1)];
    if (c->len == n && !memcmp(c->s, s, n)) return zt_ids_push(out, c->ids, c->nids);
  }
  uint32_t stack_ids[64], *ids = n <= 64 ? stack_ids : malloc(n * sizeof *ids);
  if (!ids) return -1;
  for (size_t i = 0; i < n; i++) ids[i] = b->byte_id[(unsigned char)s[i]];
  size_t m = n;
  if (n > 32) {
    if (bpe_long(b, ids, n, &m)) {
      if (ids != stack_ids) free(ids);
      return -1;
    }
  }
  while (n <= 32 && m > 1) {
    uint32_t best = UINT32_MAX, best_id = 0, id = 0;
    size_t at = 0;
    for (size_t i = 0; i + 1 < m; i++) {
      uint32_t r = pair_rank(b, ids[i], ids[i + 1], &id);
      if (r < best) best = r, best_id = id, at = i;
    }
    if (best == UINT32_MAX) break;
    ids[at] = best_id;
    memmove(ids + at + 1, ids + at + 2, (m - at - 2) * sizeof *ids);
    m--;
  }
  if (c && m <= CACHE_IDS) {
    c->len = (uint8_t)n, c->nids = (uint8_t)m;
    memcpy(c->s, s, n);
    memcpy(c->ids, ids, m * sizeof *ids);
  }
  int rc = zt_ids_push(out, ids, (int64_t)m);
  if (ids != stack_ids) free(ids);
  return rc;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 256;
  while (c < need) c *= 2;
  void *q = realloc(*p, c * elem);
  if (!q) return -1;
  *p = q;
  *cap = c;
  return 0;
}

/* Runs the pre-tokenizer stages over one stretch of text (no added
 * tokens in it) and BPE-encodes every piece. Pieces of a stage live in
 * b->work as (offset, length) pairs in b->span; each stage rewrites them. */
static int encode_stretch(zt_bpe *b, const char *s, size_t n, zt_ids *out, zt_err *e) {
  /* a stage that prefixes spaces adds at most one byte per piece, and
   * there are no more pieces than bytes: it at most doubles the text */
  size_t most = n + 1;
  for (int k = 0; k < b->nst; k++) most *= b->st[k].prefix_space ? 2 : 1;
  if (grow((void **)&b->work, &b->work_cap, 2 * most, 1) ||
      grow((void **)&b->span, &b->span_cap, 4 * (most + 1), sizeof *b->span))
    return zt_err_set(e, ZT_ERUNTIME, "out of memory pre-tokenizing %zu bytes", n);
  /* two halves of work and of span: the current stage reads one, writes the other */
  char *w[2] = {b->work, b->work + b->work_cap / 2};
  size_t *sp[2] = {b->span, b->span + b->span_cap / 2}, np = 1, cur = 0;
  memcpy(w[0], s, n);
  sp[0][0] = 0, sp[0][1] = n;
  for (int k = 0; k < b->nst; k++) {
    const stage *st = &b->st[k];
    size_t used = 0, nq = 0;
    char *dst = w[cur ^ 1];
    size_t *q = sp[cur ^ 1];
    for (size_t p = 0; p < np; p++) {
      const char *src = w[cur] + sp[cur][2 * p];
      size_t len = sp[cur][2 * p + 1], start = used;
      if (st->prefix_space && (len == 0 || src[0] != ' ')) dst[used++] = ' ';
      memcpy(dst + used, src, len);
      used += len;
      len = used - start;
      if (!st->re) {
        q[2 * nq] = start, q[2 * nq + 1] = len, nq++;
        continue;
      }
      size_t pos = 0, last = 0;
      while (pos <= len) {
        int r = pcre2_match(st->re, (PCRE2_SPTR)(dst + start), len, pos, PCRE2_NO_UTF_CHECK, b->md, NULL);
        if (r == PCRE2_ERROR_NOMATCH) break;
        if (r < 0) return zt_err_set(e, ZT_ERUNTIME, "pre-tokenizer regex failed (PCRE2 error %d)", r);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(b->md);
        if (ov[1] == ov[0]) { /* an empty match splits nothing: step one character on */
          pos = ov[0] + 1;
          while (pos < len && ((unsigned char)dst[start + pos] & 0xC0) == 0x80) pos++;
          continue;
        }
        if (ov[0] > last) q[2 * nq] = start + last, q[2 * nq + 1] = ov[0] - last, nq++;
        q[2 * nq] = start + ov[0], q[2 * nq + 1] = ov[1] - ov[0], nq++;
        last = pos = ov[1];
      }
      if (last < len) q[2 * nq] = start + last, q[2 * nq + 1] = len - last, nq++;
    }
    np = nq;
    cur ^= 1;
  }
  for (size_t p = 0; p < np; p++)
    if (sp[cur][2 * p + 1] && bpe_piece(b, w[cur] + sp[cur][2 * p], sp[cur][2 * p + 1], out))
      return zt_err_set(e, ZT_ERUNTIME, "out of memory encoding");
  return ZT_OK;
}

/* The longest added token at s (NULL if none). */
static const added *added_at(const zt_bpe *b, const char *s, size_t n) {
  const added *best = NULL;
  for (int i = 0; i < b->nadd; i++) {
    const added *a = &b->add[i];
    if (a->len <= n && (!best || a->len > best->len) && !memcmp(s, a->s, a->len)) best = a;
  }
  return best;
}

/* A stretch through the normalizers, then pre-tokenized and merged. */
static int normalize_stretch(zt_bpe *b, const char *s, size_t n, zt_ids *out, zt_err *e) {
  if (!b->nnorm) return encode_stretch(b, s, n, out, e);
  utf8proc_uint8_t *cur = NULL;
  utf8proc_ssize_t len = (utf8proc_ssize_t)n;
  for (int k = 0; k < b->nnorm; k++) {
    utf8proc_uint8_t *next = NULL;
    len = utf8proc_map(cur ? cur : (const utf8proc_uint8_t *)s, len, &next, b->norm[k]);
    free(cur);
    cur = next;
    if (len < 0)
      return zt_err_set(e, len == UTF8PROC_ERROR_NOMEM ? ZT_ERUNTIME : ZT_EINPUT,
                        "normalizing the text: %s", utf8proc_errmsg(len));
  }
  int rc = len ? encode_stretch(b, (const char *)cur, (size_t)len, out, e) : ZT_OK;
  free(cur);
  return rc;
}

int zt_bpe_encode(zt_bpe *b, const char *text, size_t n, zt_ids *out, zt_err *e) {
  size_t from = 0;
  for (size_t i = 0; i <= n; i++) {
    const added *a = i < n && b->add_first[(unsigned char)text[i]] ? added_at(b, text + i, n - i) : NULL;
    if (!a && i < n) continue;
    if (i > from) {
      int rc = normalize_stretch(b, text + from, i - from, out, e);
      if (rc) return rc;
    }
    if (!a) break;
    if (zt_ids_push(out, &a->id, 1)) return zt_err_set(e, ZT_ERUNTIME, "out of memory encoding");
    i += a->len - 1;
    from = i + 1;
  }
  return ZT_OK;
}

int zt_bpe_decode(const zt_bpe *b, const uint32_t *ids, int64_t n, char **text, size_t *len,
                  zt_err *e) {
  size_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    if (ids[i] >= (uint32_t)b->vocab || !b->tok[ids[i]])
      return zt_err_set(e, ZT_EINPUT, "token id %u at %lld is not in the tokenizer's vocabulary "
                        "(%d ids)", ids[i], (long long)i, b->vocab);
    total += b->toklen[ids[i]];
  }
  char *r = malloc(total + 1);
  if (!r) return zt_err_set(e, ZT_ERUNTIME, "out of memory decoding %lld ids", (long long)n);
  size_t k = 0;
  for (int64_t i = 0; i < n; i++) {
    memcpy(r + k, b->tok[ids[i]], b->toklen[ids[i]]);
    k += b->toklen[ids[i]];
  }
  r[k] = 0;
  *text = r;
  *len = k;
  return ZT_OK;
}
