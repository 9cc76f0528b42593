// tok_spm: the "sentencepiece" tokenizer (LLaMA 2's .model files) and BPE
// vocabulary training, a thin C interface over Debian's libsentencepiece
// (C++). The only C++ in ztrain: exceptions never cross into C, every
// failure comes back as a zt status with the library's message.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/data/tok_impl.h"

struct zt_spm {
  sentencepiece::SentencePieceProcessor sp;
};

static int fail(char *err, size_t errn, int code, const std::string &msg) {
  std::snprintf(err, errn, "%s", msg.c_str());
  return code;
}

// The library's message without its "file.cc(line) [condition] " prefix,
// which tells a user nothing; `otherwise` where nothing is left.
static std::string said(const sentencepiece::util::Status &st, const char *otherwise) {
  std::string m = st.message();
  size_t at = m.find(") [");
  if (at != std::string::npos && m.compare(0, 6, "./src/") == 0) {
    size_t end = m.find("] ", at);
    m = end == std::string::npos ? "" : m.substr(end + 2);
  }
  while (!m.empty() && (m.back() == ' ' || m.back() == '\n')) m.pop_back();
  return m.empty() ? otherwise : m;
}

extern "C" int zt_spm_load(zt_spm **s, const char *path, char *err, size_t errn) {
  *s = nullptr;
  try {
    zt_spm *t = new zt_spm;
    auto st = t->sp.Load(path);
    if (!st.ok()) {
      delete t;
      return fail(err, errn, ZT_EINPUT, said(st, "not a SentencePiece model file"));
    }
    *s = t;
    return ZT_OK;
  } catch (const std::exception &x) {
    return fail(err, errn, ZT_ERUNTIME, x.what());
  }
}

extern "C" void zt_spm_free(zt_spm *s) { delete s; }
extern "C" int zt_spm_vocab(const zt_spm *s) { return s->sp.GetPieceSize(); }
extern "C" int zt_spm_eos(const zt_spm *s) { return s->sp.eos_id(); }

extern "C" int zt_spm_encode(zt_spm *s, const char *text, size_t n, zt_ids *out, char *err,
                             size_t errn) {
  try {
    std::vector<int> ids;
    auto st = s->sp.Encode(absl::string_view(text, n), &ids);
    if (!st.ok()) return fail(err, errn, ZT_EINPUT, said(st, "encoding failed"));
    std::vector<uint32_t> u(ids.begin(), ids.end());
    if (zt_ids_push(out, u.data(), (int64_t)u.size())) return fail(err, errn, ZT_ERUNTIME, "out of memory");
    return ZT_OK;
  } catch (const std::exception &x) {
    return fail(err, errn, ZT_ERUNTIME, x.what());
  }
}

extern "C" int zt_spm_decode(const zt_spm *s, const uint32_t *ids, int64_t n, char **text,
                             size_t *len, char *err, size_t errn) {
  try {
    std::vector<int> v;
    v.reserve((size_t)n);
    for (int64_t i = 0; i < n; i++) {
      if (ids[i] >= (uint32_t)s->sp.GetPieceSize())
        return fail(err, errn, ZT_EINPUT,
                    "token id " + std::to_string(ids[i]) + " at " + std::to_string(i) +
                        " is not in the tokenizer's vocabulary (" +
                        std::to_string(s->sp.GetPieceSize()) + " ids)");
      v.push_back((int)ids[i]);
    }
    std::string out;
    auto st = s->sp.Decode(v, &out);
    if (!st.ok()) return fail(err, errn, ZT_EINPUT, said(st, "decoding failed"));
    char *r = (char *)std::malloc(out.size() + 1);
    if (!r) return fail(err, errn, ZT_ERUNTIME, "out of memory");
    std::memcpy(r, out.data(), out.size());
    r[out.size()] = 0;
    *text = r;
    *len = out.size();
    return ZT_OK;
  } catch (const std::exception &x) {
    return fail(err, errn, ZT_ERUNTIME, x.what());
  }
}

// The trainer reads sentences from here: every line of every text, so
// nothing but the model is written (no input copy on disk).
namespace {
class Lines : public sentencepiece::SentenceIterator {
 public:
  Lines(const char *const *t, const size_t *l, int n) : texts_(t), lens_(l), n_(n) { Next(); }
  bool done() const override { return file_ >= n_; }
  const std::string &value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }
  void Next() override {
    while (file_ < n_) {
      if (pos_ >= lens_[file_]) {
        file_++, pos_ = 0;
        continue;
      }
      const char *s = texts_[file_] + pos_;
      const char *nl = (const char *)std::memchr(s, '\n', lens_[file_] - pos_);
      size_t len = nl ? (size_t)(nl - s) : lens_[file_] - pos_;
      pos_ += len + 1;
      if (!len) continue;
      line_.assign(s, len);
      return;
    }
  }

 private:
  const char *const *texts_;
  const size_t *lens_;
  int n_, file_ = 0;
  size_t pos_ = 0;
  std::string line_;
};
}  // namespace

extern "C" int zt_spm_train(const char *const *texts, const size_t *lens, int ntexts, int vocab,
                            const char *out, char *err, size_t errn) {
  try {
    // LLaMA 2's recipe: BPE with byte fallback (every byte encodes, no
    // unknown token in practice), digits split, text kept as it is
    // (identity normalization, whitespace kept) so decoding gives it back.
    // hard_vocab_limit off: a small corpus gets the vocabulary it can fill.
    std::unordered_map<std::string, std::string> kw = {
        {"model_type", "bpe"},
        {"vocab_size", std::to_string(vocab)},
        {"byte_fallback", "true"},
        {"split_digits", "true"},
        {"normalization_rule_name", "identity"},
        {"remove_extra_whitespaces", "false"},
        {"allow_whitespace_only_pieces", "true"},
        {"character_coverage", "0.9995"},
        {"hard_vocab_limit", "false"},
        {"max_sentence_length", "65536"},
        {"input_sentence_size", "10000000"},
        {"shuffle_input_sentence", "true"},
        {"minloglevel", "2"},
    };
    Lines it(texts, lens, ntexts);
    std::string model;
    auto st = sentencepiece::SentencePieceTrainer::Train(kw, &it, &model);
    if (!st.ok()) return fail(err, errn, ZT_EINPUT, "training the vocabulary: " + said(st, "failed"));
    std::ofstream f(out, std::ios::binary | std::ios::trunc);
    f.write(model.data(), (std::streamsize)model.size());
    f.close();
    if (!f) return fail(err, errn, ZT_ERUNTIME, std::string("cannot write ") + out);
    return ZT_OK;
  } catch (const std::exception &x) {
    return fail(err, errn, ZT_ERUNTIME, x.what());
  }
}
