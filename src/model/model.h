/* model: decoder-only transformers (GPT-2 and LLaMA styles) as a list of
 * blocks with hand-written forward and backward passes over kernels.h.
 * Parameters live in one flat device buffer, gradients in a second one with
 * the same layout; each tensor is a zt_tensor_desc with its logical name and
 * shape, which is what checkpoints, the optimizer and (later) ZeRO address.
 * Activations for one micro-batch are allocated once, at init. */
#ifndef ZT_MODEL_H
#define ZT_MODEL_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "parallel/comm.h"
#include "src/core/err.h"
#include "src/core/tensor.h"

typedef enum { ZT_ARCH_GPT = 0, ZT_ARCH_LLAMA = 1 } zt_arch;

typedef struct zt_model_cfg {
  zt_arch arch;
  int vocab, seq, dim, layers, heads;
  int kv_heads; /* = heads for gpt */
  int ffn_dim;  /* MLP width: 4*dim for gpt */
  float norm_eps, rope_theta;
  int tied; /* head shares embed.tokens (gpt only) */
  /* How the model runs under TP, not what it is (no effect on parameters
   * or checkpoints): the residual stream split by rows over the TP group
   * (parallel.sequence_parallel); ignored at tp = 1. */
  int sequence_parallel;
} zt_model_cfg;

typedef enum { ZT_INIT_NORMAL, ZT_INIT_ZEROS, ZT_INIT_ONES } zt_init_kind;

typedef struct zt_param {
  zt_tensor_desc t;
  zt_init_kind init;
  float std;
} zt_param;

/* Indices into the parameter table for one block; -1 when absent. The
 * fused tensors are contiguous runs of logical tensors: qkv is q,k,v (llama)
 * or attn.qkv (gpt); fc is gate,up (llama) or mlp.up (gpt). */
typedef struct zt_block_params {
  int norm1_w, norm1_b, qkv_w, qkv_b, out_w, out_b;
  int norm2_w, norm2_b, fc_w, fc_b, down_w, down_b;
} zt_block_params;

/* Saved activations of one block for one micro-batch. */
typedef struct zt_block_acts {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *probs, *mid;
  float *ln2, *ln2_mean, *ln2_rstd, *fc, *act;
} zt_block_acts;

struct zt_model;

/* Units are the pieces a sharded optimizer (ZeRO) gathers and reduces as a
 * whole: unit 0 is the embedding, units 1..L the blocks, unit L+1 the final
 * norm and (untied) head. Each unit is a contiguous run of the flat
 * parameter buffer. The model calls `before` when it starts using a unit's
 * weights in forward or backward and `after` when it is done, so an owner
 * can gather weights just in time (unit_w) and reduce a unit's gradients as
 * soon as they are final (unit_g). A tied head uses unit 0 in the final
 * unit's phases; `before`/`after` are then called for unit 0 there too. */
typedef enum { ZT_PHASE_FWD = 0, ZT_PHASE_BWD = 1 } zt_phase;

typedef struct zt_model_hooks {
  void *ctx;
  void (*before)(void *ctx, struct zt_model *m, int unit, zt_phase phase);
  void (*after)(void *ctx, struct zt_model *m, int unit, zt_phase phase);
} zt_model_hooks;

/* Tensor parallelism (Megatron): with tp > 1 a rank holds, of each block,
 * heads/tp query heads and kv_heads/tp kv heads (q, k, v weights cut by
 * output rows: column-parallel), ffn_dim/tp of the MLP width (up and gate by
 * rows, down by input columns: row-parallel), and vocab/tp rows of the
 * embedding and head (vocab-parallel). Norms, positions and the biases of
 * row-parallel layers are whole on every rank and get identical gradients
 * there. When tp > kv_heads (llama GQA) a rank holds one kv head, kv head
 * tp_rank / kv_rep, shared by the kv_rep = tp/kv_heads consecutive ranks
 * whose query heads read it; each computes a partial gradient of it, which
 * the model sums over those ranks (the `kv` group) in each block's
 * backward, so they all end with the same, full gradient.
 * Sequence parallelism (cfg.sequence_parallel, tp > 1): the residual
 * stream, the norms and the adds hold only this rank's Ns = N/tp rows
 * (N = B*seq, rows n0 .. n0+Ns-1); all-reduces of [N, C] become a
 * reduce-scatter into the rows or an all-gather of them (model.c). The
 * norms' gradients, partial per rank, are summed over tp in backward.
 * The sizes below are this rank's; cfg keeps the logical ones. */
typedef struct zt_model {
  zt_model_cfg cfg;
  const zt_backend *be;
  zt_comm *tp;         /* tensor-parallel group; NULL = no TP */
  int tp_size, tp_rank;
  int kv_rep;          /* TP ranks sharing each local kv head (1: none) */
  zt_comm *kv;         /* those ranks (kv_rep > 1), split from tp; owned */
  int sp;              /* sequence parallelism on (and tp > 1) */
  int Ns, n0;          /* residual-stream rows held here, the first of them */
  int *sp_counts, *sp_displs; /* sp: every rank's rows of [N, C], in floats */
  int B;              /* micro-batch size the activations are sized for */
  int hd;             /* head dim */
  int heads, kv_heads; /* local query and kv heads */
  int att_dim;        /* heads * hd: width of the attention output */
  int qkv_rows;       /* rows of the local fused qkv weight */
  int fc_rows, hidden; /* rows of the local fused first MLP weight; local MLP width */
  int vocab_start, vocab_local; /* embedding / head rows held here */

  int n_params;
  zt_param *params;
  int64_t numel;   /* elements in the flat parameter buffer */
  float *w, *g;    /* device: parameters, gradients (same layout) */
  int embed_tok, embed_pos, final_w, final_b, head; /* indices, -1 if absent */
  zt_block_params *blocks;

  int n_units;
  int *param_unit;          /* unit of each parameter */
  int64_t *unit_start;      /* first element of each unit in the flat buffer */
  int64_t *unit_numel;
  float **unit_w, **unit_g; /* where each unit's weights / grads are now;
                               by default inside w and g */
  zt_model_hooks hooks;     /* optional; NULL functions = no calls */

  /* device activations and scratch */
  float *arena;
  float **res; /* residual stream: res[l] is the input of block l, [N, C] */
  zt_block_acts *acts;
  float *lnf, *lnf_mean, *lnf_rstd, *logits, *losses;
  float *xent_stats; /* [3N] for the vocab-parallel loss (kernels.h) */
  float *dres, *dln, *datt, *dqkv, *dfc, *dact, *dprobs;
  float *dkv_w; /* kv_rep > 1: [2*hd, C] k, v weight gradient of one block */
  float *dnorm; /* sp: [4, C] a unit's partial norm gradients */
  size_t act_bytes; /* activations and scratch of one micro-batch */
  float *rope_cs;
  int32_t *tokens, *targets;
  float *host_losses;
} zt_model;

/* Checks the description on its own (divisibility, ranges), before anything
 * is allocated. */
int zt_model_cfg_check(const zt_model_cfg *cfg, zt_err *e);

/* Checks that tensor parallelism over `tp` ranks divides the model: heads,
 * ffn_dim and vocab must be multiples of tp, llama's kv_heads a multiple
 * or a divisor of tp. The message names the number that fails and lists
 * the tp values that would work. */
int zt_model_tp_check(const zt_model_cfg *cfg, int tp, zt_err *e);

/* Checks that sequence parallelism can split the micro_batch*seq rows of a
 * micro-batch evenly over `tp` ranks (always true when it is off or tp is
 * 1); the message names the numbers and what would work. */
int zt_model_sp_check(const zt_model_cfg *cfg, int micro_batch, int tp, zt_err *e);

/* Builds the parameter table only (names, shapes, offsets): no memory for
 * weights or activations. Checkpoint readers and the planner use this.
 * tp_size/tp_rank select this rank's tensor-parallel shards: each
 * descriptor keeps its logical shape, says in .shard how it is cut (dim -1:
 * whole on every TP rank; else count = tp_size, even when that is 1, or
 * kv_heads for k and v replicated over kv_rep ranks) and has the local
 * element count in .numel. */
int zt_model_layout(zt_model *m, const zt_model_cfg *cfg, int tp_size,
                    int tp_rank, zt_err *e);

/* Layout plus device memory for weights, gradients and the activations of a
 * micro-batch of `micro_batch` samples. With a tp group of size > 1 the
 * rank holds its shards (layout with tp->size, tp->rank) and zt_model_step
 * runs collectives on tp; every member must call it on the same tokens.
 * With kv_rep > 1 it splits tp into the kv groups (collective over tp). */
int zt_model_init(zt_model *m, const zt_model_cfg *cfg, const zt_backend *be,
                  int micro_batch, zt_comm *tp, zt_err *e);
void zt_model_free(zt_model *m);

/* Initial values from the counter-based RNG keyed by (seed, tensor name,
 * logical element index): independent of topology, so every shard holds
 * exactly the values of its part of the tp = 1 model. */
void zt_model_init_weights(zt_model *m, uint64_t seed);

/* Runs one micro-batch: tokens/targets are host arrays [B*T]. Returns the
 * sum of per-token losses (the same on every TP rank: count it once). With
 * backward, gradients of sum(loss) * dscale are accumulated into m->g: each
 * rank's shard of the full gradient; whole tensors get the same gradient on
 * every TP rank, replicated kv heads on every rank of their kv group (no
 * reduction over tp needed). */
double zt_model_step(zt_model *m, const int32_t *tokens, const int32_t *targets,
                     int backward, float dscale);

/* Training FLOPs per token (forward + backward) of the whole logical model,
 * for MFU: with TP each rank does 1/tp of it. */
double zt_model_flops_per_token(const zt_model *m);

/* Bytes this rank has sent within its TP group so far: on tp and on the kv
 * groups inside it. */
uint64_t zt_model_tp_bytes(const zt_model *m);

/* Index of a parameter by name, or -1. */
int zt_model_find(const zt_model *m, const char *name);

#endif
