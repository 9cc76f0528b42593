/* tokenize: text files to token files, behind `ztrain tokenize`. Any
 * tokenizer of tokenizer.h: the byte tokenizer (each byte one token, vocab
 * 256, the default), a tokenizer.json or a SentencePiece model, or one
 * trained here on the inputs. Everything is checked before anything is
 * written, so bad input leaves no file behind. */
#include "src/data/tokenize.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/ckpt/h5util.h" /* zt_fs_check_writable */
#include "src/core/timer.h"
#include "src/data/data.h"
#include "src/data/tok_impl.h"
#include "src/data/tokenizer.h"

typedef struct {
  const char *path;
  char *text;
  size_t len;
  int mapped;
} input;

static int read_input(input *in, const char *path, zt_err *e) {
  in->path = path;
  int fd = open(path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    int rc = zt_err_set(e, ZT_EINPUT, "cannot read %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return rc;
  }
  if (!S_ISREG(st.st_mode)) { /* a pipe or device: read it through */
    size_t cap = 1 << 20;
    in->text = malloc(cap);
    ssize_t got;
    while (in->text && (got = read(fd, in->text + in->len, cap - in->len)) > 0)
      if ((in->len += (size_t)got) == cap) {
        char *b = realloc(in->text, cap *= 2);
        if (!b) free(in->text);
        in->text = b;
      }
    close(fd);
    return in->text ? ZT_OK : zt_err_set(e, ZT_ERUNTIME, "out of memory reading %s", path);
  }
  in->len = (size_t)st.st_size;
  if (in->len) {
    void *m = mmap(NULL, in->len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      close(fd);
      return zt_err_set(e, ZT_EINPUT, "cannot read %s: %s", path, strerror(errno));
    }
    madvise(m, in->len, MADV_SEQUENTIAL);
    in->text = m;
    in->mapped = 1;
  }
  close(fd);
  return ZT_OK;
}

static void free_input(input *in) {
  if (in->mapped) munmap(in->text, in->len);
  else free(in->text);
}

/* Where a piece of text may end so that encoding the pieces gives what
 * encoding the whole does: after a newline followed by printable ASCII. */
static size_t cut_at(const char *s, size_t n, size_t want) {
  for (size_t i = want; i + 1 < n; i++)
    if (s[i] == '\n' && s[i + 1] > ' ' && s[i + 1] < 0x7F) return i + 1;
  return n;
}

typedef struct {
  FILE *f;
  double start, last;
  size_t done, total;
  int tty;
} progress;

static void report(progress *p, int64_t tokens, int final) {
  if (!p->f) return;
  double now = zt_timer_now();
  if (!final && now - p->last < (p->tty ? 0.5 : 10)) return;
  p->last = now;
  double s = now - p->start;
  fprintf(p->f, "%stokenize: %.1f of %.1f MB, %lld tokens, %.1f MB/s%s", p->tty ? "\r" : "",
          p->done / 1e6, p->total / 1e6, (long long)tokens, s > 0 ? p->done / 1e6 / s : 0.0,
          p->tty && !final ? "" : "\n");
  fflush(p->f);
}

static int encode_all(zt_tok *t, input *in, int n, FILE *pf, uint32_t **ids, int64_t *count,
                      zt_err *e) {
  progress p = {.f = pf, .start = zt_timer_now(), .last = zt_timer_now(), .tty = pf && isatty(fileno(pf))};
  for (int i = 0; i < n; i++) p.total += in[i].len;
  int64_t cap = 0;
  int cut = zt_tok_cuttable(t), eos = zt_tok_eos(t), rc = ZT_OK, pieces = 0;
  const char *hook = getenv("ZT_TEST_TOKENIZE_PIECE"); /* test hook: small pieces */
  size_t piece = hook && atol(hook) > 0 ? (size_t)atol(hook) : 4 << 20;
  for (int i = 0; i < n && !rc; i++) {
    size_t at = 0;
    while (at < in[i].len && !rc) {
      /* 4 MB pieces where that changes nothing, so that progress shows */
      size_t end = cut ? at + cut_at(in[i].text + at, in[i].len - at, piece) : in[i].len;
      pieces++;
      rc = zt_tok_encode_append(t, in[i].text + at, end - at, ids, count, &cap, e);
      p.done += end - at;
      at = end;
      report(&p, *count, 0);
    }
    if (!rc && eos >= 0) {
      uint32_t id = (uint32_t)eos;
      zt_ids a = {*ids, *count, cap};
      if (zt_ids_push(&a, &id, 1)) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
      *ids = a.v, *count = a.n, cap = a.cap;
    }
    if (rc && rc != ZT_ERUNTIME) {
      char msg[sizeof e->msg];
      snprintf(msg, sizeof msg, "%s", e->msg);
      zt_err_set(e, rc, "%s: %s", in[i].path, msg);
    }
  }
  if (!rc && pieces > 1) report(&p, *count, 1);
  return rc;
}

int zt_tokenize(const zt_tokenize_opts *o, zt_tokenize_result *r, zt_err *e) {
  memset(r, 0, sizeof *r);
  if (o->val && !(o->val_fraction > 0 && o->val_fraction < 1))
    return zt_err_set(e, ZT_EINPUT, "--val-fraction must be in (0, 1), got %g", o->val_fraction);
  if (o->train_vocab && o->tokenizer && strcmp(o->tokenizer, "byte"))
    return zt_err_set(e, ZT_EINPUT, "--train-vocab trains a tokenizer, --tokenizer names one: "
                      "give one of them");
  int byte = !o->train_vocab && (!o->tokenizer || !strcmp(o->tokenizer, "byte"));
  /* every output's folder before any work: training may take a while */
  char model[4096] = "", tmp[4200] = "";
  if (o->train_vocab) {
    if (o->tokenizer_out) snprintf(model, sizeof model, "%s", o->tokenizer_out);
    else {
      char dir[4096];
      snprintf(dir, sizeof dir, "%s", o->out);
      snprintf(model, sizeof model, "%s/tokenizer.model", dirname(dir));
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", model, (int)getpid());
  }
  int rc = zt_fs_check_writable("OUTPUT", o->out, e);
  if (!rc && o->val) rc = zt_fs_check_writable("--val", o->val, e);
  if (!rc && *model) rc = zt_fs_check_writable("--tokenizer-out", model, e);
  zt_tok *t = NULL;
  if (!rc && !o->train_vocab) rc = zt_tok_open(&t, o->tokenizer, e);
  input *in = calloc((size_t)o->ninputs + 1, sizeof *in);
  if (!rc && !in) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  for (int i = 0; i < o->ninputs && !rc; i++) {
    rc = read_input(&in[i], o->inputs[i], e);
    size_t bad;
    if (!rc && !byte && zt_utf8_check(in[i].text, in[i].len, &bad))
      rc = zt_err_set(e, ZT_EINPUT, "%s is not UTF-8: bad byte 0x%02X at offset %zu (the "
                      "byte tokenizer takes any bytes; a text tokenizer needs UTF-8)",
                      o->inputs[i], (unsigned char)in[i].text[bad], bad);
  }
  /* a trained model goes to a temporary name, renamed once the tokens are written */
  if (!rc && o->train_vocab) {
    const char **texts = malloc(((size_t)o->ninputs + 1) * sizeof *texts);
    size_t *lens = malloc(((size_t)o->ninputs + 1) * sizeof *lens);
    for (int i = 0; texts && lens && i < o->ninputs; i++) texts[i] = in[i].text, lens[i] = in[i].len;
    if (o->progress) fprintf(o->progress, "tokenize: training a BPE vocabulary of %d (SentencePiece)\n", o->train_vocab);
    rc = texts && lens ? zt_tok_train(texts, lens, o->ninputs, o->train_vocab, tmp, e)
                       : zt_err_set(e, ZT_ERUNTIME, "out of memory");
    free(texts);
    free(lens);
    if (!rc) rc = zt_tok_open(&t, tmp, e);
  }
  uint32_t *ids = NULL;
  int64_t n = 0;
  if (!rc) rc = encode_all(t, in, o->ninputs, o->progress, &ids, &n, e);
  for (int i = 0; in && i < o->ninputs; i++) free_input(&in[i]);
  free(in);
  if (!rc) {
    int vocab = zt_tok_vocab(t), width = vocab <= 65536 ? 2 : 4;
    int64_t ntrain = o->val ? (int64_t)((double)n * (1 - o->val_fraction)) : n;
    rc = zt_tokens_write(o->out, ids, ntrain, width, (uint32_t)vocab, e);
    if (!rc && o->val) {
      rc = zt_tokens_write(o->val, ids + ntrain, n - ntrain, width, (uint32_t)vocab, e);
      if (rc) unlink(o->out); /* all or nothing */
    }
    if (!rc && *tmp && rename(tmp, model)) {
      rc = zt_err_set(e, ZT_ERUNTIME, "cannot write %s: %s", model, strerror(errno));
      unlink(o->out);
      if (o->val) unlink(o->val);
    }
    r->tokens = ntrain;
    r->val_tokens = n - ntrain;
    r->vocab = vocab;
    r->kind = zt_tok_kind(t);
    snprintf(r->tokenizer, sizeof r->tokenizer, "%s",
             *tmp ? model : o->tokenizer ? o->tokenizer : "byte");
  }
  if (*tmp) unlink(tmp); /* gone already after the rename */
  free(ids);
  zt_tok_free(t);
  return rc;
}

int zt_tokenize_text(const char *in, const char *out, const char *val_path,
                     double val_fraction, zt_err *e) {
  const char *inputs[1] = {in};
  zt_tokenize_opts o = {.inputs = inputs, .ninputs = 1, .out = out, .val = val_path,
                        .val_fraction = val_fraction};
  zt_tokenize_result r;
  return zt_tokenize(&o, &r, e);
}
