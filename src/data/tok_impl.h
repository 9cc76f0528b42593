/* tok_impl: what tokenizer.c dispatches to, one set of functions per kind
 * (hf-bpe in tok_bpe.c, sentencepiece in tok_spm.cc). Not for use outside
 * src/data: everything else goes through tokenizer.h. */
#ifndef ZT_TOK_IMPL_H
#define ZT_TOK_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A growing array of ids that encoders append to. */
typedef struct zt_ids {
  uint32_t *v;
  int64_t n, cap;
} zt_ids;
int zt_ids_push(zt_ids *a, const uint32_t *ids, int64_t n);

/* zt_bpe_cuttable for any tokenizer: byte yes, SentencePiece no (each
 * encode starts a text with its dummy-prefix space). */
struct zt_tok;
int zt_tok_cuttable(const struct zt_tok *t);

/* Hugging Face tokenizer.json, byte-level BPE (tok_bpe.c). */
typedef struct zt_bpe zt_bpe;
int zt_bpe_load(zt_bpe **b, const char *path, zt_err *e);
void zt_bpe_free(zt_bpe *b);
int zt_bpe_vocab(const zt_bpe *b);
int zt_bpe_eos(const zt_bpe *b);
/* Whether encoding a text in pieces cut after a newline followed by a
 * printable ASCII byte gives what encoding it whole does: true unless a
 * stage prefixes a space to every stretch (add_prefix_space). */
int zt_bpe_cuttable(const zt_bpe *b);
int zt_bpe_encode(zt_bpe *b, const char *text, size_t n, zt_ids *out, zt_err *e);
int zt_bpe_decode(const zt_bpe *b, const uint32_t *ids, int64_t n, char **text, size_t *len,
                  zt_err *e);

/* SentencePiece through libsentencepiece (tok_spm.cc). Errors are written
 * to err (size errn); the functions return 0 on success, else a zt status. */
typedef struct zt_spm zt_spm;
int zt_spm_load(zt_spm **s, const char *path, char *err, size_t errn);
void zt_spm_free(zt_spm *s);
int zt_spm_vocab(const zt_spm *s);
int zt_spm_eos(const zt_spm *s);
int zt_spm_encode(zt_spm *s, const char *text, size_t n, zt_ids *out, char *err, size_t errn);
int zt_spm_decode(const zt_spm *s, const uint32_t *ids, int64_t n, char **text, size_t *len,
                  char *err, size_t errn);
/* Trains a BPE model (byte fallback) of `vocab` pieces on the texts and
 * writes the serialized model to `out` (the caller renames it in place). */
int zt_spm_train(const char *const *texts, const size_t *lens, int ntexts, int vocab,
                 const char *out, char *err, size_t errn);

#ifdef __cplusplus
}
#endif

#endif
