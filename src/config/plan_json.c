/* plan_json: see plan_json.h. */
#include "src/config/plan_json.h"

#include <jansson.h>

#include "src/config/offload_plan.h"
#include "src/data/tokenizer.h"

/* train.precision as the script writes it */
static const char *precision_name(zt_dtype t) {
  return t == ZT_BF16 ? "bf16" : t == ZT_F16 ? "fp16" : "fp32";
}

/* zt.lr.deepspeed as the script writes it, with the defaults it ran */
static json_t *ds_lr_json(const zt_lr *lr) {
  static const char *const types[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
  json_t *j = lr->ds.type == ZT_DS_WARMUP_COSINE
                  ? json_pack("{s:f, s:f, s:f}", "lr", lr->ds.lr, "warmup_min_ratio",
                              lr->ds.warmup_min_ratio, "cos_min_ratio", lr->ds.cos_min_ratio)
                  : json_pack("{s:f, s:f}", "warmup_min_lr", lr->ds.warmup_min_lr, "warmup_max_lr",
                              lr->ds.warmup_max_lr);
  json_object_update_new(j, json_pack("{s:s, s:s, s:s, s:I}", "kind", "deepspeed", "type",
                                      types[lr->ds.type], "warmup_type", lr->ds.log ? "log" : "linear",
                                      "warmup_num_steps", (json_int_t)lr->ds.warmup_num_steps));
  if (lr->ds.type != ZT_DS_WARMUP)
    json_object_set_new(j, "total_num_steps", json_integer((json_int_t)lr->ds.total_num_steps));
  return j;
}

char *zt_config_plan_json(const zt_plan *p, const zt_dsconfig *ds) {
  const zt_model_cfg *m = &p->model;
  const zt_train_cfg *t = &p->train;
  const zt_lr *lr = &t->optim.lr;
  json_t *jlr = lr->kind == ZT_LR_COSINE
                    ? json_pack("{s:s, s:f, s:I, s:f, s:I}", "kind", "cosine", "peak",
                                lr->peak, "warmup", (json_int_t)lr->warmup, "final",
                                lr->final, "decay_steps", (json_int_t)lr->decay_steps)
                    : lr->kind == ZT_LR_DEEPSPEED ? ds_lr_json(lr)
                    : json_pack("{s:s, s:f}", "kind", "constant", "value", lr->value);
  json_t *root = json_pack(
      "{s:{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b},"
      " s:{s:i, s:i, s:i, s:I, s:o, s:f, s:[f,f], s:f, s:f, s:I},"
      " s:{s:s, s:s?, s:s, s:b},"
      " s:{s:i, s:i, s:i, s:i, s:b}}",
      "model", "kind", m->arch == ZT_ARCH_GPT ? "gpt" : "llama", "vocab", m->vocab,
      "seq", m->seq, "dim", m->dim, "layers", m->layers, "heads", m->heads,
      "kv_heads", m->kv_heads, "ffn_dim", m->ffn_dim, "norm_eps", (double)m->norm_eps,
      "rope_theta", (double)m->rope_theta, "tied", m->tied,
      "train", "micro_batch", t->micro_batch, "global_batch", t->global_batch,
      "accum", t->accum, "steps", (json_int_t)t->steps, "lr", jlr,
      "weight_decay", t->optim.weight_decay, "betas", t->optim.beta1, t->optim.beta2,
      "eps", t->optim.eps, "clip", t->optim.clip, "seed", (json_int_t)t->seed,
      "data", "train", p->data.train, "val", p->data.val, "dtype",
      p->data.token_bytes == 4 ? "u32" : "u16", "shuffle", p->data.shuffle,
      "parallel", "dp", p->parallel.dp, "tp", p->parallel.tp, "pp", p->parallel.pp,
      "zero", p->parallel.zero.stage, "sequence_parallel", p->parallel.sequence_parallel);
  /* the pipeline as it ran: blocks of each virtual stage, the schedule */
  json_t *stages = json_array(), *par = json_object_get(root, "parallel");
  static const char *const devices[] = {"auto", "cpu", "cuda"};
  json_object_set_new(par, "device", json_string(devices[p->parallel.device]));
  for (int v = 0; v < p->pipeline.n_virtual; v++)
    json_array_append_new(stages, json_pack("[i, i]", p->pipeline.first[v], p->pipeline.last[v]));
  json_object_set_new(par, "stages", stages);
  json_object_set_new(par, "schedule", json_pack("{s:s, s:i}", "name", p->pipeline.schedule.name,
                                                 "chunks", p->pipeline.schedule.chunks));
  /* how the run ran, not what it trains: the blocks recomputed */
  json_t *rc = json_array();
  for (int l = 0; m->recompute && l < m->layers; l++)
    if (m->recompute[l]) json_array_append_new(rc, json_integer(l));
  json_object_set_new(json_object_get(root, "train"), "recompute", rc);
  /* the tokenizer by path (sample, HF export) and content hash */
  char hash[64] = "";
  zt_err ignored;
  zt_tok_file_hash(p->data.tokenizer, hash, sizeof hash, &ignored); /* checked at load */
  json_object_set_new(json_object_get(root, "data"), "tokenizer", json_string(p->data.tokenizer));
  if (*hash) json_object_set_new(json_object_get(root, "data"), "tokenizer_hash", json_string(hash));
  json_object_set_new(json_object_get(root, "train"), "precision",
                      json_string(precision_name(t->precision)));
  json_object_set_new(json_object_get(root, "train"), "grad_reduce_dtype",
                      json_string(precision_name(t->grad_reduce)));
  const zt_scaler_cfg *ls = &t->loss_scale;
  json_object_set_new(json_object_get(root, "train"), "loss_scale",
                      ls->dynamic ? json_pack("{s:i, s:I, s:i, s:f, s:b}", "initial_scale_power",
                                              ls->initial_scale_power, "loss_scale_window",
                                              (json_int_t)ls->loss_scale_window, "hysteresis",
                                              ls->hysteresis, "min_loss_scale",
                                              ls->min_loss_scale, "consecutive_hysteresis",
                                              ls->consecutive_hysteresis)
                                  : json_real(ls->scale));
  if (p->parallel.offload_json) json_object_set_new(par, "offload", zt_config_offload_json(p));
  /* the DeepSpeed config by path and the statements it became, to rerun */
  if (ds)
    json_object_set_new(root, "ds_config", json_pack("{s:s, s:s}", "path", ds->path, "lua", ds->lua));
  char *s = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(17));
  json_decref(root);
  return s;
}

