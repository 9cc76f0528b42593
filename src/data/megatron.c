/* megatron: Megatron-LM's indexed dataset (MMapIndexedDataset, as
 * tools/preprocess_data.py writes it), read in place. prefix.idx, all
 * little-endian:
 *   0 char[9] "MMIDIDX\0\0"   9 u64 version (1)   17 u8 dtype code
 *   18 u64 sequence count S   26 u64 document-index count D
 *   34 i32[S] sequence lengths (tokens)   then i64[S] sequence pointers
 *   (byte offsets into prefix.bin)   then i64[D] document indices (0, then
 *   the sequence index that ends each document; the last is S); a
 *   multimodal index has i8[S] sequence modes after them, not read.
 * Dtype codes: 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16.
 * preprocess_data.py appends the end-of-document token to each document,
 * so the sequences in index order are the token stream, documents back to
 * back, as Megatron's GPTDataset concatenates them; sequences that are
 * adjacent in prefix.bin become one piece. Everything the index says is
 * checked against both files' sizes before any of it is used. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/data/data.h"

#define MEGATRON_MAGIC "MMIDIDX\0\0"
#define MEGATRON_HEADER 34

static int ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), k = strlen(tail);
  return n >= k && !strcmp(s + n - k, tail);
}

static int exists(const char *path) {
  struct stat st;
  return !stat(path, &st);
}

int zt_megatron_prefix(const char *path, char *prefix, size_t size) {
  size_t n = strlen(path);
  if (n + 5 > size) return 0;
  char other[4096];
  if (ends_with(path, ".idx")) { /* only Megatron writes .idx: even without its .bin */
    memcpy(prefix, path, n - 4);
    prefix[n - 4] = 0;
    return 1;
  }
  if (ends_with(path, ".bin") && n < sizeof other) {
    snprintf(other, sizeof other, "%.*s.idx", (int)(n - 4), path);
    if (!exists(other)) return 0; /* a flat token file */
    memcpy(prefix, path, n - 4);
    prefix[n - 4] = 0;
    return 1;
  }
  if (n + 5 > sizeof other || exists(path)) return 0;
  snprintf(other, sizeof other, "%s.idx", path);
  if (!exists(other)) return 0;
  memcpy(prefix, path, n + 1);
  return 1;
}

static uint64_t rd64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static int map_file(const char *path, void **map, size_t *len, zt_err *e) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return zt_err_set(e, ZT_EINPUT, "data file %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    close(fd);
    return zt_err_set(e, ZT_EINPUT, "data file %s: not a regular file", path);
  }
  *len = (size_t)st.st_size;
  *map = NULL;
  if (*len) {
    void *m = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      close(fd);
      return zt_err_set(e, ZT_EINPUT, "data file %s: cannot map: %s", path, strerror(errno));
    }
    *map = m;
  }
  close(fd);
  return ZT_OK;
}

/* Bytes and signedness of a dtype code; 0 for the floats and unknown codes. */
static int code_width(unsigned code, int *is_signed) {
  static const int width[] = {0, 1, 1, 2, 4, 8, 0, 0, 2};
  *is_signed = code >= 2 && code <= 5;
  return code < sizeof width / sizeof *width ? width[code] : 0;
}

int zt_megatron_open(zt_tokens *t, const char *prefix, zt_err *e) {
  size_t plen = strlen(prefix) + 5;
  char *idx = malloc(plen);
  t->path = malloc(plen);
  if (!idx || !t->path) {
    free(idx);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  }
  snprintf(idx, plen, "%s.idx", prefix);
  snprintf(t->path, plen, "%s.bin", prefix);
  t->megatron = 1;
  int rc = map_file(idx, &t->idx_map, &t->idx_len, e);
  const uint8_t *h = t->idx_map;
  size_t len = t->idx_len;
  if (rc) goto out;
  if (len < 9 || memcmp(h, MEGATRON_MAGIC, 9)) {
    rc = zt_err_set(e, ZT_EINPUT, "data file %s: not a Megatron-LM index: it does not start "
                    "with the magic bytes MMIDIDX\\0\\0 (write it with Megatron-LM's "
                    "tools/preprocess_data.py)", idx);
    goto out;
  }
  if (len < MEGATRON_HEADER) {
    rc = zt_err_set(e, ZT_EINPUT, "data file %s: index header truncated (%zu of %d bytes)", idx,
                    len, MEGATRON_HEADER);
    goto out;
  }
  uint64_t version = rd64(h + 9), S = rd64(h + 18), D = rd64(h + 26);
  unsigned code = h[17];
  int is_signed, width = code_width(code, &is_signed);
  if (version != 1) {
    rc = zt_err_set(e, ZT_EINPUT, "data file %s: index version %llu; ztrain reads Megatron-LM's "
                    "version 1", idx, (unsigned long long)version);
    goto out;
  }
  if (!width) {
    rc = zt_err_set(e, ZT_EINPUT, "data file %s: dtype code %u is not an integer token type; "
                    "ztrain reads codes 1-5 and 8 (u8, i8, i16, i32, i64, u16)", idx, code);
    goto out;
  }
  size_t body = len - MEGATRON_HEADER;
  if (S > body / 12 || D > (body - S * 12) / 8) {
    rc = zt_err_set(e, ZT_EINPUT, "data file %s: index truncated: %llu sequences and %llu "
                    "document indices need %.0f bytes after the header, the file has %zu", idx,
                    (unsigned long long)S, (unsigned long long)D,
                    12.0 * (double)S + 8.0 * (double)D,
                    body);
    goto out;
  }
  const uint8_t *lens = h + MEGATRON_HEADER, *ptrs = lens + 4 * S, *docs = ptrs + 8 * S;
  if (D < 1 || rd64(docs) != 0 || rd64(docs + 8 * (D - 1)) != S) {
    rc = zt_err_set(e, ZT_EINPUT, "data file %s: the document indices must run from 0 to the "
                    "sequence count %llu; they hold %llu entries%s", idx, (unsigned long long)S,
                    (unsigned long long)D, D ? ", first or last wrong" : "");
    goto out;
  }
  for (uint64_t d = 1; d < D; d++)
    if (rd64(docs + 8 * d) < rd64(docs + 8 * (d - 1))) {
      rc = zt_err_set(e, ZT_EINPUT, "data file %s: document index %llu (%llu) is below the one "
                      "before it (%llu)", idx, (unsigned long long)d,
                      (unsigned long long)rd64(docs + 8 * d),
                      (unsigned long long)rd64(docs + 8 * (d - 1)));
      goto out;
    }
  rc = map_file(t->path, &t->map, &t->map_len, e);
  if (rc) goto out;
  t->width = width;
  int64_t cap = 0; /* pieces grow as needed: a written dataset is one run, not S */
  for (uint64_t i = 0; i < S; i++) {
    int64_t n = (int32_t)(uint32_t)(lens[4 * i] | lens[4 * i + 1] << 8 | lens[4 * i + 2] << 16 |
                                    (uint32_t)lens[4 * i + 3] << 24);
    int64_t at = (int64_t)rd64(ptrs + 8 * i);
    if (n < 0 || at < 0 || (uint64_t)at > t->map_len ||
        (uint64_t)n > (t->map_len - (uint64_t)at) / (uint64_t)width) {
      rc = zt_err_set(e, ZT_EINPUT, "data file %s: sequence %llu (byte offset %lld, %lld tokens "
                      "of %d bytes) lies outside %s, which has %zu bytes (index and data from "
                      "different runs?)", idx, (unsigned long long)i, (long long)at,
                      (long long)n, width, t->path, t->map_len);
      goto out;
    }
    if (!n) continue;
    const uint8_t *p = (const uint8_t *)t->map + at;
    zt_piece *last = t->npieces ? &t->pieces[t->npieces - 1] : NULL;
    if (last && last->data + last->count * width == p) {
      last->count += n; /* adjacent in the file: one run */
    } else {
      if (t->npieces == cap) {
        zt_piece *grown = realloc(t->pieces, (size_t)(cap = cap ? 2 * cap : 4) * sizeof *grown);
        if (!grown) {
          rc = zt_err_set(e, ZT_ERUNTIME, "out of memory for the index of %s", idx);
          goto out;
        }
        t->pieces = grown;
      }
      t->pieces[t->npieces++] =
          (zt_piece){.data = p, .start = t->count, .count = n, .width = width,
                     .is_signed = is_signed};
    }
    t->count += n;
  }
out:
  free(idx);
  return rc;
}
