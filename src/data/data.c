/* data: token files (mapped, validated once at open) and the sample order. */
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

/* A headerless file read as 16-bit tokens that holds 32-bit ones: over
 * up to 4096 pairs spread through it, every second 16-bit word (the high
 * half of a little-endian u32 below 65536) is 0 and the others are not
 * all 0. Read as u16 it would train on its tokens interleaved with zeros,
 * in silence. Returns the pairs sampled, or 0 when it does not look so. */
static int64_t looks_like_u32(const zt_tokens *t) {
  if (t->width != 2 || t->count % 2 || t->count < 16) return 0;
  int64_t pairs = t->count / 2, step = pairs > 4096 ? pairs / 4096 : 1, n = 0;
  int low = 0;
  for (int64_t p = 0; p < pairs; p += step, n++) {
    if (token_at(t, 2 * p + 1)) return 0;
    low |= token_at(t, 2 * p) != 0;
  }
  return low ? n : 0;
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
  int64_t sampled = t->data == b ? looks_like_u32(t) : 0;
  if (sampled)
    return zt_err_set(e, ZT_EINPUT,
                      "data file %s has no header and looks like 32-bit tokens: read as 16-bit "
                      "ones (data.dtype = \"u16\", the default), every second token is 0 (in all "
                      "%lld pairs sampled); set data.dtype = \"u32\"", path, (long long)sampled);
  if (t->count < (int64_t)seq + 1)
    return zt_err_set(e, ZT_EINPUT,
                      "data file %s holds %lld tokens; seq %d needs at least "
                      "%d (seq+1) for one sample: use a smaller seq or more data",
                      path, (long long)t->count, seq, seq + 1);
  t->samples = (t->count - 1) / seq;
  for (int64_t i = 0; i < t->count; i++) {
    uint32_t v = token_at(t, i);
    if (v < (uint32_t)vocab) continue;
    /* both halves in range: 16-bit tokens read as 32-bit ones */
    int u16 = t->data == b && t->width == 4 && (v & 0xffff) < (uint32_t)vocab &&
              v >> 16 < (uint32_t)vocab;
    return zt_err_set(e, ZT_EINPUT,
                      "data file %s: token %u at index %lld (byte offset "
                      "%lld) is out of range for vocab %d%s",
                      path, v, (long long)i,
                      (long long)((t->data - b) + i * t->width), vocab,
                      u16 ? " (the file has no header: 16-bit tokens, read as 32-bit ones? "
                            "data.dtype = \"u16\" reads it as two in range)" : "");
  }
  return ZT_OK;
}

int zt_tokens_open(zt_tokens *t, const char *path, int token_bytes, int seq,
                   int vocab, zt_err *e) {
  memset(t, 0, sizeof *t);
  int rc = open_tokens(t, path, token_bytes, seq, vocab, e);
  if (rc) zt_tokens_close(t); /* a failed open holds nothing */
  return rc;
}

void zt_tokens_close(zt_tokens *t) {
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
  free(ld->perm);
  memset(ld, 0, sizeof *ld);
}

int64_t zt_loader_sample_at(zt_loader *ld, int64_t pos) {
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
  const zt_tokens *t = ld->tok;
  int T = t->seq;
  for (int s = 0; s < n; s++) {
    int64_t idx = zt_loader_sample_at(ld, batch * G + first + s);
    for (int j = 0; j < T; j++) {
      inputs[(size_t)s * T + j] = (int32_t)token_at(t, idx * T + j);
      targets[(size_t)s * T + j] = (int32_t)token_at(t, idx * T + j + 1);
    }
  }
}
