/* data: token files and the order in which training reads them.
 *
 * A token file is either ztrain's own format (a 32-byte header, then the
 * tokens) or, without the header, raw little-endian uint16 tokens (nanoGPT's
 * .bin) or uint32 with data.dtype = "u32". Header, all little-endian:
 *   0  char[8] magic "ZTRAINTK"   8 u32 version (1)   12 u32 token bytes (2|4)
 *   16 u64 token count            24 u32 vocab (0 = unknown)   28 u32 reserved
 * Sample i is tokens[i*T .. i*T+T] (inputs) and the same shifted by one
 * (targets); there are (count-1)/T samples. Global batch k holds the G
 * samples at positions k*G .. k*G+G-1 of the sample order (wrapping around),
 * which is the identity, or with shuffle a seeded permutation per epoch.
 * DP ranks and micro-batches take fixed consecutive slices of a global
 * batch, so the data a step sees never depends on the topology. */
#ifndef ZT_DATA_H
#define ZT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/err.h"

#define ZT_TOKENS_MAGIC "ZTRAINTK"
#define ZT_TOKENS_HEADER 32

typedef struct zt_data_cfg {
  char *train, *val; /* paths; val may be NULL */
  int token_bytes;   /* for headerless files: 2 (u16) or 4 (u32) */
  int shuffle;
  int val_batches; /* global batches of val data per evaluation */
  char *tokenizer; /* data.tokenizer: "byte" or an absolute path (tokenizer.h) */
} zt_data_cfg;

typedef struct zt_tokens {
  char *path;
  void *map;
  size_t map_len;
  const uint8_t *data; /* first token */
  int width;           /* bytes per token */
  int64_t count, samples;
  int seq;
} zt_tokens;

/* Maps a token file, checks its header, that it holds at least one sample
 * of seq+1 tokens and that every token is < vocab. On failure t holds
 * nothing (closing it is harmless). */
int zt_tokens_open(zt_tokens *t, const char *path, int token_bytes, int seq,
                   int vocab, zt_err *e);
void zt_tokens_close(zt_tokens *t);

/* Writes a token file with ztrain's header, atomically (temp name + rename). */
int zt_tokens_write(const char *path, const uint32_t *tokens, int64_t count,
                    int token_bytes, uint32_t vocab, zt_err *e);

typedef struct zt_loader {
  const zt_tokens *tok;
  int shuffle;
  uint64_t seed;
  int64_t epoch; /* epoch the permutation was built for, -1 = none */
  int64_t *perm;
} zt_loader;

int zt_loader_init(zt_loader *ld, const zt_tokens *tok, int shuffle,
                   uint64_t seed, zt_err *e);
void zt_loader_free(zt_loader *ld);

/* Index of the sample at position `pos` of the (endless) sample order. */
int64_t zt_loader_sample_at(zt_loader *ld, int64_t pos);

/* Fills inputs/targets [n, T] with the samples at positions
 * batch*G + first .. batch*G + first + n - 1. */
void zt_loader_fill(zt_loader *ld, int64_t batch, int G, int first, int n,
                    int32_t *inputs, int32_t *targets);

/* Byte-level tokenizer: every byte of `in` is one token (vocab 256). With
 * val_path, the last val_fraction of the text goes there. */
int zt_tokenize_text(const char *in, const char *out, const char *val_path,
                     double val_fraction, zt_err *e);

#endif
