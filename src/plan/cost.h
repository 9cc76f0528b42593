/* cost: the predicted time of one training step of a layout on given
 * hardware, and the throughput that follows (TFLOP/s per GPU, MFU). It is
 * the ranking key of `ztrain plan --world N` (search.h); nothing here runs
 * a model. Every term is a closed count of flops or bytes over a stated
 * rate, except the pipeline, which is the schedule simulator
 * (parallel/schedule.h) run on the layout's own action lists with the
 * per-stage action times computed here. Notation: b micro-batch, s seq,
 * h dim, f ffn_dim, a heads, k kv_heads, d = h/a, V vocab, t tp, N = b·s
 * tokens of a micro-batch, e bytes of an activation element (2 in bf16 and
 * fp16, 4 in fp32), m micro-batches per step, Ψ parameters of a rank.
 *
 * Per block, per micro-batch, on one rank:
 *  - GEMM: forward 2·N·(h·(a+2k)·d + h·h + h·f·g + f·h)/t flops (g = 2 for
 *    llama's gate and up, 1 for gpt) plus the attention products
 *    QKᵀ and PV, 4·N·s·h/t (counted whole, as a kernel that does not skip
 *    the masked half computes them); backward twice the forward (the
 *    linear layers' weight gradients are W's part in a split schedule); full
 *    recomputation adds the forward once more. Time = flops / (peak ·
 *    gemm_eff): one achieved efficiency for every GEMM.
 *  - memory-bound element-wise work (norms, activation, residual adds,
 *    residual adds): ZT_COST_ELEM_PASSES·e bytes per element of the [N, h]
 *    stream (per rank: /t under sequence parallelism, else whole) and
 *    ZT_COST_FFN_PASSES·e per element of the [N, f/t] activation, forward;
 *    backward twice; recomputation once more; over mem_bw. An attention that materialises
 *    the score matrix moves hw.attn_matrix_bytes per score (N·s·a/t of
 *    them) per forward; 0 for a fused attention that keeps no T×T matrix.
 *  - TP: 2 all-reduces of N·h·e bytes forward, 2 backward, 2 more when the
 *    block is recomputed (sequence parallel: a reduce-scatter plus an
 *    all-gather each, the same bytes); a ring over t ranks moves
 *    2(t−1)/t of the bytes per rank and takes 2(t−1) latency steps; over
 *    the intra-node link when t ≤ ranks_per_node, else the inter-node one.
 *  - The first stage adds the embedding (an element-wise gather, and at
 *    t > 1 one all-reduce each way); the last stage adds the head, 2·N·h·V/t
 *    flops forward (backward twice, recomputed with its block only if
 *    the last block is), and the loss.
 *  - PP: each F sends N·h·e bytes to the next stage and each B the same
 *    gradient back (divided by t under sequence parallelism: each TP rank
 *    sends its rows over its own link), counted inside the action (the
 *    executor posts transfers ahead but a stage still waits for its input).
 * Per step:
 *  - pipeline: the simulator's makespan of the action lists with those
 *    per-stage times (so the bubble, warm-up and imbalance of a real
 *    partition come from the lists, not from (p−1)/m).
 *  - DP: ring volumes per rank from docs/parallelism.md, Ψ the rank's
 *    parameters, G bytes of a reduced gradient element (4, or 2 with
 *    zero.reduce_dtype 16-bit), P bytes of a weight (2 in 16-bit runs):
 *    stage 0: 2Ψ(dp−1)/dp·G after the last micro-batch, not overlapped;
 *    stage 1: Ψ(dp−1)/dp·G reduce-scatter + Ψ(dp−1)/dp·P all-gather after
 *    the step, not overlapped; stage 2: a reduce-scatter per micro-batch,
 *    m·Ψ(dp−1)/dp·G, overlapped with backward when zero.overlap (exposed:
 *    what exceeds the backward compute), plus the all-gather after the step;
 *    stage 3: that plus 2 all-gathers of the weights per micro-batch
 *    (forward and backward, 2m·Ψ(dp−1)/dp·P), overlapped with compute
 *    likewise when zero.overlap. The group is intra-node when
 *    tp·dp ≤ ranks_per_node, else inter.
 *  - optimizer: memory bound, ZT_COST_ADAM_BYTES per updated parameter
 *    (Ψ, or Ψ/dp from ZeRO stage 1) over mem_bw on the device; with the
 *    moments and masters offloaded to the host: gradients down and weights
 *    up over host_bw plus the host AdamW over host_mem_bw, not overlapped
 *    (the engine hides part of it behind the last backward; counted whole);
 *    on NVMe: the moments (8 bytes a parameter) read and written over
 *    nvme_bw on top of that. */
#ifndef ZT_PLAN_COST_H
#define ZT_PLAN_COST_H

#include "src/config/config.h"
#include "src/core/err.h"

/* memory passes per element of a forward, in elements of e bytes
 * (derivations in docs/plan.md) */
#define ZT_COST_ELEM_PASSES 10.0 /* [N,h]: 2 norms (read, write), 2 residual adds (2 reads, write) */
#define ZT_COST_FFN_PASSES 2.0   /* [N,f/t]: the activation function (read, write) */
#define ZT_COST_ADAM_BYTES 30.0 /* fp32 w, g, m, v read; w, m, v written; 16-bit w written */

typedef struct zt_hw {
  double peak_flops;        /* per GPU, in the training dtype, FLOP/s */
  double gemm_eff;          /* achieved fraction of peak on GEMMs */
  double mem_bw;            /* device memory, bytes/s */
  double attn_matrix_bytes; /* per attention score per forward; 0: fused */
  int ranks_per_node;
  double intra_bw, intra_lat; /* per rank, per direction: bytes/s, s */
  double inter_bw, inter_lat; /* per rank: the node's NICs / ranks_per_node */
  double host_bw;             /* device <-> host per rank, bytes/s */
  double host_mem_bw;         /* host memory per rank (host AdamW), bytes/s */
  double nvme_bw;             /* per rank, bytes/s */
} zt_hw;

/* Where masters and moments live: the offload engine's placements
 * (parallel/offload.h, through config.h). */
typedef zt_place zt_placement;

/* What the step time depends on besides the model and the pipeline. */
typedef struct zt_layout {
  int tp, pp, dp, zero, zero_overlap;
  int micro_batch, global_batch;
  int sp;               /* sequence parallel */
  int act_bytes;        /* e: 2 (bf16, fp16) or 4 (fp32) */
  int grad_bytes;       /* G: dp reduction element */
  zt_placement moments; /* where masters and moments live */
} zt_layout;

typedef struct zt_cost {
  double step_s;                     /* the prediction */
  double pipe_s, bubble;             /* simulated makespan, idle share */
  double gemm_s, elem_s, tp_s, p2p_s; /* per step on the busiest stage */
  double dp_s, dp_exposed_s;         /* DP traffic time, and what is not hidden */
  double optim_s, offload_s;
  double hw_flops;    /* per step, all ranks, recomputation included */
  double model_flops; /* per step, all ranks, 6·params + attention (report.c's) */
  double tflops_gpu;  /* hw_flops / (step · ranks) / 1e12 */
  double mfu;         /* model_flops / (step · ranks · peak) */
} zt_cost;

/* The layout a checked plan asks for (moments on the device). */
void zt_layout_from_plan(const zt_plan *p, zt_layout *l);

/* Predicts one step of model m (its recompute flags are used) under l on
 * hw, with the pipeline pc: the partition and the action lists of pp
 * stages and global/(micro·dp) micro-batches, as zt_config_load builds
 * them. pc->schedule is simulated with costs set here (restored after).
 * ZT_EINPUT when the numbers do not describe a layout. */
int zt_cost_step(const zt_model_cfg *m, const zt_layout *l, zt_pipeline_cfg *pc, const zt_hw *hw,
                 zt_cost *out, zt_err *e);

#endif
