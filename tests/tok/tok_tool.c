/* tok_tool: tokenizer.h from the outside, for tests/tok/check_tok.py.
 *   tok_tool TOKENIZER TEXT_FILE
 * prints "kind vocab eos", the ids of the file's text on a second line and
 * the ids decoded again, in hex, on a third. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/data/tokenizer.h"

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: tok_tool TOKENIZER TEXT_FILE\n");
    return 2;
  }
  FILE *f = fopen(argv[2], "rb");
  if (!f) {
    perror(argv[2]);
    return 2;
  }
  size_t cap = 1 << 16, n = 0, got;
  char *text = malloc(cap);
  while (text && (got = fread(text + n, 1, cap - n, f)) > 0)
    if ((n += got) == cap) text = realloc(text, cap *= 2);
  fclose(f);
  zt_err e = {0};
  zt_tok *t;
  uint32_t *ids = NULL;
  int64_t m = 0;
  char *back = NULL;
  size_t blen = 0;
  int rc = zt_tok_open(&t, argv[1], &e);
  if (!rc) rc = zt_tok_encode(t, text, n, &ids, &m, &e);
  if (!rc) rc = zt_tok_decode(t, ids, m, &back, &blen, &e);
  if (rc) {
    fprintf(stderr, "tok_tool: %s\n", e.msg);
    return rc;
  }
  printf("%s %d %d\n", zt_tok_kind(t), zt_tok_vocab(t), zt_tok_eos(t));
  for (int64_t i = 0; i < m; i++) printf("%s%u", i ? " " : "", ids[i]);
  printf("\n");
  for (size_t i = 0; i < blen; i++) printf("%02x", (unsigned char)back[i]);
  printf("\n");
  free(back);
  free(ids);
  free(text);
  zt_tok_free(t);
  return 0;
}
