// LoRA adapters of a Qwen2 model (Hu et al. 2021), as PEFT defines them
// (huggingface/peft, src/peft/tuners/lora/layer.py, Linear.forward): a targeted linear layer
// computes y = W x + scaling · B (A x), A [r, in], B [out, r], scaling = lora_alpha / r, or
// lora_alpha / sqrt(r) with use_rslora (LoraLayer.update_layer). The base weights W stay
// frozen; only A and B are trained, in fp32 (masters, gradients and AdamW state), with a copy
// in the backend's compute type for the products (the masters themselves on the CPU).
//
// The model fuses q/k/v into one matmul and gate/up into another (model/params.h); each
// targeted slice keeps its own adapter, as PEFT's per-module one: its products are computed
// alone and added to its columns of the fused output (Backend::copy_columns), so a slice
// behaves exactly as PEFT's q_proj, k_proj, ... would. The backward pass computes only what
// the adapters and the input gradient need: no gradient of W.
//
// Files: a PEFT adapter folder (peft/utils/constants.py: adapter_config.json and
// adapter_model.safetensors), tensor names as PEFT saves them once the adapter name is
// removed (peft/utils/save_and_load.py, get_peft_model_state_dict), e.g.
// base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight.
//
// A critic's adapters (verl's critic.model.lora_rank: PEFT's TOKEN_CLS task, whose
// PeftModelForTokenClassification adds `classifier` and `score` to modules_to_save,
// peft/peft_model.py) also train the value head in full: a copy of the base's score.weight
// [1, H] and score.bias [1] (ModulesToSaveWrapper copies the module it wraps,
// peft/utils/other.py) sits at the end of the same flat buffer, saved as
// base_model.model.score.weight and base_model.model.score.bias.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/device_buffers.h"
#include "model/params.h"

namespace sr1 {

// The linear layers an adapter may target, in PEFT's module names.
constexpr int kLoraModules = 7;
extern const char* const kLoraModuleNames[kLoraModules];  // q_proj, k_proj, ..., down_proj

struct LoraConfig {
  int rank = 0;                 // r: must be > 0
  double alpha = 16;            // lora_alpha (verl's default)
  bool use_rslora = false;      // scaling alpha / sqrt(r) instead of alpha / r
  bool targets[kLoraModules] = {true, true, true, true, true, true, true};  // all-linear
  // modules_to_save [classifier, score] (task TOKEN_CLS): the value head trained in full.
  bool value_head = false;
  double scaling() const;
  // The targeted modules' PEFT names, in kLoraModuleNames' order.
  std::vector<std::string> target_names() const;
  // "all-linear" or a list of PEFT names (q_proj, ...); throws naming a bad entry.
  void set_targets(const std::vector<std::string>& names);
};

// adapter_config.json of a PEFT LoRA folder; throws naming the file and field when it is
// not a plain LoRA adapter this model can run (peft_type LORA, no DoRA, no lora_bias, ...;
// modules_to_save only a critic's classifier and score).
LoraConfig read_adapter_config(const std::string& dir);

// One targeted module of one layer: where its A and B sit in the flat buffer, and where its
// output lies in the fused projection's output rows.
struct LoraModule {
  int layer = 0, module = 0;  // module: index into kLoraModuleNames
  int in = 0, out = 0;
  int col = 0, ld = 0;  // first column in the fused output and that output's row width
  size_t a = 0, b = 0;  // offsets in floats of A [r, in] and B [out, r]
  std::string prefix;   // base_model.model.model.layers.<l>.<self_attn|mlp>.<name>
};

// The adapters' flat fp32 buffer for a model: each targeted module's A and B (aligned),
// the floats in all, and the widest output (the scratch's width).
struct LoraLayout {
  std::vector<LoraModule> modules;
  size_t total = 0;
  int max_out = 0;
  // With value_head: the offsets of its weight [1, H] and bias [1] (after the modules).
  size_t head_w = 0, head_b = 0;
};
LoraLayout lora_layout(const ModelConfig& model, const LoraConfig& config);

// The scratch of a pass over `rows` token rows: A x, its gradient, one module's output (or
// output gradient). Laid out by `buffers`, which allocates or, with no backend, only counts.
struct LoraScratch {
  XPtr t, dt, y;
};
LoraScratch lora_scratch(DeviceBuffers& buffers, size_t rows, size_t rank, size_t max_out);

// The four matmuls of a layer an adapter can attach to.
enum class LoraSite { Qkv, O, GateUp, Down };

class LoraAdapters {
 public:
  // `pad_multiple`: the flat buffers' capacity is size() rounded up to it, zero-padded, so
  // that ZeRO cuts them into equal shards (train/learner.h, zero_pad_multiple).
  LoraAdapters(const ModelConfig& model, const LoraConfig& config, Backend& backend,
               size_t pad_multiple = 1);
  ~LoraAdapters();
  LoraAdapters(const LoraAdapters&) = delete;
  LoraAdapters& operator=(const LoraAdapters&) = delete;

  const LoraConfig& config() const { return config_; }
  const std::vector<LoraModule>& modules() const { return modules_; }
  size_t size() const { return total_; }  // floats in the flat buffer, alignment gaps included
  size_t capacity() const { return capacity_; }  // size() and the ZeRO padding (zeros)

  // PEFT's fresh adapter (LoraLayer.reset_lora_parameters with init_lora_weights=True): A
  // from kaiming_uniform_(a=sqrt(5)), i.e. uniform in ±1/sqrt(in), B zeros; drawn from a
  // generator seeded with `seed` (not torch's: the same seed gives other values than PEFT).
  // With a value head, `head` (H + 1 values: the base's score weight, then its bias) is its
  // start, as PEFT's copy of the wrapped module.
  void init_fresh(uint64_t seed, const std::vector<float>& head = {});
  // Reads the tensors of a PEFT folder whose config matches this one; throws naming the file
  // and tensor when one is missing, misshapen or extra. Nothing changes on error.
  void load(const std::string& dir);
  // Writes a PEFT folder into `dir` (which must exist): adapter_config.json naming
  // `base_model` and adapter_model.safetensors (F32) from `host` (size() values) or the masters.
  void save(const std::string& dir, const std::string& base_model,
            const float* host = nullptr) const;
  // The fp32 values on the host, and back.
  std::vector<float> download() const;
  void upload(const std::vector<float>& host);

  float* params() { return params_; }
  // The value head (config().value_head): its weight [1, H] and bias [1] in the compute
  // type, and their gradients.
  XPtr head_weight() const { return weights_ + head_w_; }
  XPtr head_bias() const { return weights_ + head_b_; }
  float* head_weight_grad() { return grads() + head_w_; }
  float* head_bias_grad() { return grads() + head_b_; }
  float* grads();  // allocated and zeroed on first use
  void zero_grad();
  void release_grads();  // frees them (ZeRO stage 2 between updates)
  size_t grad_bytes() const { return grads_ != nullptr ? capacity_ * sizeof(float) : 0; }
  size_t weight_bytes() const;  // the masters, and the compute copy where it is apart
  // Call after changing params() in [begin, end): refreshes the compute copy there.
  void params_changed(size_t begin, size_t end);

  // y[N, ld] += scaling · B (A x) for each adapter of layer `layer` at `site`, x [N, in].
  void forward(int layer, LoraSite site, XPtr y, XPtr x, int N);
  // With dy [N, ld] the gradient of that output: the adapters' gradients += theirs, and
  // dx [N, in] += the adapters' part of the input gradient.
  void backward(int layer, LoraSite site, XPtr dx, XPtr dy, XPtr x, int N);

  // W += scaling · B A for every adapter (PEFT's merge_and_unload), on fp32 host weights laid
  // out as `layout`; the products in double, rounded once. A value head replaces the
  // layout's.
  void merge(const ParamLayout& layout, float* host_weights) const;
  // Frees the scratch of the last pass (the next pass allocates its own).
  void release_scratch() {
    scratch_.reset();
    scratch_rows_ = 0;
  }

 private:
  const std::vector<const LoraModule*>& at(int layer, LoraSite site) const;
  void reserve(int N);
  LoraConfig config_;
  Backend& be_;
  std::vector<LoraModule> modules_;
  std::vector<std::vector<std::vector<const LoraModule*>>> sites_;  // [layer][site]
  size_t total_ = 0, capacity_ = 0;
  int max_out_ = 0;
  int hidden_ = 0;
  size_t head_w_ = 0, head_b_ = 0;
  float* params_ = nullptr;
  XPtr weights_;  // params_ in the compute type; aliases params_ when that is fp32
  float* grads_ = nullptr;
  // Scratch for N rows: A x, its gradient, and one module's output (or output gradient).
  std::unique_ptr<DeviceBuffers> scratch_;
  int scratch_rows_ = 0;
  XPtr t_, dt_, y_;
};

}  // namespace sr1
