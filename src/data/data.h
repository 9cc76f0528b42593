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
 * batch, so the data a step sees never depends on the topology.
 *
 * A data key may name several sources: a list (files, globs, Megatron-LM
 * indexed datasets) is one token stream, the sources back to back; a blend
 * is several such streams with weights, each with its own sample order,
 * interleaved by Megatron's BlendedDataset rule (src/data/blend.c). A
 * Megatron dataset (prefix.bin + prefix.idx) is read in place
 * (src/data/megatron.c): its sequences, in index order, are the stream. */
#ifndef ZT_DATA_H
#define ZT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/err.h"

#define ZT_TOKENS_MAGIC "ZTRAINTK"
#define ZT_TOKENS_HEADER 32

/* One stream of a data key: the paths it concatenates (globs already
 * expanded, absolute) and its weight in a blend. */
typedef struct zt_data_part {
  double weight;
  int n;
  char **paths;
} zt_data_part;

/* What data.train or data.val names: one part (a file or a list) or a
 * blend of weighted parts. */
typedef struct zt_data_spec {
  int blend; /* the script gave weights */
  int n;
  zt_data_part *parts;
} zt_data_spec;

typedef struct zt_data_cfg {
  char *train, *val; /* the first path of each (messages); val may be NULL */
  zt_data_spec train_spec, val_spec; /* val_spec.n == 0: none */
  int token_bytes;   /* for headerless files: 2 (u16) or 4 (u32) */
  int shuffle;
  int val_batches; /* global batches of val data per evaluation */
  char *tokenizer; /* data.tokenizer: "byte" or an absolute path (tokenizer.h) */
} zt_data_cfg;

/* A run of consecutive tokens in one mapping; `start` is its position in
 * the stream. */
typedef struct zt_piece {
  const uint8_t *data;
  int64_t start, count;
  int width, is_signed; /* bytes per token; Megatron's i8..i64 are signed */
} zt_piece;

typedef struct zt_tokens {
  char *path;
  void *map;
  size_t map_len;
  const uint8_t *data; /* first token (a single flat file) */
  int width;           /* bytes per token */
  int64_t count, samples;
  int seq;
  /* the stream as runs, in order: one for a flat file, the merged
   * sequences of a Megatron dataset, those of every source of a list */
  zt_piece *pieces;
  int64_t npieces;
  struct zt_tokens *files; /* a list: its sources, each opened alone */
  int nfiles;
  void *idx_map; /* a Megatron dataset: the mapped .idx */
  size_t idx_len;
  int megatron;
} zt_tokens;

/* Maps a token file or a Megatron dataset (megatron.c says which paths
 * name one), checks its header, that it holds at least one sample of
 * seq+1 tokens and that every token is < vocab. On failure t holds
 * nothing (closing it is harmless). */
int zt_tokens_open(zt_tokens *t, const char *path, int token_bytes, int seq,
                   int vocab, zt_err *e);
/* The n sources back to back as one stream (n == 1: zt_tokens_open). Each
 * needs no sample of its own; the stream needs one. */
int zt_tokens_open_list(zt_tokens *t, char *const *paths, int n, int token_bytes,
                        int seq, int vocab, zt_err *e);
void zt_tokens_close(zt_tokens *t);
/* Token i of the stream. */
uint32_t zt_tokens_at(const zt_tokens *t, int64_t i);

/* megatron.c: whether `path` names a Megatron indexed dataset (path.idx
 * exists, or path ends in .idx or .bin with the other beside it); if so,
 * `prefix` receives the path without extension. */
int zt_megatron_prefix(const char *path, char *prefix, size_t size);
/* Opens prefix.idx and prefix.bin into t (pieces, count) after checking
 * the index against Megatron's format and the .bin's size; the caller
 * checks the tokens and the sample count. */
int zt_megatron_open(zt_tokens *t, const char *prefix, zt_err *e);

/* What a data key opened: one stream, or a blend of streams. */
typedef struct zt_data {
  int n;
  zt_tokens *parts;
  double *weights; /* normalised to sum 1 */
  int blend;
  int64_t samples; /* samples of one pass over every part */
} zt_data;

int zt_data_open(zt_data *d, const zt_data_spec *spec, int token_bytes, int seq,
                 int vocab, zt_err *e);
void zt_data_close(zt_data *d);

/* Writes a token file with ztrain's header, atomically (temp name + rename). */
int zt_tokens_write(const char *path, const uint32_t *tokens, int64_t count,
                    int token_bytes, uint32_t vocab, zt_err *e);

typedef struct zt_loader {
  const zt_tokens *tok;
  int shuffle;
  uint64_t seed;
  int64_t epoch; /* epoch the permutation was built for, -1 = none */
  int64_t *perm;
  /* a blend: one loader per part and where the interleaving stands */
  int nparts;
  struct zt_loader *parts;
  const double *weights;
  int64_t blend_pos;    /* positions 0..blend_pos-1 are counted in ... */
  int64_t *blend_count; /* ... samples taken from each part so far */
  int64_t snap_pos;     /* the same at the start of the batch last filled, */
  int64_t *snap_count;  /* so that a step's positions never rescan from 0 */
} zt_loader;

int zt_loader_init(zt_loader *ld, const zt_tokens *tok, int shuffle,
                   uint64_t seed, zt_err *e);
/* A loader over what a data key opened; one stream reads exactly as
 * zt_loader_init over it. */
int zt_loader_init_data(zt_loader *ld, const zt_data *d, int shuffle,
                        uint64_t seed, zt_err *e);
void zt_loader_free(zt_loader *ld);

/* Index of the sample at position `pos` of the (endless) sample order; in
 * a blend, its index within the part zt_blend_locate names. */
int64_t zt_loader_sample_at(zt_loader *ld, int64_t pos);
/* blend.c: the part that position `pos` of a blend reads, and the
 * position in that part's own order (Megatron's BlendedDataset rule:
 * each position goes to the part furthest below its share). */
int zt_blend_locate(zt_loader *ld, int64_t pos, int64_t *part_pos);
/* Advances a blend to `pos` and remembers that state (zt_loader_fill calls
 * it with the first position of the batch). */
void zt_blend_mark(zt_loader *ld, int64_t pos);

/* Fills inputs/targets [n, T] with the samples at positions
 * batch*G + first .. batch*G + first + n - 1. */
void zt_loader_fill(zt_loader *ld, int64_t batch, int G, int first, int n,
                    int32_t *inputs, int32_t *targets);

/* Byte-level tokenizer: every byte of `in` is one token (vocab 256). With
 * val_path, the last val_fraction of the text goes there. */
int zt_tokenize_text(const char *in, const char *out, const char *val_path,
                     double val_fraction, zt_err *e);

#endif
