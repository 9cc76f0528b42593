/* test_shard: the TP shard mapping (src/core/tensor.c) and the model's
 * sharded parameter table (src/model/params.c), without MPI.
 * The mapping: for dim 0 and dim 1 cuts, plain (groups 1) and q,k,v-style
 * (groups 3), counts 1..4, the pieces of all ranks cover every logical
 * element exactly once, zt_shard_runs agrees element by element with
 * zt_shard_global_index, and local shapes multiply to the piece's size.
 * Replicated slices (count < tp): zt_shard_index_at and
 * zt_shard_counts_here pick each slice's ranks and one designated holder.
 * The table: at tp = 1..4 every tensor is cut the Megatron way, pieces add
 * up to the logical tensor (replicated ones once per holder), units and
 * fused GEMM operands stay contiguous; llama with kv_heads 2 and 1 holds
 * one kv head per rank, tp_rank / (tp / kv_heads), once tp > kv_heads.
 * zt_model_tp_check: the message names the failing number and the tp values
 * that work. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/tensor.h"
#include "src/model/model.h"

static zt_tensor_desc desc(int ndim, const int64_t *shape, int dim, int groups,
                           int index, int count) {
  zt_tensor_desc t = {.name = "t", .dtype = ZT_F32, .ndim = ndim};
  for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
  t.shard = (zt_shard){.dim = dim, .index = index, .count = count, .groups = groups};
  int64_t ls[ZT_MAX_DIMS];
  zt_shard_local_shape(&t, ls);
  t.numel = ls[0] * ls[1] * ls[2] * ls[3];
  return t;
}

/* zt_shard_runs must visit the piece in local order, without gaps, and
 * each run must be consecutive logical elements */
typedef struct { const zt_tensor_desc *t; int64_t next; } runs_ctx;
static void check_run(void *p, int64_t local, int64_t global, int64_t n) {
  runs_ctx *c = p;
  assert_int_equal(local, c->next);
  assert_true(n > 0);
  for (int64_t i = 0; i < n; i++)
    assert_int_equal(zt_shard_global_index(c->t, local + i), global + i);
  c->next = local + n;
}

/* All ranks' pieces of one cut, against the logical tensor. */
static void check_cut(int ndim, const int64_t *shape, int dim, int groups, int count) {
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) numel *= shape[i];
  int *hit = calloc((size_t)numel, sizeof *hit);
  assert_non_null(hit);
  for (int r = 0; r < count; r++) {
    zt_tensor_desc t = desc(ndim, shape, dim, groups, r, count);
    int64_t ls[ZT_MAX_DIMS];
    zt_shard_local_shape(&t, ls);
    for (int i = 0; i < ZT_MAX_DIMS; i++)
      assert_int_equal(ls[i], i >= ndim ? 1 : i == dim && dim >= 0 ? shape[i] / count : shape[i]);
    assert_int_equal(t.numel * (dim >= 0 ? count : 1), numel);
    for (int64_t j = 0; j < t.numel; j++) {
      int64_t g = zt_shard_global_index(&t, j);
      assert_true(g >= 0 && g < numel);
      hit[g]++;
    }
    runs_ctx rc = {&t, 0};
    zt_shard_runs(&t, &rc, check_run);
    assert_int_equal(rc.next, t.numel);
  }
  /* whole tensors: every "rank" holds all of it */
  for (int64_t g = 0; g < numel; g++) assert_int_equal(hit[g], dim >= 0 ? 1 : count);
  free(hit);
}

static void test_cover(void **state) {
  (void)state;
  /* 36 rows: 3 parts of 12, so groups 3 splits for counts 1..4 too */
  static const struct { int ndim; int64_t shape[4]; int dim; } cases[] = {
      {1, {36}, 0},          {2, {36, 5}, 0},   {2, {5, 36}, 1},
      {3, {2, 36, 3}, 1},    {4, {2, 3, 36, 2}, 2}, {2, {36, 5}, -1},
  };
  int n = 0;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int groups = 1; groups <= 3; groups += 2)
      for (int count = 1; count <= 4; count++, n++)
        check_cut(cases[k].ndim, cases[k].shape, cases[k].dim, groups, count);
  print_message("  %d cuts cover their tensors exactly once\n", n);
}

/* The meaning of groups, spelled out on gpt's qkv weight [3C, C], C = 4,
 * tp = 2, rank 1: local rows are q rows 2,3, k rows 2,3, v rows 2,3. */
static void test_qkv_rows(void **state) {
  (void)state;
  int64_t shape[2] = {12, 4};
  zt_tensor_desc t = desc(2, shape, 0, 3, 1, 2);
  int64_t want[6] = {2, 3, 6, 7, 10, 11};
  for (int r = 0; r < 6; r++)
    for (int c = 0; c < 4; c++)
      assert_int_equal(zt_shard_global_index(&t, r * 4 + c), want[r] * 4 + c);
  /* a dim 1 cut of [2, 6] at tp = 3, rank 2: columns 4,5 of each row */
  int64_t s2[2] = {2, 6};
  zt_tensor_desc u = desc(2, s2, 1, 1, 2, 3);
  int64_t want2[4] = {4, 5, 10, 11};
  for (int j = 0; j < 4; j++) assert_int_equal(zt_shard_global_index(&u, j), want2[j]);
}

/* Slices replicated over tp/count ranks: 8 ranks, 2 slices -> ranks 0-3
 * hold slice 0, 4-7 slice 1, ranks 0 and 4 are the designated holders;
 * whole tensors: slice 0 everywhere, rank 0 designated; count = tp: all. */
static void test_replicated(void **state) {
  (void)state;
  int64_t shape[2] = {16, 3};
  zt_tensor_desc kv = desc(2, shape, 0, 1, 0, 2), whole = desc(2, shape, -1, 1, 0, 1);
  zt_tensor_desc cut = desc(2, shape, 0, 1, 0, 8);
  for (int r = 0; r < 8; r++) {
    assert_int_equal(zt_shard_index_at(&kv, r, 8), r / 4);
    assert_int_equal(zt_shard_counts_here(&kv, r, 8), r % 4 == 0);
    assert_int_equal(zt_shard_index_at(&whole, r, 8), 0);
    assert_int_equal(zt_shard_counts_here(&whole, r, 8), r == 0);
    assert_int_equal(zt_shard_index_at(&cut, r, 8), r);
    assert_true(zt_shard_counts_here(&cut, r, 8));
  }
}

static zt_model_cfg small_cfg(zt_arch arch) {
  int gpt = arch == ZT_ARCH_GPT;
  zt_model_cfg c = {.arch = arch, .vocab = 96, .seq = 8, .dim = gpt ? 48 : 96, .layers = 2,
                    .heads = gpt ? 12 : 24, .kv_heads = 12,
                    .ffn_dim = gpt ? 192 : 120, .norm_eps = 1e-5f,
                    .rope_theta = 10000, .tied = gpt};
  return c;
}

static int ends(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

/* How params.c must cut each tensor (Megatron); k and v in min(tp,
 * kv_heads) slices. */
static void expect_cut(const zt_tensor_desc *t, int tp, int r, int kv_heads) {
  int dim = -1, groups = 1, count = tp;
  if (ends(t->name, "attn.k.weight") || ends(t->name, "attn.v.weight"))
    count = kv_heads < tp ? kv_heads : tp;
  if (ends(t->name, "attn.qkv.weight") || ends(t->name, "attn.qkv.bias")) dim = 0, groups = 3;
  else if (ends(t->name, "attn.q.weight") || ends(t->name, "attn.k.weight") ||
           ends(t->name, "attn.v.weight") || ends(t->name, "mlp.gate.weight") ||
           ends(t->name, "mlp.up.weight") || ends(t->name, "mlp.up.bias") ||
           !strcmp(t->name, "embed.tokens") || !strcmp(t->name, "head.weight"))
    dim = 0;
  else if (ends(t->name, "attn.out.weight") || ends(t->name, "mlp.down.weight"))
    dim = 1;
  assert_int_equal(t->shard.dim, dim);
  assert_int_equal(t->shard.groups, groups);
  assert_int_equal(t->shard.count, dim < 0 ? 1 : count);
  assert_int_equal(t->shard.index, dim < 0 ? 0 : r / (tp / count));
}

static void check_layout(zt_arch arch, int tied, int kv_heads) {
  zt_model_cfg cfg = small_cfg(arch);
  cfg.tied = tied;
  if (kv_heads) cfg.kv_heads = kv_heads;
  zt_model whole;
  zt_err e;
  assert_int_equal(zt_model_layout(&whole, &cfg, 1, 0, &e), ZT_OK);
  for (int tp = 1; tp <= 4; tp++) {
    if (zt_model_tp_check(&cfg, tp, &e)) { /* kv_heads 2 at tp 3 */
      assert_true(cfg.kv_heads % tp && tp % cfg.kv_heads);
      continue;
    }
    int64_t *sum = calloc((size_t)whole.n_params, sizeof *sum);
    assert_non_null(sum);
    for (int r = 0; r < tp; r++) {
      zt_model m;
      assert_int_equal(zt_model_layout(&m, &cfg, tp, r, &e), ZT_OK);
      assert_int_equal(m.n_params, whole.n_params);
      int64_t off = 0;
      for (int i = 0; i < m.n_params; i++) {
        const zt_tensor_desc *t = &m.params[i].t, *w = &whole.params[i].t;
        assert_string_equal(t->name, w->name);
        assert_memory_equal(t->shape, w->shape, sizeof t->shape); /* logical */
        expect_cut(t, tp, r, cfg.kv_heads);
        /* tensors back to back; units contiguous runs of them */
        assert_int_equal(t->offset, off);
        off += t->numel;
        int u = m.param_unit[i];
        assert_true(t->offset >= m.unit_start[u] &&
                    off <= m.unit_start[u] + m.unit_numel[u]);
        sum[i] += t->numel;
      }
      assert_int_equal(off, m.numel);
      for (int u = 0; u + 1 < m.n_units; u++)
        assert_int_equal(m.unit_start[u] + m.unit_numel[u], m.unit_start[u + 1]);
      /* fused GEMM operands: the local pieces are adjacent and as large as
       * the local rows the model computes with */
      const zt_block_params *b = &m.blocks[1];
      int64_t C = cfg.dim, q = b->qkv_w, fc = b->fc_w;
      if (arch == ZT_ARCH_LLAMA) {
        assert_int_equal(m.params[q + 1].t.offset, m.params[q].t.offset + m.params[q].t.numel);
        assert_int_equal(m.params[q + 2].t.offset, m.params[q + 1].t.offset + m.params[q + 1].t.numel);
        assert_int_equal(m.params[q].t.numel + m.params[q + 1].t.numel + m.params[q + 2].t.numel,
                         m.qkv_rows * C);
        assert_int_equal(m.params[fc + 1].t.offset, m.params[fc].t.offset + m.params[fc].t.numel);
        assert_int_equal(m.params[fc].t.numel + m.params[fc + 1].t.numel, m.fc_rows * C);
      } else {
        assert_int_equal(m.params[q].t.numel, m.qkv_rows * C);
        assert_int_equal(m.params[fc].t.numel, m.fc_rows * C);
      }
      assert_int_equal(m.heads * tp, cfg.heads);
      if (cfg.kv_heads >= tp) {
        assert_int_equal(m.kv_heads * tp, cfg.kv_heads);
        assert_int_equal(m.kv_rep, 1);
      } else { /* one kv head, shared by tp / kv_heads ranks */
        assert_int_equal(m.kv_heads, 1);
        assert_int_equal(m.kv_rep * cfg.kv_heads, tp);
      }
      assert_int_equal(m.hidden * tp, cfg.ffn_dim);
      assert_int_equal(m.vocab_start, r * cfg.vocab / tp);
      assert_int_equal(m.vocab_local * tp, cfg.vocab);
      zt_model_free(&m);
    }
    for (int i = 0; i < whole.n_params; i++) {
      const zt_tensor_desc *w = &whole.params[i].t;
      int copies = w->shard.dim < 0 ? tp : 1;
      if (ends(w->name, "attn.k.weight") || ends(w->name, "attn.v.weight"))
        copies = cfg.kv_heads < tp ? tp / cfg.kv_heads : 1;
      assert_int_equal(sum[i], w->numel * copies);
    }
    free(sum);
  }
  zt_model_free(&whole);
}

static void test_layout_gpt(void **state) { (void)state; check_layout(ZT_ARCH_GPT, 1, 0); }
static void test_layout_gpt_untied(void **state) { (void)state; check_layout(ZT_ARCH_GPT, 0, 0); }
static void test_layout_llama(void **state) { (void)state; check_layout(ZT_ARCH_LLAMA, 0, 0); }
/* tp 4 > kv_heads 2: kv head r / 2 on rank r; kv_heads 1: the one head everywhere */
static void test_layout_llama_kv_rep(void **state) {
  (void)state;
  check_layout(ZT_ARCH_LLAMA, 0, 2);
  check_layout(ZT_ARCH_LLAMA, 0, 1);
}

/* refused with a message holding each of the (up to 3) parts */
static void expect_refused(const zt_model_cfg *c, int tp, const char *p1,
                           const char *p2, const char *p3) {
  zt_err e = {0};
  assert_int_equal(zt_model_tp_check(c, tp, &e), ZT_EINPUT);
  print_message("  tp %d: %s\n", tp, e.msg);
  const char *parts[3] = {p1, p2, p3};
  for (int i = 0; i < 3; i++)
    if (parts[i]) assert_non_null(strstr(e.msg, parts[i]));
}

static void test_tp_check(void **state) {
  (void)state;
  zt_err e = {0};
  zt_model_cfg g = small_cfg(ZT_ARCH_GPT); /* heads 12, ffn 192, vocab 96 */
  for (int tp = 1; tp <= 4; tp++) assert_int_equal(zt_model_tp_check(&g, tp, &e), ZT_OK);
  g.heads = 6;
  g.kv_heads = 6;
  expect_refused(&g, 4, "tp = 4 does not divide heads = 6",
                 "tp values that work for this model: 1, 2, 3, 6", NULL);
  g = small_cfg(ZT_ARCH_GPT);
  g.vocab = 50257;
  expect_refused(&g, 2, "tp = 2 does not divide vocab = 50257", "pad vocab to 50258", NULL);
  zt_model_cfg l = small_cfg(ZT_ARCH_LLAMA); /* heads 24, ffn 120, vocab 96 */
  l.kv_heads = 4;
  expect_refused(&l, 3, "tp = 3 does not divide kv_heads = 4", "or tp a multiple of kv_heads",
                 "work for this model: 1, 2, 4, 8, 12, 24");
  /* tp a multiple of kv_heads: replicated kv heads */
  assert_int_equal(zt_model_tp_check(&l, 8, &e), ZT_OK);
  l.kv_heads = 2;
  assert_int_equal(zt_model_tp_check(&l, 4, &e), ZT_OK);
  l.kv_heads = 8;
  expect_refused(&l, 12, "tp = 12 does not divide kv_heads = 8", "replicated over tp/kv_heads",
                 "work for this model: 1, 2, 4, 8, 24");
  l.ffn_dim = 90;
  expect_refused(&l, 4, "tp = 4 does not divide ffn_dim = 90", NULL, NULL);
  expect_refused(&l, 0, "tp must be >= 1", NULL, NULL);
  /* and the layout refuses the same */
  zt_model m;
  assert_int_equal(zt_model_layout(&m, &l, 4, 0, &e), ZT_EINPUT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cover),        cmocka_unit_test(test_qkv_rows),
      cmocka_unit_test(test_layout_gpt),   cmocka_unit_test(test_layout_gpt_untied),
      cmocka_unit_test(test_layout_llama), cmocka_unit_test(test_layout_llama_kv_rep),
      cmocka_unit_test(test_replicated),   cmocka_unit_test(test_tp_check),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
