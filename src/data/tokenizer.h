/* tokenizer: text to token ids and back, for `ztrain tokenize`, `ztrain
 * sample` and the Hugging Face export. One opaque handle over three kinds:
 *   "byte"          every byte is one token (vocab 256); the default
 *   "hf-bpe"        a Hugging Face tokenizer.json with a byte-level BPE model
 *                   (GPT-2, LLaMA 3)
 *   "sentencepiece" a SentencePiece .model (LLaMA 2)
 * A run names its tokenizer with data.tokenizer (a path, or "byte"); the
 * plan records the path and its hash, so sample and export use the same. */
#ifndef ZT_TOKENIZER_H
#define ZT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/err.h"

typedef struct zt_tok zt_tok;

/* spec: NULL or "byte" for the byte tokenizer, else a path to a
 * tokenizer.json or a SentencePiece .model (told apart by content). */
int zt_tok_open(zt_tok **t, const char *spec, zt_err *e);
void zt_tok_free(zt_tok *t);

const char *zt_tok_kind(const zt_tok *t); /* "byte", "hf-bpe", "sentencepiece" */
int zt_tok_vocab(const zt_tok *t);        /* ids are < vocab */
int zt_tok_eos(const zt_tok *t);          /* end-of-text id, -1 if none */

/* Encodes n bytes of UTF-8 text; *ids is malloc'd (caller frees). */
int zt_tok_encode(zt_tok *t, const char *text, size_t n, uint32_t **ids,
                  int64_t *count, zt_err *e);
/* Decodes n ids to UTF-8 text, NUL-terminated; *text is malloc'd. */
int zt_tok_decode(zt_tok *t, const uint32_t *ids, int64_t n, char **text,
                  size_t *len, zt_err *e);

/* Like zt_tok_encode, appending to *ids (count *count, capacity *cap,
 * grown with realloc): one buffer for many texts. */
int zt_tok_encode_append(zt_tok *t, const char *text, size_t n, uint32_t **ids,
                         int64_t *count, int64_t *cap, zt_err *e);

/* Trains a SentencePiece BPE vocabulary of `vocab` pieces (byte fallback,
 * digits split, text kept as is: LLaMA 2's recipe) on the lines of the
 * texts and writes the model to `out` (a .model file zt_tok_open reads).
 * Too small a vocab for the corpus's characters is ZT_EINPUT. */
int zt_tok_train(const char *const *texts, const size_t *lens, int ntexts, int vocab,
                 const char *out, zt_err *e);

/* 0 if the n bytes are valid UTF-8, else -1 with *bad the offset of the
 * first byte of the first bad sequence. */
int zt_utf8_check(const char *text, size_t n, size_t *bad);

/* The hash the plan records for a tokenizer file, "xxh3-64:<16 hex>"
 * ("" for the byte tokenizer). */
int zt_tok_file_hash(const char *spec, char *hex, size_t n, zt_err *e);

#endif
