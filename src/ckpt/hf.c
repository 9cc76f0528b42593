/* hf: see hf.h. Here: the name map, config.json both ways, and the match
 * of an imported model with a script's; the import itself (safetensors
 * reading, the checkpoint written) is hf_import.c. A config from
 * elsewhere is input, not trusted: every field is checked before use. */
#include "src/ckpt/hf.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/ckpt/format.h"
#include "src/ckpt/h5util.h"
#include "src/core/half.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors is little-endian"
#endif

/* ---- names ----------------------------------------------------------------- */

/* ztrain's per-block name suffix, GPT-2's (with whether Conv1D stores it
 * transposed) and LLaMA's; NULL where the family has no such tensor. */
static const struct {
  const char *zt, *gpt, *llama;
  int gpt_t;
} block_names[] = {
    {"norm1.weight", "ln_1.weight", "input_layernorm.weight", 0},
    {"norm1.bias", "ln_1.bias", NULL, 0},
    {"attn.qkv.weight", "attn.c_attn.weight", NULL, 1},
    {"attn.qkv.bias", "attn.c_attn.bias", NULL, 0},
    {"attn.q.weight", NULL, "self_attn.q_proj.weight", 0},
    {"attn.k.weight", NULL, "self_attn.k_proj.weight", 0},
    {"attn.v.weight", NULL, "self_attn.v_proj.weight", 0},
    {"attn.out.weight", "attn.c_proj.weight", "self_attn.o_proj.weight", 1},
    {"attn.out.bias", "attn.c_proj.bias", NULL, 0},
    {"norm2.weight", "ln_2.weight", "post_attention_layernorm.weight", 0},
    {"norm2.bias", "ln_2.bias", NULL, 0},
    {"mlp.gate.weight", NULL, "mlp.gate_proj.weight", 0},
    {"mlp.up.weight", "mlp.c_fc.weight", "mlp.up_proj.weight", 1},
    {"mlp.up.bias", "mlp.c_fc.bias", NULL, 0},
    {"mlp.down.weight", "mlp.c_proj.weight", "mlp.down_proj.weight", 1},
    {"mlp.down.bias", "mlp.c_proj.bias", NULL, 0},
};

static const struct {
  const char *zt, *gpt, *llama;
} top_names[] = {
    {"embed.tokens", "transformer.wte.weight", "model.embed_tokens.weight"},
    {"embed.positions", "transformer.wpe.weight", NULL},
    {"final_norm.weight", "transformer.ln_f.weight", "model.norm.weight"},
    {"final_norm.bias", "transformer.ln_f.bias", NULL},
    {"head.weight", "lm_head.weight", "lm_head.weight"},
};

int zt_hf_name(const zt_model_cfg *cfg, const char *name, char *hf, size_t n, int *transpose) {
  int gpt = cfg->arch == ZT_ARCH_GPT;
  *transpose = 0;
  for (size_t i = 0; i < sizeof top_names / sizeof top_names[0]; i++)
    if (!strcmp(name, top_names[i].zt)) {
      const char *h = gpt ? top_names[i].gpt : top_names[i].llama;
      if (!h) return -1;
      snprintf(hf, n, "%s", h);
      return 0;
    }
  int block, used = 0;
  if (sscanf(name, "blocks.%d.%n", &block, &used) != 1 || !used || block < 0) return -1;
  for (size_t i = 0; i < sizeof block_names / sizeof block_names[0]; i++)
    if (!strcmp(name + used, block_names[i].zt)) {
      const char *h = gpt ? block_names[i].gpt : block_names[i].llama;
      if (!h) return -1;
      snprintf(hf, n, gpt ? "transformer.h.%d.%s" : "model.layers.%d.%s", block, h);
      *transpose = gpt && block_names[i].gpt_t;
      return 0;
    }
  return -1;
}

/* ---- config.json --------------------------------------------------------- */

/* A float32 value as the shortest decimal that reads back as it, so that
 * config.json says 1e-05, not 9.99999974737875e-06. */
static json_t *real_of(float v) {
  char buf[40];
  for (int p = 6; p <= 9; p++) {
    snprintf(buf, sizeof buf, "%.*g", p, (double)v);
    if ((float)strtod(buf, NULL) == v) break;
  }
  return json_real(strtod(buf, NULL));
}

char *zt_hf_config_json(const zt_model_cfg *c) {
  json_t *o;
  if (c->arch == ZT_ARCH_GPT)
    o = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:o, s:f, s:f, s:f,"
                  " s:b, s:b, s:b, s:b, s:s}",
                  "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "vocab_size",
                  c->vocab, "n_positions", c->seq, "n_ctx", c->seq, "n_embd", c->dim, "n_layer",
                  c->layers, "n_head", c->heads, "n_inner", c->ffn_dim, "activation_function",
                  "gelu_new", "layer_norm_epsilon", real_of(c->norm_eps), "resid_pdrop", 0.0,
                  "embd_pdrop", 0.0, "attn_pdrop", 0.0, "scale_attn_weights", 1,
                  "scale_attn_by_inverse_layer_idx", 0, "reorder_and_upcast_attn", 0,
                  "tie_word_embeddings", c->tied, "torch_dtype", "float32");
  else
    o = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:o, s:s, s:b, s:f,"
                  " s:n, s:b, s:i, s:s}",
                  "architectures", "LlamaForCausalLM", "model_type", "llama", "vocab_size",
                  c->vocab, "max_position_embeddings", c->seq, "hidden_size", c->dim,
                  "intermediate_size", c->ffn_dim, "num_hidden_layers", c->layers,
                  "num_attention_heads", c->heads, "num_key_value_heads", c->kv_heads,
                  "rms_norm_eps", real_of(c->norm_eps), "rope_theta", real_of(c->rope_theta),
                  "hidden_act", "silu", "attention_bias", 0, "attention_dropout", 0.0,
                  "rope_scaling", "tie_word_embeddings", 0, "pretraining_tp", 1, "torch_dtype",
                  "float32");
  char *s = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  json_decref(o);
  return s;
}

/* An integer field in [1, 2^26] (required unless def > 0, its default). */
static int cfg_int(json_t *o, const char *k, int def, int *v, const char *where, zt_err *e) {
  json_t *x = json_object_get(o, k);
  if ((!x || json_is_null(x)) && def > 0) return *v = def, ZT_OK;
  if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > (1 << 26))
    return zt_err_set(e, ZT_EINPUT, "%s: %s %s", where, k,
                      x ? "must be an integer from 1 to 2^26" : "is missing");
  *v = (int)json_integer_value(x);
  return ZT_OK;
}

/* A number field (def when absent). */
static int cfg_num(json_t *o, const char *k, double def, double *v, const char *where,
                   zt_err *e) {
  json_t *x = json_object_get(o, k);
  if (!x) return *v = def, ZT_OK;
  if (!json_is_number(x) || !isfinite(json_number_value(x)) || json_number_value(x) <= 0)
    return zt_err_set(e, ZT_EINPUT, "%s: %s must be a positive number", where, k);
  *v = json_number_value(x);
  return ZT_OK;
}

/* A string field that, when present, must be `want` (or `alt`). */
static int cfg_str_is(json_t *o, const char *k, const char *want, const char *alt,
                      const char *where, const char *why, zt_err *e) {
  json_t *x = json_object_get(o, k);
  const char *s = json_string_value(x);
  if (!x || (s && (!strcmp(s, want) || (alt && !strcmp(s, alt))))) return ZT_OK;
  return zt_err_set(e, ZT_EINPUT, "%s: %s is %s%s%s, ztrain's model has \"%s\" (%s)", where, k,
                    s ? "\"" : "", s ? s : "not a string", s ? "\"" : "", want, why);
}

/* A boolean field (def when absent or null) that must be `want` (-1: any). */
static int cfg_bool_is(json_t *o, const char *k, int want, int def, const char *where,
                       const char *why, zt_err *e) {
  json_t *x = json_object_get(o, k);
  if (x && !json_is_boolean(x) && !json_is_null(x))
    return zt_err_set(e, ZT_EINPUT, "%s: %s must be true or false", where, k);
  int v = x && !json_is_null(x) ? json_is_true(x) : def;
  if (want >= 0 && v != want)
    return zt_err_set(e, ZT_EINPUT, "%s: %s is %s, %s", where, k, v ? "true" : "false", why);
  return ZT_OK;
}

int zt_hf_config_parse(const char *text, const char *where, zt_model_cfg *c, zt_err *e) {
  json_error_t je;
  json_t *o = json_loads(text, 0, &je);
  memset(c, 0, sizeof *c);
  if (!json_is_object(o)) {
    json_decref(o);
    return zt_err_set(e, ZT_EINPUT, "%s: not a JSON object (line %d: %s)", where, je.line,
                      je.text);
  }
  const char *mt = json_string_value(json_object_get(o, "model_type"));
  json_t *arch = json_object_get(o, "architectures");
  const char *a0 = json_string_value(json_array_get(arch, 0));
  int rc = ZT_OK;
  if (!mt)
    rc = zt_err_set(e, ZT_EINPUT, "%s: model_type is missing (ztrain imports \"gpt2\" and "
                    "\"llama\")", where);
  else if (strcmp(mt, "gpt2") && strcmp(mt, "llama"))
    rc = zt_err_set(e, ZT_EINPUT, "%s: model_type \"%.64s\" is not a ztrain family (ztrain imports "
                    "\"gpt2\" and \"llama\")", where, mt);
  else if (arch && (!json_is_array(arch) || json_array_size(arch) != 1 || !a0 ||
                    strcmp(a0, !strcmp(mt, "gpt2") ? "GPT2LMHeadModel" : "LlamaForCausalLM")))
    rc = zt_err_set(e, ZT_EINPUT, "%s: architectures must be [\"%s\"] for model_type \"%s\"",
                    where, !strcmp(mt, "gpt2") ? "GPT2LMHeadModel" : "LlamaForCausalLM", mt);
  double eps = 0, theta = 10000.0;
  if (!rc && !strcmp(mt, "gpt2")) {
    c->arch = ZT_ARCH_GPT;
    rc = cfg_int(o, "vocab_size", 0, &c->vocab, where, e);
    if (!rc) rc = cfg_int(o, "n_positions", 0, &c->seq, where, e);
    if (!rc) rc = cfg_int(o, "n_embd", 0, &c->dim, where, e);
    if (!rc) rc = cfg_int(o, "n_layer", 0, &c->layers, where, e);
    if (!rc) rc = cfg_int(o, "n_head", 0, &c->heads, where, e);
    if (!rc) rc = cfg_int(o, "n_inner", 4 * c->dim, &c->ffn_dim, where, e);
    if (!rc && c->ffn_dim != 4 * c->dim)
      rc = zt_err_set(e, ZT_EINPUT, "%s: n_inner is %d; ztrain's gpt has an MLP of 4*n_embd = %d",
                      where, c->ffn_dim, 4 * c->dim);
    if (!rc) rc = cfg_num(o, "layer_norm_epsilon", 1e-5, &eps, where, e);
    if (!rc && (float)eps != 1e-5f)
      rc = zt_err_set(e, ZT_EINPUT, "%s: layer_norm_epsilon is %g; ztrain's gpt has 1e-05", where,
                      eps);
    if (!rc) rc = cfg_str_is(o, "activation_function", "gelu_new", "gelu_pytorch_tanh", where,
                             "GELU, tanh approximation", e);
    if (!rc) rc = cfg_bool_is(o, "scale_attn_weights", 1, 1, where, "ztrain scales by 1/sqrt(head dim)", e);
    if (!rc) rc = cfg_bool_is(o, "scale_attn_by_inverse_layer_idx", 0, 0, where,
                              "ztrain does not scale attention by layer", e);
    if (!rc) rc = cfg_bool_is(o, "add_cross_attention", 0, 0, where, "ztrain has no cross-attention", e);
    if (!rc) rc = cfg_bool_is(o, "tie_word_embeddings", -1, 1, where, "", e);
    c->tied = !json_is_false(json_object_get(o, "tie_word_embeddings"));
    c->kv_heads = c->heads;
    c->norm_eps = 1e-5f;
    c->rope_theta = 0;
  } else if (!rc) {
    c->arch = ZT_ARCH_LLAMA;
    rc = cfg_int(o, "vocab_size", 0, &c->vocab, where, e);
    if (!rc) rc = cfg_int(o, "max_position_embeddings", 0, &c->seq, where, e);
    if (!rc) rc = cfg_int(o, "hidden_size", 0, &c->dim, where, e);
    if (!rc) rc = cfg_int(o, "num_hidden_layers", 0, &c->layers, where, e);
    if (!rc) rc = cfg_int(o, "num_attention_heads", 0, &c->heads, where, e);
    if (!rc) rc = cfg_int(o, "num_key_value_heads", c->heads, &c->kv_heads, where, e);
    if (!rc) rc = cfg_int(o, "intermediate_size", 0, &c->ffn_dim, where, e);
    if (!rc) rc = cfg_num(o, "rms_norm_eps", 1e-6, &eps, where, e);
    if (!rc) rc = cfg_num(o, "rope_theta", 10000.0, &theta, where, e);
    int hd = 0;
    if (!rc && json_object_get(o, "head_dim") && !json_is_null(json_object_get(o, "head_dim"))) {
      rc = cfg_int(o, "head_dim", 0, &hd, where, e);
      if (!rc && (long long)hd * c->heads != c->dim)
        rc = zt_err_set(e, ZT_EINPUT, "%s: head_dim is %d; ztrain's head dim is hidden_size / "
                        "num_attention_heads = %d", where, hd, c->dim / c->heads);
    }
    if (!rc) rc = cfg_str_is(o, "hidden_act", "silu", NULL, where, "SwiGLU", e);
    if (!rc) rc = cfg_bool_is(o, "attention_bias", 0, 0, where, "ztrain's llama has no biases", e);
    if (!rc) rc = cfg_bool_is(o, "mlp_bias", 0, 0, where, "ztrain's llama has no biases", e);
    if (!rc) rc = cfg_bool_is(o, "tie_word_embeddings", 0, 0, where, "ztrain's llama head is never tied", e);
    json_t *rs = json_object_get(o, "rope_scaling");
    if (!rc && rs && !json_is_null(rs))
      rc = zt_err_set(e, ZT_EINPUT, "%s: rope_scaling is set; ztrain's llama has plain RoPE "
                      "(rope_scaling null)", where);
    c->norm_eps = (float)eps;
    c->rope_theta = (float)theta;
  }
  json_decref(o);
  if (!rc) {
    zt_err me = {0};
    if (zt_model_cfg_check(c, &me))
      rc = zt_err_set(e, ZT_EINPUT, "%s: no ztrain model fits: %s", where, me.msg);
  }
  return rc;
}

/* Field f of a model, as the script writes it. */
static void cfg_field(const zt_model_cfg *c, const char *f, char *buf, size_t n) {
  if (!strcmp(f, "kind")) snprintf(buf, n, "%s", c->arch == ZT_ARCH_GPT ? "gpt" : "llama");
  else if (!strcmp(f, "tied")) snprintf(buf, n, "%s", c->tied ? "true" : "false");
  else if (!strcmp(f, "norm_eps")) snprintf(buf, n, "%g", (double)c->norm_eps);
  else if (!strcmp(f, "rope_theta")) snprintf(buf, n, "%g", (double)c->rope_theta);
  else
    snprintf(buf, n, "%d", !strcmp(f, "vocab") ? c->vocab : !strcmp(f, "dim") ? c->dim
                           : !strcmp(f, "layers") ? c->layers : !strcmp(f, "heads") ? c->heads
                           : !strcmp(f, "kv_heads") ? c->kv_heads
                           : !strcmp(f, "ffn_dim") ? c->ffn_dim : c->seq);
}

int zt_hf_cfg_match(const zt_model_cfg *h, const zt_model_cfg *w, const char *where, zt_err *e) {
  const char *f = h->arch != w->arch        ? "kind"
                  : h->vocab != w->vocab     ? "vocab"
                  : h->dim != w->dim         ? "dim"
                  : h->layers != w->layers   ? "layers"
                  : h->heads != w->heads     ? "heads"
                  : h->kv_heads != w->kv_heads ? "kv_heads"
                  : h->ffn_dim != w->ffn_dim ? "ffn_dim"
                  : h->tied != w->tied       ? "tied"
                  : h->norm_eps != w->norm_eps ? "norm_eps"
                  : h->arch == ZT_ARCH_LLAMA && h->rope_theta != w->rope_theta ? "rope_theta"
                  /* gpt's positions table is [seq, dim]; llama's is a limit */
                  : h->arch == ZT_ARCH_GPT ? (h->seq != w->seq ? "seq" : NULL)
                  : w->seq > h->seq ? "seq" : NULL;
  if (!f) return ZT_OK;
  char have[64], want[64];
  cfg_field(h, f, have, sizeof have);
  cfg_field(w, f, want, sizeof want);
  return zt_err_set(e, ZT_EINPUT, "--load %s: the script's model has %s = %s, the Hugging Face "
                    "model has %s%s", where, f, want, have,
                    !strcmp(f, "seq") && h->arch == ZT_ARCH_LLAMA ? " (max_position_embeddings)" : "");
}

int zt_hf_is_dir(const char *path) {
  struct stat st;
  char p[4200];
  if (stat(path, &st) || !S_ISDIR(st.st_mode)) return 0;
  snprintf(p, sizeof p, "%s/config.json", path);
  return stat(p, &st) == 0;
}
