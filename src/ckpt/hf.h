/* hf: Hugging Face model folders (config.json + model.safetensors, as
 * transformers' save_pretrained writes them) to and from ztrain's logical
 * tensors, for `zreshard export --format hf`, `zreshard import` and
 * `ztrain --load DIR`. One place holds the name map (GPT2LMHeadModel and
 * LlamaForCausalLM, docs/checkpoint-format.md), the config in both
 * directions, and what HF can express that ztrain cannot (and back): such
 * a difference is refused with the field named, never silently dropped.
 * The import writes a checkpoint through format.c, the format's one owner.
 * Serial I/O only: no MPI. */
#ifndef ZT_CKPT_HF_H
#define ZT_CKPT_HF_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/err.h"
#include "src/model/model.h"

/* The HF name of ztrain tensor `name` of a model of kind cfg->arch into
 * hf[n], and whether HF stores it transposed (GPT-2's Conv1D weights are
 * [in, out], nn.Linear's [out, in]). -1 when the name has no HF
 * counterpart (never for a model's own tensors). */
int zt_hf_name(const zt_model_cfg *cfg, const char *name, char *hf, size_t n, int *transpose);

/* config.json for the model (malloc'ed text; NULL: out of memory). */
char *zt_hf_config_json(const zt_model_cfg *cfg);

/* The model a config.json text describes, or ZT_EINPUT naming the field
 * that no ztrain model matches (`where` prefixes the message). */
int zt_hf_config_parse(const char *text, const char *where, zt_model_cfg *cfg, zt_err *e);

/* Reads DIR/config.json and DIR/model.safetensors (or the shards that
 * DIR/model.safetensors.index.json lists) and writes them as a ztrain
 * checkpoint at `out` (step 0, weights only: a run loading it starts its
 * optimizer from zero), written to a temporary name and renamed; nothing
 * is left on error. *cfg (may be NULL) gets the model. ZT_EINPUT for a
 * folder that is not such a model (the field or tensor named). */
int zt_hf_import(const char *dir, const char *out, zt_model_cfg *cfg, zt_err *e);

/* 1 when path is a folder holding config.json. */
int zt_hf_is_dir(const char *path);

/* ZT_EINPUT naming the first field in which the script's model `want`
 * differs from the imported `have` (where: the folder, for the message). */
int zt_hf_cfg_match(const zt_model_cfg *have, const zt_model_cfg *want, const char *where,
                    zt_err *e);

#endif
