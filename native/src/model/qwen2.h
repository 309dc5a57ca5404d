// The Qwen2 (and Llama) decoder: fp32 master weights in one flat buffer on the backend's
// device (plus a copy in the backend's compute type when that is not fp32), forward to
// per-token log-probs and entropies, and backward of a token-weighted
// objective into per-parameter gradients. The language-model head runs over chunks of
// the predicted rows, so the [tokens, vocab] logits are never held at once.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/host_buffer.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/objective.h"
#include "model/paged.h"
#include "model/params.h"

namespace sr1 {

struct RunOptions {
  // Predicted rows per language-model-head chunk; 0: the device's default (logits_chunk()).
  int logits_chunk = 0;
  float temperature = 1.0f;  // logits are divided by it before the softmax (as verl does)
  bool recompute = false;  // keep only each layer's input; recompute the rest in backward
};

// The head's chunk when RunOptions::logits_chunk is 0. Each chunk's weight-gradient product
// reads and writes the whole fp32 gradient of the vocabulary x hidden matrix (544 MB for
// Qwen2.5-0.5B), so on a GPU fewer, larger chunks pay: an H200 took 0.275 s a 0.5B step of
// 8 x 2,048 tokens in chunks of 256 rows and 0.251 s in one of 16,384 (docs/performance.md).
// A chunk of 2,048 rows holds 0.6 GB of bf16 logits at a vocabulary of 152k.
constexpr int kCpuLogitsChunk = 256, kGpuLogitsChunk = 2048;

class Qwen2Model {
 public:
  // Reads config.json and the safetensors weights of a Hugging Face folder. A critic
  // (Head::Value) may start from a causal LM's folder: its lm_head is then ignored and a
  // value head missing from the folder starts at zero (every value 0 at first).
  // `pad_multiple` rounds the parameter, compute-copy and gradient buffers up to a multiple
  // of it (zeros past the layout's end), so that a ZeRO learner can cut them into equal
  // shards, one per rank (train/learner.h).
  static std::unique_ptr<Qwen2Model> load(const std::string& dir, Backend& backend,
                                          Head head = Head::LanguageModel,
                                          size_t pad_multiple = 1);
  // Replaces the weights with those of another folder of the same architecture. Throws
  // (with the current weights intact) when its config or tensors do not match.
  void reload_weights(const std::string& dir);
  // The checks reload_weights makes before it writes anything, alone.
  void check_weights(const std::string& dir) const;
  ~Qwen2Model();
  Qwen2Model(const Qwen2Model&) = delete;
  Qwen2Model& operator=(const Qwen2Model&) = delete;

  const ModelConfig& config() const { return config_; }
  Head head_kind() const { return head_; }
  Backend& be() { return be_; }
  const ParamLayout& layout() const { return layout_; }
  // Floats in the parameter (and gradient) buffer: the parameters and alignment gaps.
  size_t param_buffer_size() const { return layout_.total(); }
  // Floats each full buffer holds: param_buffer_size() rounded up to load's pad_multiple.
  size_t buffer_capacity() const { return capacity_; }
  // fp32 master weights (buffer_capacity() floats); null once drop_masters() let them go.
  float* params() { return params_; }
  float* grads();  // fp32, allocated on first use
  // Call after changing params(): refreshes the compute-type copy the layers read.
  void params_changed();
  // The compute-type copy the layers read (buffer_capacity() elements): params() itself
  // when the compute type is fp32 (the CPU), else a copy of its own (bf16 on CUDA).
  XPtr weights() const { return weights_; }
  // Lets the fp32 master weights go where the compute copy is not them (CUDA), keeping the
  // compute copy alone: for a model nobody trains (the reference, the engine's) or one whose
  // masters a ZeRO learner keeps in shards. Loading then writes the compute copy directly,
  // and saving reads it (exact in the compute type; save_weights can be handed the fp32
  // values instead). A no-op where the compute copy is the masters.
  void drop_masters();
  // Frees the gradient buffer (the next grads() or zero_grad() allocates a zeroed one).
  void release_grads();
  // The compute copy waits in host memory between the trainer's phases (verl's
  // param_offload: the reference's, and a learner's, session.cpp): to_host() copies it to
  // host memory (Backend::alloc_host) unless the copy there is current, and frees it and the
  // activation buffers on the device; to_device() brings the copy back. A model nobody trains
  // is copied out once; a trained one again after its weights change (params_changed, a
  // reload, weights_changed). fp32 masters apart from the compute copy (CUDA, a stage-0
  // learner's without optimizer_offload) stay on the device. The passes refuse to run while
  // the weights are on the host.
  void to_host();
  void to_device();
  // Frees the activation buffers of the last pass (the next pass allocates its own): the
  // trainer's commands release them when they end (session.cpp), so that one phase does not
  // hold the buffers of another's passes nor one model's those of another.
  void release_activations();
  bool on_host() const { return weights_.null() && !host_weights_.empty(); }
  size_t host_bytes() const { return host_weights_.bytes(); }
  // Call after writing weights() directly (a ZeRO learner's updated shard and all-gather):
  // the next to_host() copies them out again.
  void weights_changed() { host_current_ = false; }
  // Bytes held: fp32 masters apart from the compute copy, the compute copy, gradients.
  size_t master_bytes() const;
  size_t weight_bytes() const;
  size_t grad_bytes() const;

  // Writes the weights into `dir` as safetensors in `dtype` (F32, BF16 or F16), sharded
  // above `max_shard_bytes`: `host` (param_buffer_size() fp32 values in the layout's
  // order) when given, else the masters, else (dropped) the compute copy.
  void save_weights(const std::string& dir, DType dtype, uint64_t max_shard_bytes,
                    const float* host = nullptr);

  // Per-token log-probs and entropies ([B*T], host), 0 where a token is not predicted.
  void score(const Batch& batch, const RunOptions& opt, float* logprobs, float* entropy);

  // Adds to grads() the gradient of the objective over the batch's predicted tokens. Writes
  // the log-probs ([B*T], host, 0 where not predicted) when `logprobs` is given.
  void backward(const Batch& batch, TokenObjective& objective, const RunOptions& opt,
                float* logprobs = nullptr);
  // The same for L = -sum coef[i] * logprob[i] (coef: [B*T], host); returns L.
  double backward(const Batch& batch, const float* coef, const RunOptions& opt,
                  float* logprobs = nullptr);

  // A critic's values ([B*T], host), aligned as the log-probs: position t holds the value
  // the head gives the state before token t (the hidden state at t-1), where t is predicted;
  // 0 elsewhere.
  void values(const Batch& batch, const RunOptions& opt, float* out);
  // Adds to grads() the gradient of a critic loss, given by `dloss` which receives the
  // current values ([B*T], aligned as values()) and fills dL/dvalue at the same positions.
  void backward_values(const Batch& batch, const RunOptions& opt,
                       const std::function<void(const float* values, float* dloss)>& dloss);

  void zero_grad();

  // LoRA (model/lora.h): adapters on the chosen projections of a causal LM, its own weights
  // frozen. The backward passes then add the adapters' gradients alone (lora()->grads()):
  // no gradient of any base weight is computed or allocated, and no gradient sink is taken.
  // With the adapters switched off, every pass is the base model's, bit for bit (a LoRA
  // run's reference policy: the same weights, no second copy).
  // A critic's adapters train its value head too (LoraConfig::value_head); a policy's do not.
  void attach_lora(std::unique_ptr<LoraAdapters> adapters);
  // A critic's value head as loaded: score.weight [H], then score.bias (fp32, host), where a
  // fresh critic adapter starts from.
  std::vector<float> value_head() const;
  LoraAdapters* lora() { return lora_.get(); }
  const LoraAdapters* lora() const { return lora_.get(); }
  void set_adapters_enabled(bool on) { adapters_on_ = on; }
  bool adapters_enabled() const { return adapters_on_; }

  // Where the backward passes put their gradients: by default the whole buffer grads(),
  // which they add to. With a sink (ZeRO stage 2's bucketed reduction, train/learner.h) a
  // pass instead computes one region of the parameters at a time (gradient_regions()) into
  // a zeroed buffer the sink lends it, and gives the region back as soon as its gradient is
  // complete. So no whole-model gradient is held.
  class GradientSink {
   public:
    virtual ~GradientSink() = default;
    // A zeroed device buffer of end - begin floats for the gradient of params [begin, end).
    virtual float* open(size_t begin, size_t end) = 0;
    // The region's gradient from one pass is complete in `grad` (open's buffer); the sink
    // may change it (a collective in place) but the model no longer reads it.
    virtual void close(float* grad, size_t begin, size_t end) = 0;
  };
  // Null: back to grads().
  void set_gradient_sink(GradientSink* sink) { sink_ = sink; }
  // The regions a pass hands a sink, in order, as [begin, end) of the flat buffer: the final
  // norm and the head, then each layer from the last, each open alone; then the embeddings,
  // open for the whole pass, as a tied head adds to them first.
  std::vector<std::pair<size_t, size_t>> gradient_regions() const;
  // The same for a buffer of `capacity` floats laid out as `layout` (a model not loaded).
  static std::vector<std::pair<size_t, size_t>> gradient_regions(const ParamLayout& layout,
                                                                 size_t capacity);
  // Hands the sink zeros for every region, in a pass's order: a pass without rows, so that
  // a rank with fewer micro-batches than the others still meets them in every collective.
  void empty_pass();

  // One step of the inference engine: runs the step's new tokens through the model,
  // storing their keys and values in `cache` and attending over each sequence's cached
  // positions, then draws the next token of each of step.sample_rows, computing the logits
  // in chunks of at most `logits_chunk` rows, where the logits are as step.sampling says (a
  // filtered row the backend leaves undone is sampled on the host from its logits, with the
  // same SampleRow). Returns one draw per sample row. With `graphs`, where the
  // backend can record them, a decode step (one row per sequence) replays the layers as a
  // graph recorded for its shape (graph_rows), unless step.lora names adapter rows: those
  // add their adapter's products unmerged (the model's own lora() is not used; a step with
  // adapters runs op by op). With `top`, it gets one list per sample row:
  // the step.top_logprobs[r] most likely tokens of row r, from its logits on the host
  // (backend/sample_row.h's top_logprobs; empty where none are asked for).
  std::vector<TokenDraw> forward_paged(const PagedStep& step, PagedKvCache& cache,
                                       int logits_chunk, bool graphs,
                                       std::vector<std::vector<TokenDraw>>* top = nullptr);
  // Frees the engine step's buffers (and the graphs on them); the next step takes them again.
  void release_paged() { paged_.reset(); }
  // Device bytes of the activations of a pass over N token rows (forward only, or for a
  // backward pass, with recomputation or without) whose head runs chunks of up to `chunk`
  // rows, with compute-type elements of `x_elem` bytes: counted by the code that allocates
  // them (the memory plan's source).
  static size_t activation_bytes(const ModelConfig& c, size_t x_elem, size_t N,
                                 bool for_backward, bool recompute, int chunk);
  // The head's rows per chunk when RunOptions::logits_chunk leaves it to the device.
  static int default_logits_chunk(bool cuda) { return cuda ? kGpuLogitsChunk : kCpuLogitsChunk; }
  // The rows a graph of a decode step of n rows runs (n rounded up: 1, 2, 4, then multiples
  // of 8, as vLLM's capture sizes), 0 past the largest graph.
  static int graph_rows(int n);

 private:
  struct Activations;
  // fresh_value_head: a value head missing from `dir` stays as it is (zeros at load).
  void load_weights(const std::string& dir, bool fresh_value_head);
  void check_config(const std::string& dir) const;
  void check_tensors(const SafetensorsSet& weights, bool fresh_value_head) const;
  Qwen2Model(ModelConfig config, Backend& backend, Head head, size_t pad_multiple);
  void require_head(Head head, const char* what) const;
  // Rows of the predicted positions of `batch`, and the row before each (its input).
  void value_rows(const Batch& batch, std::vector<float>& row_values, float* out) const;
  // The value head's weight and bias in use: the adapters' copy while they are on.
  std::pair<XPtr, XPtr> value_head_weights() const;
  // The backward pass below the final norm, from the gradient of its output in dlnf.
  void trunk_backward(const Batch& batch, const RunOptions& opt);
  // Rows of the head's logits buffer for N token rows: opt.logits_chunk, or this device's
  // default, and never more than N.
  int logits_rows(const RunOptions& opt, size_t N) const;
  static int logits_rows(int chunk, size_t N);
  static int layer_sets(const ModelConfig& c, bool for_backward, bool recompute);
  static int layer_inputs(const ModelConfig& c, bool for_backward);
  void reserve(const Batch& batch, bool for_backward, const RunOptions& opt);
  void forward(const Batch& batch, bool for_backward, const RunOptions& opt);
  void layer_forward(int l, int acts, XPtr x_out);
  // The embedding and every layer of an engine step over ps.rows rows (paged.h), the rows
  // of `lora` through their adapters too.
  void paged_layers(const PagedShape& ps, const int32_t* ids, const int32_t* pos,
                    const int32_t* slots, const int32_t* seq, const int32_t* tables,
                    PagedKvCache& cache, const std::vector<LoraRows>& lora);
  void layer_backward(int l, int acts);
  // Where a backward pass adds the gradient of the parameter at `offset`: grads(), or the
  // sink's buffer for the region that holds it.
  float* grad(size_t offset);
  // With a sink: the embeddings' region and the first (final norm and head) opened;
  // without, grads() allocated.
  void begin_pass();
  void open_region(size_t begin, size_t end);
  void close_region();
  void close_embeddings();
  // Runs the head over the predicted rows: log-probs (and entropies) out, and with an
  // objective the gradient into grads and the final norm's output gradient.
  void head(const Batch& batch, const RunOptions& opt, TokenObjective* objective,
            float* logprobs, float* entropy);

  ModelConfig config_;
  Head head_;
  Backend& be_;
  ParamLayout layout_;
  size_t capacity_;
  float* params_ = nullptr;
  XPtr weights_;  // params_ in the compute type; aliases params_ when that is fp32
  float* grads_ = nullptr;
  GradientSink* sink_ = nullptr;
  // During a pass with a sink, the buffers it lent: the embeddings' region's, and the open
  // region's, [region_begin_, region_end_).
  float* embed_grad_ = nullptr;
  float* region_grad_ = nullptr;
  size_t region_begin_ = 0, region_end_ = 0;
  HostBuffer host_weights_;    // the compute copy in host memory, once to_host() made it
  bool host_current_ = false;  // host_weights_ holds the compute copy's current values
  std::unique_ptr<Activations> acts_;
  std::unique_ptr<PagedBuffers> paged_;
  std::unique_ptr<LoraAdapters> lora_;
  bool adapters_on_ = true;
  // The adapters take part in the passes.
  bool lora_on() const { return lora_ != nullptr && adapters_on_; }
};

}  // namespace sr1
