/* tokenize: text files to a token file, behind `ztrain tokenize`. */
#ifndef ZT_TOKENIZE_H
#define ZT_TOKENIZE_H

#include <stdint.h>
#include <stdio.h>

#include "src/core/err.h"

typedef struct zt_tokenize_opts {
  const char *const *inputs; /* text files, concatenated in this order */
  int ninputs;
  const char *out;           /* token file */
  const char *val;           /* NULL, or a second token file for the last val_fraction */
  double val_fraction;
  const char *tokenizer;     /* NULL or "byte", or a tokenizer.json / SentencePiece .model */
  int train_vocab;           /* > 0: train a SentencePiece BPE vocabulary of this size */
  const char *tokenizer_out; /* where the trained model goes (NULL: tokenizer.model beside out) */
  FILE *progress;            /* progress lines (NULL: none) */
} zt_tokenize_opts;

typedef struct zt_tokenize_result {
  int64_t tokens, val_tokens;
  int vocab;
  const char *kind;        /* "byte", "hf-bpe", "sentencepiece" (static) */
  char tokenizer[4096];    /* the tokenizer used: its path, or "byte" */
} zt_tokenize_result;

/* Reads the inputs, checks they are UTF-8 (any bytes do for the byte
 * tokenizer), encodes them (the tokenizer's end-of-text id, if it has
 * one, after each file) and writes the token file(s), u16 where the
 * vocab fits, else u32. Bad input is ZT_EINPUT with nothing written. */
int zt_tokenize(const zt_tokenize_opts *o, zt_tokenize_result *r, zt_err *e);

#endif
