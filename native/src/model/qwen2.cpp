#include "model/qwen2.h"

#include <algorithm>
#include <set>

#include "model/device_buffers.h"
#include "util/error.h"

namespace sr1 {

// Device buffers for one batch shape. `layers` holds one set per layer when the backward
// pass needs them all, or a single reused set (scoring, or recomputation). `xs` holds every
// layer's input for a backward pass, which reads them again (a recomputed layer from its
// input); a forward-only pass (log-probs, values) reads each once, so two slots used in turn
// hold the current layer's input and output.
struct Qwen2Model::Activations : DeviceBuffers {
  struct Layer {
    XPtr ln1;
    float* rstd1;
    XPtr qkv, att;
    float* lse;
    XPtr h, ln2;
    float* rstd2;
    XPtr gu, act;
  };
  size_t rows = 0;    // B*T capacity
  size_t hidden = 0;  // H
  int sets = 0, chunk = 0, inputs = 0;
  bool backward = false;
  AttentionShape shape;

  int32_t *ids, *mask, *pos, *head_rows, *targets;
  XPtr xs;  // [inputs, N, H]: the layers' inputs, then the last layer's output
  std::vector<Layer> layers;
  XPtr lnf, head_in, logits;
  XPtr values;  // a critic's value per row; then its gradient
  float *rstdf, *logprob, *entropy;
  // backward only
  XPtr dres, dln, dqkv, datt, dgu, dact, dlnf, dhead_in;
  float *coef, *ent_coef;

  // The buffers of passes over up to `N` rows: `sets` layer sets, `inputs` layer inputs, a
  // head chunk of `chunk` rows, the backward's own with `backward`; allocated from `backend`,
  // or with none only counted (bytes()), which is how the memory plan sizes them.
  Activations(Backend* backend, size_t x_elem, const ModelConfig& c, size_t N, int sets_,
              int inputs_, int chunk_, bool backward_)
      : DeviceBuffers(backend, x_elem),
        rows(N),
        hidden(c.hidden_size),
        sets(sets_),
        chunk(chunk_),
        inputs(inputs_),
        backward(backward_) {
    const size_t H = c.hidden_size, I = c.intermediate_size, QKV = c.qkv_dim(), Q = c.q_dim(),
                 V = c.vocab_size, C = chunk;
    ids = i(N);
    mask = i(N);
    pos = i(N);
    head_rows = i(N);
    targets = i(N);
    xs = x(inputs * N * H);
    for (int s = 0; s < sets; s++) {
      layers.push_back(Layer{x(N * H), f(N), x(N * QKV), x(N * Q), f(N * c.num_heads), x(N * H),
                             x(N * H), f(N), x(N * 2 * I), x(N * I)});
    }
    lnf = x(N * H);
    rstdf = f(N);
    logprob = f(N);
    entropy = f(N);
    head_in = x(C * H);
    logits = x(C * V);
    values = x(N);
    if (!backward) return;
    dres = x(N * H);
    dln = x(N * H);
    dqkv = x(N * QKV);
    datt = x(N * Q);
    dgu = x(N * 2 * I);
    dact = x(N * I);
    dlnf = x(N * H);
    coef = f(N);
    ent_coef = f(N);
    dhead_in = x(C * H);
  }
  // The input of layer l (l = L: the last layer's output), in the current batch's shape.
  XPtr input(int l) const {
    return xs + static_cast<size_t>(l % inputs) * shape.B * shape.T * hidden;
  }
};

Qwen2Model::Qwen2Model(ModelConfig config, Backend& backend, Head head, size_t pad_multiple)
    : config_(std::move(config)),
      head_(head),
      be_(backend),
      layout_(config_, head),
      capacity_((layout_.total() + pad_multiple - 1) / pad_multiple * pad_multiple) {}

Qwen2Model::~Qwen2Model() {
  acts_.reset();
  if (!weights_.null() && weights_.p != params_) be_.release(weights_.p);
  if (params_ != nullptr) be_.release(params_);
  if (grads_ != nullptr) be_.release(grads_);
}

std::unique_ptr<Qwen2Model> Qwen2Model::load(const std::string& dir, Backend& backend,
                                             Head head, size_t pad_multiple) {
  if (pad_multiple < 1) throw Error("Qwen2Model::load: pad_multiple must be >= 1");
  std::unique_ptr<Qwen2Model> model(
      new Qwen2Model(load_model_config(dir), backend, head, pad_multiple));
  model->params_ = backend.alloc(model->capacity_);
  backend.zero(model->params_, model->capacity_);  // the alignment gaps and the padding
  model->load_weights(dir, true);
  return model;
}

void Qwen2Model::check_config(const std::string& dir) const {
  const ModelConfig c = load_model_config(dir);
  const ModelConfig& o = config_;
  const bool same = c.model_type == o.model_type && c.vocab_size == o.vocab_size &&
                    c.hidden_size == o.hidden_size &&
                    c.intermediate_size == o.intermediate_size &&
                    c.num_layers == o.num_layers && c.num_heads == o.num_heads &&
                    c.num_kv_heads == o.num_kv_heads && c.head_dim == o.head_dim &&
                    c.tie_word_embeddings == o.tie_word_embeddings &&
                    c.attention_bias == o.attention_bias;
  if (!same) {
    throw Error(dir + "/config.json: the model's architecture differs from the loaded one (" +
                "same model_type, sizes, heads, layers and tying are required)");
  }
  if (c.rope_theta != o.rope_theta || c.rms_norm_eps != o.rms_norm_eps) {
    throw Error(dir + "/config.json: rope_theta or rms_norm_eps differs from the loaded model");
  }
}

void Qwen2Model::check_weights(const std::string& dir) const {
  check_config(dir);
  check_tensors(SafetensorsSet::open_dir(dir), false);
}

void Qwen2Model::reload_weights(const std::string& dir) {
  check_config(dir);
  load_weights(dir, false);
}

void Qwen2Model::check_tensors(const SafetensorsSet& weights, bool fresh_value_head) const {
  std::set<std::string> expected;
  const auto value_head = [](const std::string& name) { return name.rfind("score.", 0) == 0; };
  // A fresh value head means a folder with none of it (a causal LM's), not a partial one.
  bool any_value_head = false;
  for (const std::string& name : weights.names()) any_value_head |= value_head(name);
  for (const ParamTensor& t : layout_.tensors()) {
    const TensorView* view = weights.find(t.name);
    if (view == nullptr && fresh_value_head && !any_value_head && value_head(t.name)) continue;
    if (view == nullptr) {
      throw Error(weights.source() + ": tensor '" + t.name +
                  "' is missing (the model in config.json has it)");
    }
    check_f32(*view, t.shape);
    expected.insert(t.name);
  }
  for (const std::string& name : weights.names()) {
    // Tied checkpoints sometimes carry a redundant lm_head copy; the embedding is used.
    // (A critic started from a causal LM has no use for its lm_head either.)
    const bool redundant_head =
        name == "lm_head.weight" && (config_.tie_word_embeddings || head_ == Head::Value);
    const bool rotary_buffer = name.find("rotary_emb.inv_freq") != std::string::npos;
    if (!expected.count(name) && !redundant_head && !rotary_buffer) {
      throw Error(weights.source() + ": tensor '" + name +
                  "' is not part of the model config.json describes");
    }
  }
}

void Qwen2Model::load_weights(const std::string& dir, bool fresh_value_head) {
  const SafetensorsSet weights = SafetensorsSet::open_dir(dir);
  // Every check comes before the first write, so a bad folder leaves the weights intact.
  check_tensors(weights, fresh_value_head);
  host_current_ = false;
  // Converted one tensor at a time, so loading never holds a second full copy. Without
  // masters, each tensor reaches the compute copy through a bounded fp32 staging buffer on
  // the device, converted there as params_changed() converts the masters.
  std::vector<float> staging;
  constexpr size_t kPiece = size_t{1} << 24;  // floats: 64 MiB of device staging at most
  float* device = nullptr;
  if (params_ == nullptr) {
    size_t largest = 0;
    for (const ParamTensor& t : layout_.tensors()) largest = std::max(largest, t.numel);
    device = be_.alloc(std::min(largest, kPiece));
  }
  try {
    for (const ParamTensor& t : layout_.tensors()) {
      if (weights.find(t.name) == nullptr) continue;  // a fresh value head
      staging.resize(t.numel);
      read_f32(*weights.find(t.name), t.shape, staging.data());
      if (params_ != nullptr) {
        be_.upload(params_ + t.offset, staging.data(), t.numel);
        continue;
      }
      for (size_t at = 0; at < t.numel; at += kPiece) {
        const size_t k = std::min(kPiece, t.numel - at);
        be_.upload(device, staging.data() + at, k);
        be_.to_x(weights_ + (t.offset + at), device, k);
      }
    }
  } catch (...) {
    if (device != nullptr) be_.release(device);
    throw;
  }
  if (device != nullptr) {
    be_.synchronize();  // the last conversion has read the staging buffer
    be_.release(device);
    return;
  }
  params_changed();
}

float* Qwen2Model::grads() {
  if (grads_ == nullptr) {
    grads_ = be_.alloc(capacity_);
    be_.zero(grads_, capacity_);
  }
  return grads_;
}

void Qwen2Model::params_changed() {
  if (params_ == nullptr) {
    throw Error("params_changed: this model's fp32 master weights were dropped");
  }
  host_current_ = false;
  if (weights_.null()) {
    weights_ =
        be_.x_elem() == sizeof(float) ? XPtr{params_, sizeof(float)} : be_.alloc_x(capacity_);
  }
  be_.to_x(weights_, params_, capacity_);
}

void Qwen2Model::drop_masters() {
  if (params_ == nullptr || weights_.p == params_) return;
  be_.synchronize();
  be_.release(params_);
  params_ = nullptr;
}

void Qwen2Model::release_grads() {
  if (grads_ == nullptr) return;
  be_.synchronize();
  be_.release(grads_);
  grads_ = nullptr;
}

void Qwen2Model::to_host() {
  if (weights_.null()) return;
  const size_t bytes = capacity_ * weights_.elem;
  if (host_weights_.empty()) host_weights_ = HostBuffer(be_, bytes);
  if (!host_current_) {
    be_.download_bytes(host_weights_.data(), weights_.p, bytes);
    host_current_ = true;
  }
  acts_.reset();
  be_.synchronize();  // the last pass has read the weights
  be_.release(weights_.p);
  if (params_ == weights_.p) params_ = nullptr;  // the CPU: the compute copy is the masters
  weights_.p = nullptr;
}

void Qwen2Model::release_activations() {
  acts_.reset();
  if (lora_) lora_->release_scratch();
}

void Qwen2Model::attach_lora(std::unique_ptr<LoraAdapters> adapters) {
  if (adapters->config().value_head != (head_ == Head::Value)) {
    throw Error(head_ == Head::Value
                    ? "LoRA: a critic's adapters train its value head too (modules_to_save score)"
                    : "LoRA: adapters with a value head (modules_to_save score) are a critic's");
  }
  if (sink_ != nullptr) throw Error("LoRA: the model hands its gradients to a sink (ZeRO stage 2)");
  release_grads();
  lora_ = std::move(adapters);
  adapters_on_ = true;
}

void Qwen2Model::to_device() {
  if (!on_host()) return;
  weights_ = be_.alloc_x(capacity_);
  be_.upload_bytes(weights_.p, host_weights_.data(), host_weights_.bytes());
  if (weights_.elem == sizeof(float)) params_ = static_cast<float*>(weights_.p);
}

size_t Qwen2Model::master_bytes() const {
  return params_ != nullptr && weights_.p != params_ ? capacity_ * sizeof(float) : 0;
}
size_t Qwen2Model::weight_bytes() const {
  return weights_.null() ? 0 : capacity_ * weights_.elem;
}
size_t Qwen2Model::grad_bytes() const { return grads_ != nullptr ? capacity_ * sizeof(float) : 0; }

void Qwen2Model::zero_grad() { be_.zero(grads(), capacity_); }

std::vector<std::pair<size_t, size_t>> Qwen2Model::gradient_regions() const {
  return gradient_regions(layout_, capacity_);
}

std::vector<std::pair<size_t, size_t>> Qwen2Model::gradient_regions(const ParamLayout& layout,
                                                                    size_t capacity) {
  const int L = static_cast<int>(layout.layers());
  const auto layer_begin = [&](int l) { return l < L ? layout.layer(l).ln1 : layout.norm(); };
  std::vector<std::pair<size_t, size_t>> out{{layout.norm(), capacity}};
  for (int l = L - 1; l >= 0; l--) out.emplace_back(layer_begin(l), layer_begin(l + 1));
  out.emplace_back(0, layer_begin(0));
  return out;
}

void Qwen2Model::begin_pass() {
  if (lora_ != nullptr) {  // the base is frozen: the adapters' gradients alone
    lora_->grads();
    return;
  }
  if (sink_ == nullptr) {
    grads();
    return;
  }
  const auto regions = gradient_regions();
  embed_grad_ = sink_->open(regions.back().first, regions.back().second);
  open_region(regions.front().first, regions.front().second);
}

void Qwen2Model::open_region(size_t begin, size_t end) {
  region_begin_ = begin;
  region_end_ = end;
  region_grad_ = sink_->open(begin, end);
}

void Qwen2Model::close_region() { sink_->close(region_grad_, region_begin_, region_end_); }

void Qwen2Model::close_embeddings() {
  const auto [begin, end] = gradient_regions().back();
  sink_->close(embed_grad_, begin, end);
}

float* Qwen2Model::grad(size_t offset) {
  if (lora_ != nullptr) return nullptr;  // frozen: the backward skips the weight's gradient
  if (sink_ == nullptr) return grads_ + offset;
  const size_t embed = config_.num_layers > 0 ? layout_.layer(0).ln1 : layout_.norm();
  if (offset < embed) return embed_grad_ + offset;
  if (offset < region_begin_ || offset >= region_end_) {
    throw Error("gradient of parameter " + std::to_string(offset) +
                " outside the open region (a bug)");
  }
  return region_grad_ + (offset - region_begin_);
}

void Qwen2Model::empty_pass() {
  begin_pass();
  const auto regions = gradient_regions();
  for (size_t r = 0; r + 1 < regions.size(); r++) {
    if (r > 0) open_region(regions[r].first, regions[r].second);
    close_region();
  }
  close_embeddings();
}

void Qwen2Model::save_weights(const std::string& dir, DType dtype, uint64_t max_shard_bytes,
                              const float* given) {
  std::vector<float> host;
  if (given == nullptr) {
    host.resize(layout_.total());
    if (params_ != nullptr) {
      be_.download(host.data(), params_, host.size());
    } else {
      be_.download_x(host.data(), weights_, host.size());
    }
    given = host.data();
  }
  std::vector<std::vector<uint16_t>> converted;  // keeps 16-bit copies alive until written
  std::vector<TensorOut> out;
  for (const ParamTensor& t : layout_.tensors()) {
    const float* src = given + t.offset;
    if (dtype == DType::F32) {
      out.push_back(TensorOut{t.name, dtype, t.shape, src});
      continue;
    }
    if (dtype != DType::BF16 && dtype != DType::F16) {
      throw Error(std::string("cannot save weights as ") + dtype_name(dtype));
    }
    std::vector<uint16_t> half(t.numel);
    for (size_t k = 0; k < t.numel; k++) {
      half[k] = dtype == DType::BF16 ? f32_to_bf16(src[k]) : f32_to_f16(src[k]);
    }
    converted.push_back(std::move(half));
    out.push_back(TensorOut{t.name, dtype, t.shape, converted.back().data()});
  }
  write_model_weights(dir, out, max_shard_bytes);
}

int Qwen2Model::logits_rows(int chunk, size_t N) {
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(chunk, N)));
}

int Qwen2Model::logits_rows(const RunOptions& opt, size_t N) const {
  const bool cuda = be_.name() == "cuda";
  return logits_rows(opt.logits_chunk > 0 ? opt.logits_chunk : default_logits_chunk(cuda), N);
}

// A backward pass without recomputation keeps every layer's set; the others, one reused.
int Qwen2Model::layer_sets(const ModelConfig& c, bool for_backward, bool recompute) {
  return for_backward && !recompute ? c.num_layers : 1;
}

// A backward pass reads every layer's input again; a forward-only pass uses two in turn.
int Qwen2Model::layer_inputs(const ModelConfig& c, bool for_backward) {
  return for_backward ? c.num_layers + 1 : 2;
}

size_t Qwen2Model::activation_bytes(const ModelConfig& c, size_t x_elem, size_t N,
                                    bool for_backward, bool recompute, int chunk) {
  return Activations(nullptr, x_elem, c, N, layer_sets(c, for_backward, recompute),
                     layer_inputs(c, for_backward), logits_rows(chunk, N), for_backward)
      .bytes();
}

void Qwen2Model::reserve(const Batch& batch, bool for_backward, const RunOptions& opt) {
  const size_t N = static_cast<size_t>(batch.B) * batch.T;
  const int sets = layer_sets(config_, for_backward, opt.recompute);
  const int inputs = layer_inputs(config_, for_backward);
  const int chunk = logits_rows(opt, N);
  Activations* a = acts_.get();
  const bool fits = a != nullptr && N <= a->rows && sets <= a->sets && chunk <= a->chunk &&
                    (a->backward || !for_backward);
  if (!fits) {
    acts_.reset();  // free before allocating the larger set
    acts_ = std::make_unique<Activations>(&be_, be_.x_elem(), config_, N, sets, inputs, chunk,
                                          for_backward);
    a = acts_.get();
  }
  a->shape = AttentionShape{batch.B, batch.T, config_.num_heads, config_.num_kv_heads,
                            config_.head_dim};
  be_.upload_i32(a->ids, batch.ids.data(), N);
  be_.upload_i32(a->mask, batch.mask.data(), N);
  be_.upload_i32(a->pos, batch.positions.data(), N);
}

void Qwen2Model::layer_forward(int l, int set, XPtr x_out) {
  Activations& a = *acts_;
  const Activations::Layer& s = a.layers[set];
  const LayerParams& lp = layout_.layer(l);
  const ModelConfig& c = config_;
  const int N = a.shape.B * a.shape.T, H = c.hidden_size, I = c.intermediate_size;
  const XPtr P = weights_;
  const XPtr x_in = a.input(l);

  be_.rmsnorm_forward(s.ln1, s.rstd1, x_in, P + lp.ln1, N, H, c.rms_norm_eps);
  be_.matmul_forward(s.qkv, s.ln1, P + lp.qkv_w, c.attention_bias ? P + lp.qkv_b : XPtr{}, N, H,
                     c.qkv_dim());
  if (lora_on()) lora_->forward(l, LoraSite::Qkv, s.qkv, s.ln1, N);
  be_.rope_forward(s.qkv, a.pos, a.shape, c.rope_theta);
  be_.attention_forward(s.att, s.lse, s.qkv, a.mask, a.shape);
  be_.matmul_forward(s.h, s.att, P + lp.o_w, {}, N, c.q_dim(), H);
  if (lora_on()) lora_->forward(l, LoraSite::O, s.h, s.att, N);
  be_.add(s.h, s.h, x_in, static_cast<size_t>(N) * H);
  be_.rmsnorm_forward(s.ln2, s.rstd2, s.h, P + lp.ln2, N, H, c.rms_norm_eps);
  be_.matmul_forward(s.gu, s.ln2, P + lp.gu_w, {}, N, H, 2 * I);
  if (lora_on()) lora_->forward(l, LoraSite::GateUp, s.gu, s.ln2, N);
  be_.swiglu_forward(s.act, s.gu, N, I);
  if (x_out.null()) return;  // recomputation for backward needs no layer output
  be_.matmul_forward(x_out, s.act, P + lp.down_w, {}, N, I, H);
  if (lora_on()) lora_->forward(l, LoraSite::Down, x_out, s.act, N);
  be_.add(x_out, x_out, s.h, static_cast<size_t>(N) * H);
}

// On entry a.dres holds the gradient of the layer's output; on exit, of its input.
void Qwen2Model::layer_backward(int l, int set) {
  Activations& a = *acts_;
  const Activations::Layer& s = a.layers[set];
  const LayerParams& lp = layout_.layer(l);
  const ModelConfig& c = config_;
  const int N = a.shape.B * a.shape.T, H = c.hidden_size, I = c.intermediate_size;
  const XPtr P = weights_;
  const XPtr x_in = a.input(l);

  // Each adapter adds its part of the input gradient after its base matmul wrote it.
  const bool with_lora = lora_on();
  be_.matmul_backward(a.dact, grad(lp.down_w), nullptr, a.dres, s.act, P + lp.down_w, N, I, H,
                      false);
  if (with_lora) lora_->backward(l, LoraSite::Down, a.dact, a.dres, s.act, N);
  be_.swiglu_backward(a.dgu, a.dact, s.gu, N, I);
  be_.matmul_backward(a.dln, grad(lp.gu_w), nullptr, a.dgu, s.ln2, P + lp.gu_w, N, H, 2 * I,
                      false);
  if (with_lora) lora_->backward(l, LoraSite::GateUp, a.dln, a.dgu, s.ln2, N);
  // The residual gradient flows straight through; the norm adds its part (dres = dh).
  be_.rmsnorm_backward(a.dres, grad(lp.ln2), a.dln, s.h, P + lp.ln2, s.rstd2, N, H);
  be_.matmul_backward(a.datt, grad(lp.o_w), nullptr, a.dres, s.att, P + lp.o_w, N, c.q_dim(),
                      H, false);
  if (with_lora) lora_->backward(l, LoraSite::O, a.datt, a.dres, s.att, N);
  be_.attention_backward(a.dqkv, a.datt, s.qkv, s.att, s.lse, a.mask, a.shape);
  be_.rope_backward(a.dqkv, a.pos, a.shape, c.rope_theta);
  be_.matmul_backward(a.dln, grad(lp.qkv_w), c.attention_bias ? grad(lp.qkv_b) : nullptr,
                      a.dqkv, s.ln1, P + lp.qkv_w, N, H, c.qkv_dim(), false);
  if (with_lora) lora_->backward(l, LoraSite::Qkv, a.dln, a.dqkv, s.ln1, N);
  be_.rmsnorm_backward(a.dres, grad(lp.ln1), a.dln, x_in, P + lp.ln1, s.rstd1, N, H);
}

void Qwen2Model::forward(const Batch& batch, bool for_backward, const RunOptions& opt) {
  reserve(batch, for_backward, opt);
  Activations& a = *acts_;
  const ModelConfig& c = config_;
  const int N = batch.B * batch.T, H = c.hidden_size, L = c.num_layers;
  const bool keep_all = for_backward && !opt.recompute;
  be_.embedding_forward(a.input(0), a.ids, weights_ + layout_.embed(), N, H);
  for (int l = 0; l < L; l++) layer_forward(l, keep_all ? l : 0, a.input(l + 1));
  be_.rmsnorm_forward(a.lnf, a.rstdf, a.input(L), weights_ + layout_.norm(), N, H,
                      c.rms_norm_eps);
}

void Qwen2Model::head(const Batch& batch, const RunOptions& opt, TokenObjective* objective,
                      float* logprobs, float* entropy) {
  Activations& a = *acts_;
  const int H = config_.hidden_size, V = config_.vocab_size, N = batch.B * batch.T;
  // The hidden state at t-1 predicts token t. The rows the objective wants (all of them
  // without one) come first, in chunks of their own, and alone go through the backward
  // pass; the others follow, forward only, when logprobs asks for every log-prob. So the
  // gradient's bits do not depend on that request (`grad --loss ppo` is update_actor's):
  // a BLAS may round a row differently among other rows (OpenBLAS's Haswell sgemm does).
  std::vector<int32_t> rows, targets, out_index;
  std::vector<int32_t> rest_rows, rest_targets, rest_index;
  for (int b = 0; b < batch.B; b++) {
    for (int t = 1; t < batch.T; t++) {
      if (!batch.predicted(b, t)) continue;
      const int i = b * batch.T + t;
      const bool wanted = objective == nullptr || objective->wants(i);
      if (!wanted && logprobs == nullptr) continue;
      (wanted ? rows : rest_rows).push_back(i - 1);
      (wanted ? targets : rest_targets).push_back(batch.ids[i]);
      (wanted ? out_index : rest_index).push_back(i);
    }
  }
  const int n_backward = static_cast<int>(rows.size());
  rows.insert(rows.end(), rest_rows.begin(), rest_rows.end());
  targets.insert(targets.end(), rest_targets.begin(), rest_targets.end());
  out_index.insert(out_index.end(), rest_index.begin(), rest_index.end());
  const int n = static_cast<int>(rows.size());
  if (n > 0) {
    be_.upload_i32(a.head_rows, rows.data(), n);
    be_.upload_i32(a.targets, targets.data(), n);
  }
  const XPtr W = weights_ + layout_.lm_head();
  const float inv_t = 1.0f / opt.temperature;
  if (objective != nullptr) be_.zero_x(a.dlnf, static_cast<size_t>(N) * H);
  std::vector<float> lp(a.chunk), ent(a.chunk), coef(a.chunk), ent_coef(a.chunk);
  // No chunk holds rows from both sides of n_backward.
  for (int c0 = 0, c = 0; c0 < n; c0 += c) {
    c = std::min(a.chunk, (c0 < n_backward ? n_backward : n) - c0);
    be_.gather_rows(a.head_in, a.lnf, a.head_rows + c0, c, H);
    be_.matmul_forward(a.logits, a.head_in, W, {}, c, H, V);
    if (opt.temperature != 1.0f) be_.scale(a.logits, inv_t, static_cast<size_t>(c) * V);
    be_.logprob_forward(a.logprob + c0, a.entropy + c0, a.logits, a.targets + c0, c, V);
    if (objective == nullptr || c0 >= n_backward) continue;
    // The objective's coefficients come from this chunk's own log-probs (PPO's ratios).
    // They are derivatives with respect to logits / T, so each carries the 1/T of the
    // scaling back to the logits.
    be_.download(lp.data(), a.logprob + c0, c);
    be_.download(ent.data(), a.entropy + c0, c);
    objective->coefficients(out_index.data() + c0, c, lp.data(), ent.data(), coef.data(),
                            ent_coef.data());
    for (int r = 0; r < c; r++) {
      coef[r] *= inv_t;
      ent_coef[r] *= inv_t;
    }
    be_.upload(a.coef + c0, coef.data(), c);
    const bool with_entropy = objective->uses_entropy();
    if (with_entropy) be_.upload(a.ent_coef + c0, ent_coef.data(), c);
    be_.logprob_backward(a.logits, a.targets + c0, a.coef + c0,
                         with_entropy ? a.ent_coef + c0 : nullptr, c, V);
    be_.matmul_backward(a.dhead_in, grad(layout_.lm_head()), nullptr, a.logits, a.head_in, W, c,
                        H, V, false);
    be_.scatter_rows(a.dlnf, a.dhead_in, a.head_rows + c0, c, H);
  }
  lp.resize(n);
  ent.resize(n);
  if (n > 0) {
    be_.download(lp.data(), a.logprob, n);
    if (entropy != nullptr) be_.download(ent.data(), a.entropy, n);
  }
  if (logprobs != nullptr) std::fill(logprobs, logprobs + N, 0.0f);
  if (entropy != nullptr) std::fill(entropy, entropy + N, 0.0f);
  for (int r = 0; r < n; r++) {
    if (logprobs != nullptr) logprobs[out_index[r]] = lp[r];
    if (entropy != nullptr) entropy[out_index[r]] = ent[r];
  }
}

void Qwen2Model::require_head(Head head, const char* what) const {
  if (head_ != head) {
    throw Error(std::string(what) + " needs a " +
                (head == Head::Value ? "critic (value head)" : "causal language model"));
  }
}

void Qwen2Model::score(const Batch& batch, const RunOptions& opt, float* logprobs,
                       float* entropy) {
  require_head(Head::LanguageModel, "log-probs");
  if (weights_.null()) throw Error("log-probs: the model's weights are in host memory");
  forward(batch, false, opt);
  head(batch, opt, nullptr, logprobs, entropy);
}

double Qwen2Model::backward(const Batch& batch, const float* coef, const RunOptions& opt,
                            float* logprobs) {
  const size_t N = static_cast<size_t>(batch.B) * batch.T;
  std::vector<float> lp(N);
  WeightedLogprobs objective(coef);
  backward(batch, objective, opt, lp.data());
  double loss = 0;
  for (size_t i = 0; i < N; i++) loss -= static_cast<double>(coef[i]) * lp[i];
  if (logprobs != nullptr) std::copy(lp.begin(), lp.end(), logprobs);
  return loss;
}

void Qwen2Model::backward(const Batch& batch, TokenObjective& objective, const RunOptions& opt,
                          float* logprobs) {
  require_head(Head::LanguageModel, "a policy objective");
  begin_pass();
  forward(batch, true, opt);
  head(batch, opt, &objective, logprobs, nullptr);
  trunk_backward(batch, opt);
}

// The value of predicted position t comes from row t-1 (the state before token t).
void Qwen2Model::value_rows(const Batch& batch, std::vector<float>& row_values,
                            float* out) const {
  std::fill(out, out + static_cast<size_t>(batch.B) * batch.T, 0.0f);
  for (int b = 0; b < batch.B; b++) {
    for (int t = 1; t < batch.T; t++) {
      if (!batch.predicted(b, t)) continue;
      const size_t i = static_cast<size_t>(b) * batch.T + t;
      out[i] = row_values[i - 1];
    }
  }
}

std::pair<XPtr, XPtr> Qwen2Model::value_head_weights() const {
  if (lora_on()) return {lora_->head_weight(), lora_->head_bias()};
  return {weights_ + layout_.value_w(), weights_ + layout_.value_b()};
}

std::vector<float> Qwen2Model::value_head() const {
  require_head(Head::Value, "the value head");
  const int H = config_.hidden_size;
  std::vector<float> out(static_cast<size_t>(H) + 1);
  if (params_ != nullptr) {
    be_.download(out.data(), params_ + layout_.value_w(), static_cast<size_t>(H));
    be_.download(out.data() + H, params_ + layout_.value_b(), 1);
  } else {
    be_.download_x(out.data(), weights_ + layout_.value_w(), static_cast<size_t>(H));
    be_.download_x(out.data() + H, weights_ + layout_.value_b(), 1);
  }
  return out;
}

void Qwen2Model::values(const Batch& batch, const RunOptions& opt, float* out) {
  require_head(Head::Value, "values");
  forward(batch, false, opt);
  Activations& a = *acts_;
  const int N = batch.B * batch.T, H = config_.hidden_size;
  const auto [W, bias] = value_head_weights();
  be_.matmul_forward(a.values, a.lnf, W, bias, N, H, 1);
  std::vector<float> rows(N);
  be_.download_x(rows.data(), a.values, N);
  value_rows(batch, rows, out);
}

void Qwen2Model::backward_values(
    const Batch& batch, const RunOptions& opt,
    const std::function<void(const float* values, float* dloss)>& dloss) {
  require_head(Head::Value, "a critic loss");
  begin_pass();
  forward(batch, true, opt);
  Activations& a = *acts_;
  const int N = batch.B * batch.T, H = config_.hidden_size;
  const auto [W, bias] = value_head_weights();
  be_.matmul_forward(a.values, a.lnf, W, bias, N, H, 1);
  std::vector<float> rows(N), vals(N), d(N, 0.0f), drows(N, 0.0f);
  be_.download_x(rows.data(), a.values, N);
  value_rows(batch, rows, vals.data());
  dloss(vals.data(), d.data());
  for (int b = 0; b < batch.B; b++) {
    for (int t = 1; t < batch.T; t++) {
      const size_t i = static_cast<size_t>(b) * batch.T + t;
      if (batch.predicted(b, t)) drows[i - 1] = d[i];
    }
  }
  // The row gradients go to the device in the compute type, through an fp32 staging copy.
  float* staging = be_.alloc(N);
  be_.upload(staging, drows.data(), N);
  be_.to_x(a.values, staging, N);
  be_.release(staging);
  // With adapters the head's gradient is theirs (a copy of the head trained in full).
  float* dW = lora_ != nullptr ? lora_->head_weight_grad() : grad(layout_.value_w());
  float* db = lora_ != nullptr ? lora_->head_bias_grad() : grad(layout_.value_b());
  be_.matmul_backward(a.dlnf, dW, db, a.values, a.lnf, W, N, H, 1, false);
  trunk_backward(batch, opt);
}

void Qwen2Model::trunk_backward(const Batch& batch, const RunOptions& opt) {
  const int N = batch.B * batch.T, H = config_.hidden_size, L = config_.num_layers;
  Activations& a = *acts_;
  be_.zero_x(a.dres, static_cast<size_t>(N) * H);
  be_.rmsnorm_backward(a.dres, grad(layout_.norm()), a.dlnf, a.input(L),
                       weights_ + layout_.norm(), a.rstdf, N, H);
  const auto regions = gradient_regions();
  if (sink_ != nullptr) close_region();
  for (int l = L - 1; l >= 0; l--) {
    if (opt.recompute) layer_forward(l, 0, XPtr{});
    const auto& [begin, end] = regions[static_cast<size_t>(L - l)];
    if (sink_ != nullptr) open_region(begin, end);
    layer_backward(l, opt.recompute ? 0 : l);
    if (sink_ != nullptr) close_region();
  }
  if (lora_ == nullptr) be_.embedding_backward(grad(layout_.embed()), a.dres, a.ids, N, H);
  if (sink_ != nullptr) close_embeddings();
}

}  // namespace sr1
