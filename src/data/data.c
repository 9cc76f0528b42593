/* data: token files (mapped, validated once at open), lists of them as one
 * stream, what a data key opens, and the sample order. */
#include "src/data/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/core/rng.h"

static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static uint32_t token_at(const zt_tokens *t, int64_t i) {
  const uint8_t *p = t->data + i * t->width;
  return t->width == 2 ? (uint32_t)(p[0] | p[1] << 8) : rd32(p);
}

/* zt_tokens_open without cleanup: on error, t may hold a mapping. */
static int open_tokens(zt_tokens *t, const char *path, int token_bytes, int seq,
                       int vocab, zt_err *e) {
  t->seq = seq;
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return zt_err_set(e, ZT_EINPUT, "data file %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    close(fd);
    return zt_err_set(e, ZT_EINPUT, "data file %s: not a regular file", path);
  }
  t->map_len = (size_t)st.st_size;
  if (t->map_len) {
    t->map = mmap(NULL, t->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (t->map == MAP_FAILED) {
      close(fd);
      t->map = NULL;
      return zt_err_set(e, ZT_EINPUT, "data file %s: cannot map: %s", path,
                        strerror(errno));
    }
  }
  close(fd);
  t->path = strdup(path);
  const uint8_t *b = t->map;
  size_t body = t->map_len;
  t->width = token_bytes;
  t->data = b;
  if (t->map_len >= 8 && !memcmp(b, ZT_TOKENS_MAGIC, 8)) {
    if (t->map_len < ZT_TOKENS_HEADER)
      return zt_err_set(e, ZT_EINPUT, "data file %s: header truncated (%zu of %d bytes)",
                        path, t->map_len, ZT_TOKENS_HEADER);
    uint32_t ver = rd32(b + 8), width = rd32(b + 12);
    uint64_t count = rd32(b + 16) | (uint64_t)rd32(b + 20) << 32;
    if (ver != 1)
      return zt_err_set(e, ZT_EINPUT, "data file %s: header version %u, this ztrain reads version 1",
                        path, ver);
    if (width != 2 && width != 4)
      return zt_err_set(e, ZT_EINPUT, "data file %s: token width %u bytes; must be 2 or 4",
                        path, width);
    t->width = (int)width;
    t->data = b + ZT_TOKENS_HEADER;
    body = t->map_len - ZT_TOKENS_HEADER;
    if (count > body / width)
      return zt_err_set(e, ZT_EINPUT,
                        "data file %s: header says %llu tokens but only %zu "
                        "bytes follow (file truncated?)",
                        path, (unsigned long long)count, body);
    body = count * width;
  } else if (body % (size_t)t->width) {
    return zt_err_set(e, ZT_EINPUT,
                      "data file %s: %zu bytes is not a whole number of %d-byte "
                      "tokens (wrong data.dtype?)", path, body, t->width);
  }
  t->count = (int64_t)(body / (size_t)t->width);
  if (seq > 0 && t->count < (int64_t)seq + 1) /* seq 0: a member of a list */
    return zt_err_set(e, ZT_EINPUT,
                      "data file %s holds %lld tokens; seq %d needs at least "
                      "%d (seq+1) for one sample: use a smaller seq or more data",
                      path, (long long)t->count, seq, seq + 1);
  t->samples = seq > 0 ? (t->count - 1) / seq : 0;
  for (int64_t i = 0; i < t->count; i++) {
    uint32_t v = token_at(t, i);
    if (v >= (uint32_t)vocab)
      return zt_err_set(e, ZT_EINPUT,
                        "data file %s: token %u at index %lld (byte offset "
                        "%lld) is out of range for vocab %d",
                        path, v, (long long)i,
                        (long long)((t->data - b) + i * t->width), vocab);
  }
  return ZT_OK;
}

/* The pieces of a single flat file: one run, none when it is empty. */
static int flat_pieces(zt_tokens *t, zt_err *e) {
  if (!t->count) return ZT_OK;
  t->pieces = malloc(sizeof *t->pieces);
  if (!t->pieces) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  t->pieces[0] = (zt_piece){.data = t->data, .start = 0, .count = t->count, .width = t->width};
  t->npieces = 1;
  return ZT_OK;
}

static uint32_t piece_token(const zt_piece *p, int64_t j) {
  const uint8_t *b = p->data + j * p->width;
  uint64_t v = 0;
  for (int k = 0; k < p->width; k++) v |= (uint64_t)b[k] << (8 * k);
  if (p->is_signed && p->width < 8 && (v >> (8 * p->width - 1) & 1)) return UINT32_MAX;
  if (p->is_signed && p->width == 8 && (v >> 63)) return UINT32_MAX;
  return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v; /* negative or huge: out of any vocab */
}

/* The piece that holds stream position i (0 <= i < count). */
static int64_t piece_of(const zt_tokens *t, int64_t i) {
  int64_t lo = 0, hi = t->npieces - 1;
  while (lo < hi) {
    int64_t mid = (lo + hi + 1) / 2;
    if (t->pieces[mid].start <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

uint32_t zt_tokens_at(const zt_tokens *t, int64_t i) {
  if (t->data) return token_at(t, i);
  const zt_piece *p = &t->pieces[piece_of(t, i)];
  return piece_token(p, i - p->start);
}

/* n tokens from stream position i on: one search, then a walk. */
static void tokens_read(const zt_tokens *t, int64_t i, int n, int32_t *out) {
  if (t->data) {
    for (int j = 0; j < n; j++) out[j] = (int32_t)token_at(t, i + j);
    return;
  }
  int64_t k = piece_of(t, i);
  for (int j = 0; j < n; j++, i++) {
    while (i >= t->pieces[k].start + t->pieces[k].count) k++;
    out[j] = (int32_t)piece_token(&t->pieces[k], i - t->pieces[k].start);
  }
}

static int check_vocab(const zt_tokens *t, int vocab, zt_err *e) {
  for (int64_t k = 0; k < t->npieces; k++) {
    const zt_piece *p = &t->pieces[k];
    for (int64_t j = 0; j < p->count; j++) {
      uint32_t v = piece_token(p, j);
      if (v >= (uint32_t)vocab)
        return zt_err_set(e, ZT_EINPUT,
                          "data file %s: token %s%u at index %lld (byte offset %lld) is out "
                          "of range for vocab %d", t->path,
                          v == UINT32_MAX ? "value beyond " : "", v, (long long)(p->start + j),
                          (long long)(p->data + j * p->width - (const uint8_t *)t->map), vocab);
    }
  }
  return ZT_OK;
}

static int need_sample(const zt_tokens *t, const char *what, int seq, zt_err *e) {
  if (t->count < (int64_t)seq + 1)
    return zt_err_set(e, ZT_EINPUT,
                      "%s %s %lld tokens; seq %d needs at least %d (seq+1) for one sample: "
                      "use a smaller seq or more data", what, t->nfiles ? "hold" : "holds",
                      (long long)t->count, seq, seq + 1);
  return ZT_OK;
}

int zt_tokens_open(zt_tokens *t, const char *path, int token_bytes, int seq,
                   int vocab, zt_err *e) {
  memset(t, 0, sizeof *t);
  char prefix[4096];
  int rc;
  if (zt_megatron_prefix(path, prefix, sizeof prefix)) {
    t->seq = seq;
    rc = zt_megatron_open(t, prefix, e);
    if (!rc) rc = check_vocab(t, vocab, e);
    if (!rc && seq > 0) {
      char what[4200];
      snprintf(what, sizeof what, "data file %s", t->path);
      rc = need_sample(t, what, seq, e);
      if (!rc) t->samples = (t->count - 1) / seq;
    }
  } else {
    rc = open_tokens(t, path, token_bytes, seq, vocab, e);
    if (!rc) rc = flat_pieces(t, e);
  }
  if (rc) zt_tokens_close(t); /* a failed open holds nothing */
  return rc;
}

int zt_tokens_open_list(zt_tokens *t, char *const *paths, int n, int token_bytes,
                        int seq, int vocab, zt_err *e) {
  if (n == 1) return zt_tokens_open(t, paths[0], token_bytes, seq, vocab, e);
  memset(t, 0, sizeof *t);
  t->seq = seq;
  t->files = calloc((size_t)n, sizeof *t->files);
  t->path = strdup(paths[0]);
  if (!t->files || !t->path) {
    zt_tokens_close(t);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  }
  int rc = ZT_OK;
  int64_t npieces = 0;
  for (int i = 0; i < n && !rc; i++, t->nfiles++) {
    rc = zt_tokens_open(&t->files[i], paths[i], token_bytes, 0, vocab, e);
    npieces += t->files[i].npieces;
  }
  if (!rc && !(t->pieces = malloc((size_t)(npieces ? npieces : 1) * sizeof *t->pieces)))
    rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  for (int i = 0; !rc && i < n; i++) /* back to back: starts shift by what came before */
    for (int64_t k = 0; k < t->files[i].npieces; k++) {
      zt_piece p = t->files[i].pieces[k];
      p.start = t->count;
      t->count += p.count;
      t->pieces[t->npieces++] = p;
    }
  if (!rc) {
    t->width = t->files[0].width;
    char what[4300];
    snprintf(what, sizeof what, "the %d data files %s .. %s", n, paths[0], paths[n - 1]);
    rc = need_sample(t, what, seq, e);
    t->samples = rc ? 0 : (t->count - 1) / seq;
  }
  if (rc) zt_tokens_close(t);
  return rc;
}

void zt_tokens_close(zt_tokens *t) {
  for (int i = 0; i < t->nfiles; i++) zt_tokens_close(&t->files[i]);
  free(t->files);
  free(t->pieces);
  if (t->idx_map) munmap(t->idx_map, t->idx_len);
  if (t->map) munmap(t->map, t->map_len);
  free(t->path);
  memset(t, 0, sizeof *t);
}

int zt_tokens_write(const char *path, const uint32_t *tokens, int64_t count,
                    int token_bytes, uint32_t vocab, zt_err *e) {
  size_t plen = strlen(path) + 32;
  char *tmp = malloc(plen);
  snprintf(tmp, plen, "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    int rc = zt_err_set(e, ZT_EINPUT, "cannot write %s: %s", tmp, strerror(errno));
    free(tmp);
    return rc;
  }
  uint8_t h[ZT_TOKENS_HEADER] = {0};
  memcpy(h, ZT_TOKENS_MAGIC, 8);
  uint32_t fields[] = {1, (uint32_t)token_bytes, (uint32_t)count,
                       (uint32_t)((uint64_t)count >> 32), vocab};
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 4; j++) h[8 + 4 * i + j] = (uint8_t)(fields[i] >> (8 * j));
  int ok = fwrite(h, 1, sizeof h, f) == sizeof h;
  for (int64_t i = 0; ok && i < count; i++) {
    uint8_t b[4] = {(uint8_t)tokens[i], (uint8_t)(tokens[i] >> 8),
                    (uint8_t)(tokens[i] >> 16), (uint8_t)(tokens[i] >> 24)};
    ok = fwrite(b, 1, (size_t)token_bytes, f) == (size_t)token_bytes;
  }
  ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path)) {
    int rc = zt_err_set(e, ZT_ERUNTIME, "writing %s failed: %s", path, strerror(errno));
    unlink(tmp);
    free(tmp);
    return rc;
  }
  free(tmp);
  return ZT_OK;
}

int zt_loader_init(zt_loader *ld, const zt_tokens *tok, int shuffle,
                   uint64_t seed, zt_err *e) {
  memset(ld, 0, sizeof *ld);
  ld->tok = tok;
  ld->shuffle = shuffle;
  ld->seed = seed;
  ld->epoch = -1;
  if (shuffle) {
    ld->perm = malloc((size_t)tok->samples * sizeof *ld->perm);
    if (!ld->perm)
      return zt_err_set(e, ZT_ERUNTIME, "out of memory for a permutation of %lld samples",
                        (long long)tok->samples);
  }
  return ZT_OK;
}

void zt_loader_free(zt_loader *ld) {
  for (int c = 0; c < ld->nparts; c++) zt_loader_free(&ld->parts[c]);
  free(ld->parts);
  free(ld->blend_count);
  free(ld->snap_count);
  free(ld->perm);
  memset(ld, 0, sizeof *ld);
}

int64_t zt_loader_sample_at(zt_loader *ld, int64_t pos) {
  if (ld->nparts) { /* a blend: the sample's index in its part */
    int64_t at;
    int c = zt_blend_locate(ld, pos, &at);
    return zt_loader_sample_at(&ld->parts[c], at);
  }
  int64_t n = ld->tok->samples, epoch = pos / n, i = pos % n;
  if (!ld->shuffle) return i;
  if (epoch != ld->epoch) { /* Fisher-Yates from the counter-based RNG */
    char stream[48];
    snprintf(stream, sizeof stream, "data.shuffle.%lld", (long long)epoch);
    uint64_t key = zt_rng_key(ld->seed, stream);
    for (int64_t j = 0; j < n; j++) ld->perm[j] = j;
    for (int64_t j = n - 1; j > 0; j--) {
      int64_t k = (int64_t)zt_rng_below(key, (uint64_t)j, (uint64_t)j + 1);
      int64_t t = ld->perm[j];
      ld->perm[j] = ld->perm[k];
      ld->perm[k] = t;
    }
    ld->epoch = epoch;
  }
  return ld->perm[i];
}

void zt_loader_fill(zt_loader *ld, int64_t batch, int G, int first, int n,
                    int32_t *inputs, int32_t *targets) {
  if (ld->nparts) zt_blend_mark(ld, batch * G);
  for (int s = 0; s < n; s++) {
    zt_loader *from = ld;
    int64_t at = batch * G + first + s;
    if (ld->nparts) from = &ld->parts[zt_blend_locate(ld, at, &at)];
    int T = from->tok->seq;
    int64_t idx = zt_loader_sample_at(from, at);
    tokens_read(from->tok, idx * T, T, inputs + (size_t)s * T);
    tokens_read(from->tok, idx * T + 1, T, targets + (size_t)s * T);
  }
}
