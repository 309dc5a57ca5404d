// The BERT encoder (bert.h): config.json, the weights in one flat buffer laid out for the
// forward pass (q, k and v stacked into one matrix; every matrix and vector starting at a
// multiple of ParamLayout::kAlign elements, as cuBLASLt wants), and the forward pass over the
// whole batch on the Backend. Pooling and normalisation run on the host: they read each
// hidden value once, which a download costs anyway; so does the classification head, which
// reads one [CLS] row per text (a pooler of H x H and a classifier of num_labels x H).
#include "model/bert.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "io/safetensors.h"
#include "model/device_buffers.h"
#include "model/params.h"
#include "util/error.h"
#include "util/json.h"
#include "util/json_fields.h"

namespace sr1 {
namespace {

// A positive integer field; `fallback` 0 makes it required. JsonFields' errors name the field.
int positive_int(const JsonFields& f, const char* key, int64_t fallback = 0) {
  const int64_t v = fallback == 0 ? f.integer(key) : f.integer(key, fallback);
  if (v < 1 || v > 1000000000) {
    throw Error(std::string("'") + key + "' must be a positive integer, got " +
                std::to_string(v));
  }
  return static_cast<int>(v);
}

// Where one layer's tensors live in the flat buffer (offsets in floats).
struct BertLayer {
  size_t qkv_w, qkv_b;    // attention.self.{query,key,value}: [3H, H] and [3H], stacked
  size_t o_w, o_b;        // attention.output.dense
  size_t ln1_w, ln1_b;    // attention.output.LayerNorm
  size_t fc_w, fc_b;      // intermediate.dense [I, H]
  size_t proj_w, proj_b;  // output.dense [H, I]
  size_t ln2_w, ln2_b;    // output.LayerNorm
};

// A checkpoint tensor (BertModel's name, without "bert.") and where it is copied to.
struct Slot {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset;
};

class BertLayout {
 public:
  explicit BertLayout(const BertConfig& c) {
    const int64_t H = c.hidden_size, I = c.intermediate_size;
    wte = add("embeddings.word_embeddings.weight", {c.vocab_size, H});
    pte = add("embeddings.position_embeddings.weight", {c.max_position_embeddings, H});
    tte = add("embeddings.token_type_embeddings.weight", {c.type_vocab_size, H});
    ln_w = add("embeddings.LayerNorm.weight", {H});
    ln_b = add("embeddings.LayerNorm.bias", {H});
    for (int l = 0; l < c.num_layers; l++) {
      const std::string p = "encoder.layer." + std::to_string(l) + ".";
      BertLayer L{};
      L.qkv_w = add(p + "attention.self.query.weight", {H, H});
      add(p + "attention.self.key.weight", {H, H}, false);
      add(p + "attention.self.value.weight", {H, H}, false);
      L.qkv_b = add(p + "attention.self.query.bias", {H});
      add(p + "attention.self.key.bias", {H}, false);
      add(p + "attention.self.value.bias", {H}, false);
      L.o_w = add(p + "attention.output.dense.weight", {H, H});
      L.o_b = add(p + "attention.output.dense.bias", {H});
      L.ln1_w = add(p + "attention.output.LayerNorm.weight", {H});
      L.ln1_b = add(p + "attention.output.LayerNorm.bias", {H});
      L.fc_w = add(p + "intermediate.dense.weight", {I, H});
      L.fc_b = add(p + "intermediate.dense.bias", {I});
      L.proj_w = add(p + "output.dense.weight", {H, I});
      L.proj_b = add(p + "output.dense.bias", {H});
      L.ln2_w = add(p + "output.LayerNorm.weight", {H});
      L.ln2_b = add(p + "output.LayerNorm.bias", {H});
      layers.push_back(L);
    }
  }

  size_t total = 0;  // floats, alignment gaps included
  size_t wte = 0, pte = 0, tte = 0, ln_w = 0, ln_b = 0;
  std::vector<BertLayer> layers;
  std::vector<Slot> slots;

 private:
  size_t reserve(size_t n, bool aligned = true) {
    constexpr size_t A = ParamLayout::kAlign;
    if (aligned) total = (total + A - 1) / A * A;
    const size_t at = total;
    total += n;
    return at;
  }
  size_t add(const std::string& name, std::vector<int64_t> shape, bool aligned = true) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    const size_t at = reserve(n, aligned);
    slots.push_back(Slot{name, std::move(shape), at});
    return at;
  }
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The checkpoint tensor of BertModel's `name`: under `prefix` ("bert." in a BertFor*
// checkpoint), and with LayerNorm's gamma/beta names where old (TensorFlow-converted)
// checkpoints still use them.
const TensorView& find_tensor(const SafetensorsSet& w, const std::string& prefix,
                              const std::string& name) {
  if (const TensorView* t = w.find(prefix + name)) return *t;
  static const std::pair<std::string, std::string> kOldNames[] = {
      {"LayerNorm.weight", "LayerNorm.gamma"}, {"LayerNorm.bias", "LayerNorm.beta"}};
  for (const auto& [now, old] : kOldNames) {
    if (!ends_with(name, now)) continue;
    const std::string old_name = prefix + name.substr(0, name.size() - now.size()) + old;
    if (const TensorView* t = w.find(old_name)) return *t;
  }
  throw Error(w.source() + ": tensor '" + prefix + name +
              "' is missing (the BERT model config.json describes has it)");
}

// A checkpoint whose layers go past num_hidden_layers belongs to another config: refuse it
// rather than silently run its first layers. (The pooler and task heads are checked when
// loaded: BertHead.)
void check_layer_count(const SafetensorsSet& w, const std::string& prefix, int layers) {
  const std::string stem = prefix + "encoder.layer.";
  for (const std::string& name : w.names()) {
    if (name.compare(0, stem.size(), stem) != 0) continue;
    const long l = std::strtol(name.c_str() + stem.size(), nullptr, 10);
    if (l >= layers) {
      throw Error(w.source() + ": tensor '" + name + "' belongs to layer " + std::to_string(l) +
                  ", but config.json says num_hidden_layers = " + std::to_string(layers));
    }
  }
}

}  // namespace

BertConfig load_bert_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const json::Value root = json::parse_file(path);
  if (!root.is_object()) throw Error(path + ": expected a JSON object");
  const JsonFields f(root);
  BertConfig c;
  try {
    const std::string type = f.text("model_type", "");
    if (type != "bert") {
      throw Error("'model_type' " + (type.empty() ? std::string("is missing (expected \"bert\")")
                                                  : "'" + type + "' is not supported (bert)"));
    }
    c.vocab_size = positive_int(f, "vocab_size");
    c.hidden_size = positive_int(f, "hidden_size");
    c.intermediate_size = positive_int(f, "intermediate_size");
    c.num_layers = positive_int(f, "num_hidden_layers");
    c.num_heads = positive_int(f, "num_attention_heads");
    c.max_position_embeddings = positive_int(f, "max_position_embeddings");
    c.type_vocab_size = positive_int(f, "type_vocab_size", 2);
    if (c.hidden_size % c.num_heads != 0) {
      throw Error("'num_attention_heads' (" + std::to_string(c.num_heads) +
                  ") must divide hidden_size (" + std::to_string(c.hidden_size) + ")");
    }
    const double eps = f.number("layer_norm_eps", 1e-12);
    if (!(eps > 0)) throw Error("'layer_norm_eps' must be a positive number");
    c.layer_norm_eps = static_cast<float>(eps);
    // Hugging Face's "gelu" is the exact erf form; gelu_new and friends are tanh
    // approximations this encoder does not compute.
    const std::string act = f.text("hidden_act", "gelu");
    if (act != "gelu") throw Error("'hidden_act' '" + act + "' is not supported (gelu)");
    const std::string positions = f.text("position_embedding_type", "absolute");
    if (positions != "absolute") {
      throw Error("'position_embedding_type' '" + positions + "' is not supported (absolute)");
    }
    if (f.boolean("is_decoder", false)) {
      throw Error("'is_decoder' is true: a decoder's causal attention is not supported");
    }
    // transformers' PretrainedConfig: num_labels = len(id2label) when id2label is given.
    if (const json::Value* labels = root.find("id2label"); labels != nullptr && !labels->is_null()) {
      if (!labels->is_object() || labels->as_object().empty()) {
        throw Error("'id2label' must be an object of label names (\"0\": \"LABEL_0\", ...)");
      }
      c.num_labels = static_cast<int>(labels->as_object().size());
    } else {
      c.num_labels = positive_int(f, "num_labels", 2);
    }
  } catch (const Error& e) {
    throw Error(path + ": field " + e.what());
  }
  return c;
}

Pooling parse_pooling(const std::string& name) {
  if (name == "mean") return Pooling::Mean;
  if (name == "cls") return Pooling::Cls;
  throw UsageError("--pooling must be mean or cls, not '" + name + "'");
}

namespace {

// Device buffers for batches of up to `rows` tokens in up to `seqs` sequences.
struct EncoderActivations : DeviceBuffers {
  size_t rows = 0;
  int seqs = 0;
  int32_t *ids, *pos, *types, *mask, *cls_rows;
  XPtr hidden;  // [N, H]: the embeddings, then each layer's output in place
  XPtr qkv;     // [N, 3H]
  XPtr att;     // [N, H]: attention output (the type and position embeddings before that)
  XPtr h;       // [N, H]: attention block output, the feed-forward's input and residual
  XPtr ffn;     // [N, I]: the feed-forward's inner activations
  XPtr cls;     // [B, H]: the [CLS] rows, for Pooling::Cls and the classification head
  explicit EncoderActivations(Backend& backend) : DeviceBuffers(backend) {}
};

}  // namespace

struct BertEncoder::Impl {
  explicit Impl(const BertConfig& c) : layout(c) {}
  BertLayout layout;
  float* params = nullptr;  // fp32 weights; released once converted when x_elem() != 4
  XPtr weights;             // the compute-type copy the layers read (aliases params on CPU)
  std::unique_ptr<EncoderActivations> acts;
  // BertHead::SequenceClassification, on the host in fp32: bert.pooler.dense [H, H] and [H],
  // classifier [num_labels, H] and [num_labels]. Empty without the head.
  std::vector<float> pooler_w, pooler_b, classifier_w, classifier_b;

  void reserve(Backend& be, const BertConfig& c, int B, int T);
  void layer_forward(Backend& be, const BertConfig& c, int l, const AttentionShape& s);
  // The [CLS] (first) row of each of the B sequences of T hidden rows, into acts->cls.
  void gather_cls(Backend& be, int B, int T, int H);
};

BertEncoder::BertEncoder(BertConfig config, Backend& backend)
    : config_(config), be_(backend), impl_(std::make_unique<Impl>(config_)) {}

BertEncoder::~BertEncoder() {
  impl_->acts.reset();
  if (!impl_->weights.null() && impl_->weights.p != impl_->params) {
    be_.release(impl_->weights.p);
  }
  if (impl_->params != nullptr) be_.release(impl_->params);
}

std::unique_ptr<BertEncoder> BertEncoder::load(const std::string& dir, Backend& backend,
                                               BertHead head) {
  std::unique_ptr<BertEncoder> enc(new BertEncoder(load_bert_config(dir), backend));
  const BertConfig& c = enc->config_;
  Impl& m = *enc->impl_;
  const BertLayout& L = m.layout;
  const SafetensorsSet w = SafetensorsSet::open_dir(dir);
  const std::string prefix =
      w.find("bert.embeddings.word_embeddings.weight") != nullptr ? "bert." : "";
  check_layer_count(w, prefix, c.num_layers);
  for (const Slot& s : L.slots) check_f32(find_tensor(w, prefix, s.name), s.shape);
  if (head == BertHead::SequenceClassification) {
    // BertForSequenceClassification: bert.pooler.dense (BertPooler) and classifier, an
    // nn.Linear(hidden_size, num_labels) outside the "bert." prefix (transformers'
    // models/bert/modeling_bert.py).
    const int64_t H = c.hidden_size, NL = c.num_labels;
    const auto read = [&](const TensorView& t, std::vector<int64_t> shape, std::vector<float>& to) {
      to.resize(static_cast<size_t>(t.numel()));
      read_f32(t, shape, to.data());
    };
    read(find_tensor(w, prefix, "pooler.dense.weight"), {H, H}, m.pooler_w);
    read(find_tensor(w, prefix, "pooler.dense.bias"), {H}, m.pooler_b);
    for (const char* name : {"classifier.weight", "classifier.bias"}) {
      if (w.find(name) == nullptr) {
        throw Error(w.source() + ": tensor '" + name + "' is missing: not a sequence " +
                    "classification checkpoint (BertForSequenceClassification, a cross-encoder)");
      }
    }
    read(*w.find("classifier.weight"), {NL, H}, m.classifier_w);
    read(*w.find("classifier.bias"), {NL}, m.classifier_b);
  }

  m.params = backend.alloc(L.total);
  backend.zero(m.params, L.total);  // the alignment gaps
  std::vector<float> staging;       // one tensor at a time, converted to fp32
  for (const Slot& s : L.slots) {
    const TensorView& t = find_tensor(w, prefix, s.name);
    staging.resize(static_cast<size_t>(t.numel()));
    read_f32(t, s.shape, staging.data());
    backend.upload(m.params + s.offset, staging.data(), staging.size());
  }

  if (backend.x_elem() == sizeof(float)) {
    m.weights = XPtr{m.params, sizeof(float)};
  } else {
    m.weights = backend.alloc_x(L.total);
    backend.to_x(m.weights, m.params, L.total);
    backend.release(m.params);  // inference only: the fp32 copy has no further use
    m.params = nullptr;
  }
  return enc;
}

void BertEncoder::Impl::reserve(Backend& be, const BertConfig& c, int B, int T) {
  const size_t N = static_cast<size_t>(B) * T;
  EncoderActivations* a = acts.get();
  if (a != nullptr && N <= a->rows && B <= a->seqs) return;
  // Grow to the larger of the old and new shapes, so alternating shapes do not thrash.
  const size_t rows = std::max(N, a != nullptr ? a->rows : 0);
  const int seqs = std::max(B, a != nullptr ? a->seqs : 0);
  acts.reset();  // free before allocating the larger set
  auto fresh = std::make_unique<EncoderActivations>(be);
  const size_t H = c.hidden_size, I = c.intermediate_size;
  fresh->rows = rows;
  fresh->seqs = seqs;
  fresh->ids = fresh->i(rows);
  fresh->pos = fresh->i(rows);
  fresh->types = fresh->i(rows);
  fresh->mask = fresh->i(rows);
  fresh->cls_rows = fresh->i(seqs);
  fresh->hidden = fresh->x(rows * H);
  fresh->qkv = fresh->x(rows * 3 * H);
  fresh->att = fresh->x(rows * H);
  fresh->h = fresh->x(rows * H);
  fresh->ffn = fresh->x(rows * I);
  fresh->cls = fresh->x(seqs * H);
  acts = std::move(fresh);
}

// Post-LayerNorm BERT layer, in place on acts->hidden:
//   h = LN1(x + dense(attention(qkv(x))));  x = LN2(h + proj(gelu(fc(h))))
void BertEncoder::Impl::layer_forward(Backend& be, const BertConfig& c, int l,
                                      const AttentionShape& s) {
  EncoderActivations& a = *acts;
  const BertLayer& L = layout.layers[l];
  const XPtr P = weights;
  const int N = s.B * s.T, H = c.hidden_size, I = c.intermediate_size;
  const size_t NH = static_cast<size_t>(N) * H;
  const float eps = c.layer_norm_eps;

  be.matmul_forward(a.qkv, a.hidden, P + L.qkv_w, P + L.qkv_b, N, H, 3 * H);
  be.attention_forward(a.att, nullptr, a.qkv, a.mask, s);
  be.matmul_forward(a.h, a.att, P + L.o_w, P + L.o_b, N, H, H);
  be.add(a.h, a.h, a.hidden, NH);
  be.layernorm_forward(a.h, a.h, P + L.ln1_w, P + L.ln1_b, N, H, eps);
  be.matmul_forward(a.ffn, a.h, P + L.fc_w, P + L.fc_b, N, H, I);
  be.gelu_forward(a.ffn, a.ffn, static_cast<size_t>(N) * I);
  be.matmul_forward(a.hidden, a.ffn, P + L.proj_w, P + L.proj_b, N, I, H);
  be.add(a.hidden, a.hidden, a.h, NH);
  be.layernorm_forward(a.hidden, a.hidden, P + L.ln2_w, P + L.ln2_b, N, H, eps);
}

bool BertEncoder::has_classifier() const { return !impl_->classifier_w.empty(); }

std::vector<int> BertEncoder::forward(const int32_t* ids, const int32_t* types,
                                      const int32_t* mask, int B, int T) {
  const BertConfig& c = config_;
  if (T > c.max_position_embeddings) {
    throw Error("BERT encoder: sequences of " + std::to_string(T) +
                " tokens exceed the model's max_position_embeddings (" +
                std::to_string(c.max_position_embeddings) + ")");
  }
  const int H = c.hidden_size, N = B * T;
  // Padding ids (and types) become 0: their rows are computed but never seen (keys are
  // masked, and pooling skips them), so any id there is harmless once it indexes the table.
  std::vector<int32_t> tok(N), pos(N), type(N, 0), key(N);
  std::vector<int> real(B, 0);
  const auto where = [](int b, int t) {
    return " at [" + std::to_string(b) + ", " + std::to_string(t) + "]";
  };
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      const int i = b * T + t;
      key[i] = mask[i] != 0;
      pos[i] = t;
      real[b] += key[i];
      if (!key[i]) continue;
      if (ids[i] < 0 || ids[i] >= c.vocab_size) {
        throw Error("BERT encoder: token id " + std::to_string(ids[i]) + where(b, t) +
                    " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
      }
      tok[i] = ids[i];
      if (types == nullptr) continue;
      if (types[i] < 0 || types[i] >= c.type_vocab_size) {
        throw Error("BERT encoder: token type " + std::to_string(types[i]) + where(b, t) +
                    " is outside [0, " + std::to_string(c.type_vocab_size) + ") (type_vocab_size)");
      }
      type[i] = types[i];
    }
    if (real[b] == 0) {
      throw Error("BERT encoder: row " + std::to_string(b) +
                  " has no token (its attention mask is all 0)");
    }
  }

  Impl& m = *impl_;
  m.reserve(be_, c, B, T);
  EncoderActivations& a = *m.acts;
  be_.upload_i32(a.ids, tok.data(), N);
  be_.upload_i32(a.pos, pos.data(), N);
  be_.upload_i32(a.types, type.data(), N);
  be_.upload_i32(a.mask, key.data(), N);
  const BertLayout& L = m.layout;
  const XPtr P = m.weights;
  const size_t NH = static_cast<size_t>(N) * H;
  // BertEmbeddings.forward (transformers' modeling_bert.py), in its order:
  // (inputs_embeds + token_type_embeddings) + position_embeddings, then LayerNorm.
  be_.embedding_forward(a.hidden, a.ids, P + L.wte, N, H);
  be_.embedding_forward(a.att, a.types, P + L.tte, N, H);
  be_.add(a.hidden, a.hidden, a.att, NH);
  be_.embedding_forward(a.att, a.pos, P + L.pte, N, H);
  be_.add(a.hidden, a.hidden, a.att, NH);
  be_.layernorm_forward(a.hidden, a.hidden, P + L.ln_w, P + L.ln_b, N, H, c.layer_norm_eps);
  AttentionShape shape{B, T, c.num_heads, c.num_heads, c.head_dim()};
  shape.causal = false;
  for (int l = 0; l < c.num_layers; l++) m.layer_forward(be_, c, l, shape);
  return real;
}

namespace {

void check_batch(int B, int T) {
  if (B < 0 || T < 1) {
    throw Error("BERT encoder: a batch of " + std::to_string(B) + " x " + std::to_string(T) +
                " tokens");
  }
}

}  // namespace

void BertEncoder::Impl::gather_cls(Backend& be, int B, int T, int H) {
  std::vector<int32_t> rows(B);
  for (int b = 0; b < B; b++) rows[b] = b * T;
  be.upload_i32(acts->cls_rows, rows.data(), B);
  be.gather_rows(acts->cls, acts->hidden, acts->cls_rows, B, H);
}

void BertEncoder::encode(const int32_t* ids, const int32_t* mask, int B, int T, Pooling pooling,
                         bool normalize, float* out) {
  check_batch(B, T);
  if (B == 0) return;
  const std::vector<int> real = forward(ids, nullptr, mask, B, T);
  const int H = config_.hidden_size;
  const size_t NH = static_cast<size_t>(B) * T * H;
  EncoderActivations& a = *impl_->acts;

  // Search-R1's pooling(): the masked mean of the last hidden state, or its [CLS] row.
  if (pooling == Pooling::Cls) {
    impl_->gather_cls(be_, B, T, H);
    be_.download_x(out, a.cls, static_cast<size_t>(B) * H);
  } else {
    std::vector<float> hidden(NH);
    be_.download_x(hidden.data(), a.hidden, NH);
    std::vector<double> sum(H);
    for (int b = 0; b < B; b++) {
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int t = 0; t < T; t++) {
        if (mask[b * T + t] == 0) continue;
        const float* row = hidden.data() + static_cast<size_t>(b * T + t) * H;
        for (int k = 0; k < H; k++) sum[k] += row[k];
      }
      float* o = out + static_cast<size_t>(b) * H;
      for (int k = 0; k < H; k++) o[k] = static_cast<float>(sum[k] / real[b]);
    }
  }
  if (!normalize) return;
  // torch.nn.functional.normalize: x / max(||x||_2, 1e-12)
  for (int b = 0; b < B; b++) {
    float* o = out + static_cast<size_t>(b) * H;
    double ss = 0;
    for (int k = 0; k < H; k++) ss += static_cast<double>(o[k]) * o[k];
    const float norm = std::max(static_cast<float>(std::sqrt(ss)), 1e-12f);
    for (int k = 0; k < H; k++) o[k] /= norm;
  }
}

void BertEncoder::classify(const int32_t* ids, const int32_t* types, const int32_t* mask, int B,
                           int T, float* out) {
  const Impl& m = *impl_;
  if (!has_classifier()) {
    throw Error("BERT encoder: loaded without its sequence-classification head");
  }
  check_batch(B, T);
  if (B == 0) return;
  forward(ids, types, mask, B, T);
  const int H = config_.hidden_size, NL = config_.num_labels;
  EncoderActivations& a = *impl_->acts;
  impl_->gather_cls(be_, B, T, H);
  std::vector<float> cls(static_cast<size_t>(B) * H), pooled(H);
  be_.download_x(cls.data(), a.cls, cls.size());
  // BertPooler: tanh(dense(hidden_states[:, 0])); BertForSequenceClassification: dropout
  // (the identity at inference), then classifier (nn.Linear). Sums in double.
  for (int b = 0; b < B; b++) {
    const float* x = cls.data() + static_cast<size_t>(b) * H;
    for (int j = 0; j < H; j++) {
      const float* w = m.pooler_w.data() + static_cast<size_t>(j) * H;
      double acc = m.pooler_b[j];
      for (int k = 0; k < H; k++) acc += static_cast<double>(w[k]) * x[k];
      pooled[j] = std::tanh(static_cast<float>(acc));
    }
    for (int l = 0; l < NL; l++) {
      const float* w = m.classifier_w.data() + static_cast<size_t>(l) * H;
      double acc = m.classifier_b[l];
      for (int k = 0; k < H; k++) acc += static_cast<double>(w[k]) * pooled[k];
      out[static_cast<size_t>(b) * NL + l] = static_cast<float>(acc);
    }
  }
}

}  // namespace sr1
