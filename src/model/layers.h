/* layers (internal to src/model): the passes of the embedding, one block
 * and the head over the activations of one slot, with tensor and sequence
 * parallelism inside. Backward comes whole or split: B computes only the
 * input gradient and saves in the slot what W needs for the weight
 * gradients (zero-bubble schedules). model.c strings these together into
 * chunks and calls the unit hooks around them. */
#ifndef ZT_MODEL_LAYERS_H
#define ZT_MODEL_LAYERS_H

#include "src/model/model.h"

/* res[0] of the slot = the embedding of s->tokens. */
void zt_layers_embed_fwd(zt_model *m, zt_slot *s);
/* Embedding gradient from dy [N, C] (all rows). */
void zt_layers_embed_wgrad(zt_model *m, zt_slot *s, const void *dy);

/* Block l, the i-th of its chunk: res[i] -> res[i + 1]. recompute: only
 * the activations backward reads, again (same values, bit for bit): the
 * last layer, whose output is res[i + 1], is left out. */
void zt_layers_block_fwd(zt_model *m, zt_slot *s, int i, int l, int recompute);
/* m->dres: d res[i + 1] -> d res[i]. */
void zt_layers_block_bwd(zt_model *m, zt_slot *s, int i, int l, int input_only);
void zt_layers_block_wgrad(zt_model *m, zt_slot *s, int i, int l);

/* Final norm, head and loss of res[nb]; returns the loss sum. */
double zt_layers_head_fwd(zt_model *m, zt_slot *s, int nb, float dscale);
/* From the slot's dlogits: m->dres = d res[nb] (set, not added). */
void zt_layers_head_bwd(zt_model *m, zt_slot *s, int nb, int input_only);
void zt_layers_head_wgrad(zt_model *m, zt_slot *s);

/* All N rows of a residual-stream tensor [Ns, C] (sequence parallelism:
 * gathered into scratch). */
const void *zt_layers_rows_all(zt_model *m, const void *x);

#endif
