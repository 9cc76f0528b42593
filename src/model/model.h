/* model: decoder-only transformers (GPT-2 and LLaMA styles) as a list of
 * blocks with hand-written forward and backward passes over kernels.h.
 * Parameters live in one flat device buffer, gradients in a second one with
 * the same layout; each tensor is a zt_tensor_desc with its logical name and
 * shape, which is what checkpoints, the optimizer and (later) ZeRO address.
 * A rank may hold only part of the blocks (a pipeline stage, in chunks of
 * consecutive blocks); activations live in slots, one per micro-batch a
 * chunk has in flight, allocated once, at init. */
#ifndef ZT_MODEL_H
#define ZT_MODEL_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "parallel/comm.h"
#include "src/core/err.h"
#include "src/core/tensor.h"

typedef enum { ZT_ARCH_GPT = 0, ZT_ARCH_LLAMA = 1 } zt_arch;

/* The memory a rank may count on, found by whoever knows the machine and
 * the run (src/config); avail 0: no check. The memory planner (src/plan)
 * compares its estimate of the rank's peak with it before anything is
 * allocated: with overcommit a large malloc succeeds and the kernel kills
 * the process later. It is the memory the backend allocates from (host
 * memory for the CPU backend). */
typedef struct zt_mem_budget {
  double avail;     /* bytes this rank may use */
  char source[160]; /* where avail comes from, for the message */
  int dp, zero;     /* data-parallel ranks, ZeRO stage */
} zt_mem_budget;

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
  /* Activation recomputation (train.recompute), also how it runs: NULL,
   * or one flag per block; a flagged block keeps only its input and runs
   * its forward again in backward. Not owned: outlives the model. */
  const unsigned char *recompute;
  /* Mixed precision (train.precision): the dtype of activations and of the
   * weights the passes compute with (ZT_F32: 0, the default); weights are
   * kept and updated in fp32 (w), gradients are fp32. */
  zt_dtype precision;
  zt_mem_budget mem; /* what the run may allocate; not what the model is */
} zt_model_cfg;

/* What zt_model_init allocates for one rank, by purpose: zt_model_plan
 * computes it without allocating and zt_model_init allocates exactly it
 * (one source of truth for the planner). Bytes unless said otherwise. */
typedef struct zt_model_bytes {
  size_t arena;          /* the one device allocation: the three below */
  size_t acts_slots;     /* every slot: block inputs, kept blocks' activations, head, tokens */
  size_t acts_recompute; /* the one set that recomputed blocks refill (0: none recomputes) */
  size_t scratch;        /* a pass's scratch: input gradients, loss statistics, rope table */
  int kept_blocks, recomputed_blocks; /* block x slot pairs that keep / recompute */
  size_t block_kept;     /* one block's saved activations, one micro-batch */
  size_t block_input;    /* its input (all a recomputed block keeps) */
  int tied_copy;         /* a tied head on a stage without the embedding */
  int64_t tied_numel;
  size_t tied;           /* its copy: fp32 weights and gradients, 16-bit copy */
  size_t host;           /* host buffers (per-token losses, sp counts) */
} zt_model_bytes;

typedef enum { ZT_INIT_NORMAL, ZT_INIT_ZEROS, ZT_INIT_ONES } zt_init_kind;

typedef struct zt_param {
  zt_tensor_desc t;
  zt_init_kind init;
  float std;
  int here; /* this rank holds it (its pipeline stage does); else offset is -1 */
} zt_param;

/* Indices into the parameter table for one block; -1 when absent. The
 * fused tensors are contiguous runs of logical tensors: qkv is q,k,v (llama)
 * or attn.qkv (gpt); fc is gate,up (llama) or mlp.up (gpt). */
typedef struct zt_block_params {
  int norm1_w, norm1_b, qkv_w, qkv_b, out_w, out_b;
  int norm2_w, norm2_b, fc_w, fc_b, down_w, down_b;
} zt_block_params;

/* Saved activations of one block for one micro-batch: tensors in the
 * model's dtype (void *), statistics in fp32. */
typedef struct zt_block_acts {
  void *ln1, *qkv, *att, *mid, *ln2, *fc, *act;
  float *ln1_mean, *ln1_rstd, *lse /* [B, heads, T] */, *ln2_mean, *ln2_rstd;
} zt_block_acts;

/* Split backward (zero-bubble schedules): what B, which computes only the
 * input gradient, leaves for W, which computes the weight gradients: the
 * output gradient of each linear layer ([N, C] for the row-parallel ones,
 * whose gradient arrives through the residual stream) and the norms'
 * weight gradients, which come out of the norm's backward anyway. */
typedef struct zt_block_saved {
  void *dy_down, *dfc, *dy_out, *dqkv;
  float *dnorm /* [4, C] */;
} zt_block_saved;

/* The activations of one micro-batch through one chunk of blocks.
 * res[i] is the input of the chunk's i-th block ([Ns, C]), res[nb] its
 * output; res[0] is where a pipeline stage receives its input. */
typedef struct zt_slot {
  void **res;
  zt_block_acts *acts;
  zt_block_saved *saved;               /* split backward only */
  void *lnf;                           /* head chunk: final norm */
  float *lnf_mean, *lnf_rstd;
  void *logits;                        /* head chunk: logits, then dlogits */
  float *losses;
  float *dnorm_final;                  /* head chunk, split: final norm's gradients [2, C] */
  void *dy_embed;                      /* embedding chunk, split: [N, C] */
  int32_t *tokens, *targets;
} zt_slot;

/* Consecutive blocks [first, last] that a rank runs as one pipeline
 * action: virtual stage chunk*pp + stage. The embedding is part of
 * virtual stage 0, the final norm, head and loss of the last one. */
typedef struct zt_chunk {
  int first, last, embed, head;
  int n_slots;
  zt_slot *slots;
} zt_chunk;

/* What a rank runs of the model (NULL to zt_model_init: everything, one
 * chunk, one slot, as with pp = 1). */
typedef struct zt_stage_cfg {
  int n_chunks;
  const int *first, *last; /* blocks of each chunk */
  const int *slots;        /* micro-batches each chunk holds at once */
  int embed, head;         /* chunk 0 is virtual stage 0 / the last chunk the last one */
  int split;               /* the schedule splits backward into B and W */
} zt_stage_cfg;

struct zt_model;

/* Units are the pieces a sharded optimizer (ZeRO) gathers and reduces as a
 * whole: unit 0 is the embedding, units 1..L the blocks, unit L+1 the final
 * norm and (untied) head. Each unit is a contiguous run of the flat
 * parameter buffer. The model calls `before` when it starts using a unit's
 * weights in forward or backward and `after` when it is done, so an owner
 * can gather weights just in time (unit_w) and reduce a unit's gradients as
 * soon as they are final (unit_g). A tied head uses unit 0 in the final
 * unit's phases; `before`/`after` are then called for unit 0 there too. */
typedef enum {
  ZT_PHASE_FWD = 0,
  ZT_PHASE_BWD = 1,        /* whole backward: weights and gradients */
  ZT_PHASE_BWD_INPUT = 2,  /* split backward's B: weights only */
  ZT_PHASE_BWD_WEIGHT = 3  /* split backward's W: gradients only */
} zt_phase;

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

  zt_stream *stream; /* the passes' work, in order (kernels.h) */
  zt_dtype dt;       /* activations and the weights computed with */

  int n_params;
  zt_param *params; /* every tensor of the model; .here: held by this rank */
  int64_t numel;   /* elements in this rank's flat parameter buffer (the
                      weights and gradients are not the model's: the ZeRO
                      engine, or zt_model_bind, lends them per unit) */
  int embed_tok, embed_pos, final_w, final_b, head; /* indices, -1 if absent */
  zt_block_params *blocks;

  int n_units;
  int *param_unit;          /* unit of each parameter */
  int64_t *unit_start;      /* first element of each unit in the flat buffer */
  int64_t *unit_numel;
  void **unit_w;            /* where each unit's compute weights (dt) are now */
  float **unit_g;           /* and its gradients (fp32): set by the hooks or zt_model_bind */
  zt_model_hooks hooks;     /* optional; NULL functions = no calls */

  /* pipeline: this rank's chunks; a tied head on a stage without the
   * embedding uses a copy of embed.tokens (tied_w, with its gradient
   * tied_g), which the trainer keeps equal to the original */
  int n_chunks, split;
  zt_chunk *chunks;
  float *tied_w, *tied_g;
  void *tied_wc; /* tied_w in dt (tied_w itself in fp32) */

  /* device activations (in the chunks' slots) and scratch */
  float *arena;
  zt_block_acts racts; /* the activations recomputed blocks share (in arena) */
  float *xent_stats; /* [3N] for the vocab-parallel loss (kernels.h) */
  void *dres, *dln, *datt, *dqkv, *dfc, *dact; /* dt */
  float *dkv_w; /* kv_rep > 1: [2*hd, C] k, v weight gradient of one block */
  float *dnorm; /* sp: [4, C] a unit's partial norm gradients */
  size_t act_bytes; /* the arena: every slot's activations and a pass's scratch */
  zt_model_bytes bytes; /* what zt_model_plan counted */
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

/* What zt_model_init would build for TP rank tp_rank of tp_size, without
 * memory for activations, states or communication: the parameter table,
 * the chunks and units, and m->bytes, the bytes zt_model_init allocates
 * (it calls this). The planner's way to know a rank's model; free with
 * zt_model_free. */
int zt_model_plan(zt_model *m, const zt_model_cfg *cfg, const zt_backend *be, int micro_batch,
                  int tp_size, int tp_rank, const zt_stage_cfg *stage, zt_err *e);

/* Layout plus device memory for the activations of micro-batches of
 * `micro_batch` samples (and a tied head's copy of the embedding); the
 * weights and gradients come from their owner (zt_model_bind, hooks). With a tp group of size > 1 the
 * rank holds its shards (layout with tp->size, tp->rank) and the passes
 * run collectives on tp; every member must call them on the same tokens.
 * With kv_rep > 1 it splits tp into the kv groups (collective over tp).
 * `stage` selects the blocks this rank runs and its slots (NULL: all). The
 * parameter table still lists every tensor (checkpoints name them all);
 * the flat layout (numel) holds only the units of the chunks here. */
int zt_model_init(zt_model *m, const zt_model_cfg *cfg, const zt_backend *be,
                  int micro_batch, zt_comm *tp, const zt_stage_cfg *stage, zt_err *e);
void zt_model_free(zt_model *m);

/* Initial values of flat elements [lo, hi) of this rank's fp32 weights
 * into dst (element lo at dst[0]; device memory), from the counter-based
 * RNG keyed by (seed, tensor name, logical element index): independent of
 * topology, so every shard holds exactly the values of its part of the
 * tp = 1 model, and any part of the flat buffer can be made alone (a ZeRO-3
 * shard). ZT_OK, or ZT_ERUNTIME when out of memory. */
int zt_model_init_weights(const zt_model *m, uint64_t seed, float *dst, int64_t lo, int64_t hi,
                          zt_err *e);

/* For a model used without an owner of its states (tests, tools): the
 * passes compute with w (the whole flat buffer, in dt) and accumulate the
 * gradients into g (fp32); hooks still override them per unit. */
void zt_model_bind(zt_model *m, void *w, float *g);

/* Runs one micro-batch through the whole model (pp = 1): tokens/targets
 * are host arrays [B*T]. Returns the sum of per-token losses (the same on
 * every TP rank: count it once). With backward, gradients of
 * sum(loss) * dscale are accumulated into the units' gradients: each rank's shard of the
 * full gradient; whole tensors get the same gradient on every TP rank,
 * replicated kv heads on every rank of their kv group (no reduction over
 * tp needed). */
double zt_model_step(zt_model *m, const int32_t *tokens, const int32_t *targets,
                     int backward, float dscale);

/* The pieces a pipeline executor runs, per chunk c and slot s.
 * Forward: the embedding chunk reads `tokens`, any other chunk its input,
 * which the caller has put in zt_model_input(m, c, s); the head chunk
 * reads `targets`, computes the loss and (dscale != 0) the gradient of
 * sum(loss) * dscale, and returns the sum of per-token losses (other
 * chunks return 0 and leave their output in zt_model_output). */
double zt_model_fwd(zt_model *m, int c, int s, const int32_t *tokens,
                    const int32_t *targets, float dscale);
/* Backward of the forward in slot s: for all but the head chunk the caller
 * first puts the gradient of the chunk's output in m->dres ([Ns, C]); on
 * return m->dres holds the gradient of its input (embedding chunk: none).
 * input_only (split schedules): the weight gradients are left to
 * zt_model_wgrad, which must then run before the slot is reused. */
void zt_model_bwd(zt_model *m, int c, int s, int input_only);
void zt_model_wgrad(zt_model *m, int c, int s);
void *zt_model_input(zt_model *m, int c, int s);
const void *zt_model_output(const zt_model *m, int c, int s);

/* A tied head's copy computed with made equal to the fp32 one, rounded
 * (tied_wc from tied_w), after it changed. Nothing in fp32. */
void zt_model_sync_tied(zt_model *m);

/* Bytes of the model's own states: a tied head's copy of the embedding
 * (fp32 weights and gradients, and the 16-bit copy). The rest is the ZeRO
 * engine's. */
int64_t zt_model_state_bytes(const zt_model *m);

/* Bytes of backend scratch this rank's GEMMs keep (zt_backend.gemm_scratch),
 * known from the shapes before anything runs: the passes call GEMMs from
 * one thread, which keeps the largest one's. */
int64_t zt_model_gemm_scratch(const zt_model *m);

/* Training FLOPs per token (forward + backward) of the whole logical model,
 * for MFU: with TP each rank does 1/tp of it. */
double zt_model_flops_per_token(const zt_model *m);
/* The same from the description alone (hd = dim / heads), for the planner. */
double zt_model_cfg_flops_per_token(const zt_model_cfg *c);

/* Bytes this rank has sent within its TP group so far: on tp and on the kv
 * groups inside it. */
uint64_t zt_model_tp_bytes(const zt_model *m);

/* Rotary tables (llama) of positions t0 .. t0 + n - 1 into host cs:
 * cos then sin, [n, hd/2] each, freq_i = theta^(-2i/hd), angle =
 * position * freq_i in double, rounded once: what rope_fwd reads (the
 * passes' table is positions 0 .. seq - 1; decoding takes its rows). */
void zt_model_rope_rows(const zt_model *m, int t0, int n, float *cs);

/* Index of a parameter by name, or -1. */
int zt_model_find(const zt_model *m, const char *name);

#endif
