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

#endif
