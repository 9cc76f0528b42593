/* blend: what a data key opens (one stream, or several with weights) and
 * the order of a blend. Megatron-LM's BlendedDataset gives global sample i
 * to the dataset whose realised count lags its share most: the largest
 * weight_d * max(i, 1) - count_d, the first on a tie. That rule is
 * deterministic and needs only the counts so far, so sample i of the blend
 * is a function of (weights, i) alone; within part d it is sample count_d
 * of the part's own order (its own seeded permutation per epoch). The
 * loader keeps the counts where it stands and a copy from the start of the
 * batch last filled: training reads forward, so a step costs its own
 * positions, and only a jump back (the first batch after a resume, each
 * evaluation) recounts from position 0 — a loop of a few additions per
 * position, milliseconds for millions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/rng.h"
#include "src/data/data.h"

int zt_data_open(zt_data *d, const zt_data_spec *spec, int token_bytes, int seq,
                 int vocab, zt_err *e) {
  memset(d, 0, sizeof *d);
  if (spec->n < 1) return zt_err_set(e, ZT_EINPUT, "data: no files given");
  double sum = 0;
  for (int c = 0; c < spec->n; c++) {
    double w = spec->parts[c].weight;
    if (!isfinite(w) || w < 0)
      return zt_err_set(e, ZT_EINPUT, "data: blend weight %d is %g; each must be a finite "
                        "number >= 0", c + 1, w);
    sum += w;
  }
  if (!(sum > 0) || !isfinite(sum))
    return zt_err_set(e, ZT_EINPUT, "data: the blend weights sum to %g; they must sum to a "
                      "positive finite number", sum);
  d->parts = calloc((size_t)spec->n, sizeof *d->parts);
  d->weights = calloc((size_t)spec->n, sizeof *d->weights);
  if (!d->parts || !d->weights) {
    zt_data_close(d);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  }
  d->blend = spec->blend;
  int rc = ZT_OK;
  for (int c = 0; c < spec->n && !rc; c++) {
    rc = zt_tokens_open_list(&d->parts[c], spec->parts[c].paths, spec->parts[c].n, token_bytes,
                             seq, vocab, e);
    if (!rc) {
      d->n++;
      d->weights[c] = spec->parts[c].weight / sum;
      d->samples += d->parts[c].samples;
    }
  }
  if (rc) zt_data_close(d);
  return rc;
}

void zt_data_close(zt_data *d) {
  for (int c = 0; c < d->n; c++) zt_tokens_close(&d->parts[c]);
  free(d->parts);
  free(d->weights);
  memset(d, 0, sizeof *d);
}

int zt_loader_init_data(zt_loader *ld, const zt_data *d, int shuffle, uint64_t seed,
                        zt_err *e) {
  /* one part reads as before blends existed, whatever its weight */
  if (d->n == 1) return zt_loader_init(ld, &d->parts[0], shuffle, seed, e);
  memset(ld, 0, sizeof *ld);
  ld->shuffle = shuffle;
  ld->seed = seed;
  ld->epoch = -1;
  ld->tok = &d->parts[0]; /* for its seq */
  ld->weights = d->weights;
  ld->parts = calloc((size_t)d->n, sizeof *ld->parts);
  ld->blend_count = calloc((size_t)d->n, sizeof *ld->blend_count);
  ld->snap_count = calloc((size_t)d->n, sizeof *ld->snap_count);
  if (!ld->parts || !ld->blend_count || !ld->snap_count) {
    zt_loader_free(ld);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  }
  int rc = ZT_OK;
  for (int c = 0; c < d->n && !rc; c++) {
    char stream[32];
    snprintf(stream, sizeof stream, "data.blend.%d", c);
    rc = zt_loader_init(&ld->parts[c], &d->parts[c], shuffle, zt_rng_key(seed, stream), e);
    if (!rc) ld->nparts++;
  }
  if (rc) zt_loader_free(ld);
  return rc;
}

/* Position ld->blend_pos goes to this part (the counts not yet updated). */
static int choose(const zt_loader *ld) {
  double at = (double)(ld->blend_pos > 1 ? ld->blend_pos : 1), best = -INFINITY;
  int c = 0;
  for (int d = 0; d < ld->nparts; d++) {
    double err = ld->weights[d] * at - (double)ld->blend_count[d];
    if (err > best) best = err, c = d;
  }
  return c;
}

/* Brings the counts to `pos` (positions before it counted). */
static void seek(zt_loader *ld, int64_t pos) {
  size_t bytes = (size_t)ld->nparts * sizeof *ld->blend_count;
  if (pos < ld->blend_pos) {
    if (ld->snap_pos <= pos) {
      ld->blend_pos = ld->snap_pos;
      memcpy(ld->blend_count, ld->snap_count, bytes);
    } else {
      ld->blend_pos = 0;
      memset(ld->blend_count, 0, bytes);
    }
  }
  while (ld->blend_pos < pos) {
    ld->blend_count[choose(ld)]++;
    ld->blend_pos++;
  }
}

int zt_blend_locate(zt_loader *ld, int64_t pos, int64_t *part_pos) {
  seek(ld, pos);
  int c = choose(ld);
  *part_pos = ld->blend_count[c];
  ld->blend_count[c]++;
  ld->blend_pos++;
  return c;
}

void zt_blend_mark(zt_loader *ld, int64_t pos) {
  seek(ld, pos);
  ld->snap_pos = pos;
  memcpy(ld->snap_count, ld->blend_count, (size_t)ld->nparts * sizeof *ld->snap_count);
}
