#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <tuple>

#include "io/safetensors.h"
#include "util/error.h"
#include "util/json.h"

namespace sr1 {

const char* const kLoraModuleNames[kLoraModules] = {"q_proj",    "k_proj",  "v_proj", "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};

namespace {

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";
// PEFT's names of a TOKEN_CLS model's modules_to_save (PeftModelForTokenClassification) and
// of the saved value head.
const std::vector<std::string> kHeadModules = {"classifier", "score"};
constexpr const char* kHeadWeight = "base_model.model.score.weight";
constexpr const char* kHeadBias = "base_model.model.score.bias";

LoraSite site_of(int module) {
  if (module < 3) return LoraSite::Qkv;
  if (module == 3) return LoraSite::O;
  return module < 6 ? LoraSite::GateUp : LoraSite::Down;
}

size_t aligned(size_t n) {
  return (n + ParamLayout::kAlign - 1) / ParamLayout::kAlign * ParamLayout::kAlign;
}

}  // namespace

double LoraConfig::scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / rank;
}

std::vector<std::string> LoraConfig::target_names() const {
  std::vector<std::string> out;
  for (int m = 0; m < kLoraModules; m++) {
    if (targets[m]) out.emplace_back(kLoraModuleNames[m]);
  }
  return out;
}

void LoraConfig::set_targets(const std::vector<std::string>& names) {
  if (names.empty()) throw Error("'target_modules' is empty (name at least one module)");
  if (names.size() == 1 && names[0] == "all-linear") {
    for (bool& t : targets) t = true;
    return;
  }
  for (bool& t : targets) t = false;
  for (const std::string& name : names) {
    int found = -1;
    for (int m = 0; m < kLoraModules; m++) {
      if (name == kLoraModuleNames[m]) found = m;
    }
    if (found < 0) {
      throw Error("'target_modules': '" + name +
                  "' is not one of all-linear, q_proj, k_proj, v_proj, o_proj, gate_proj, "
                  "up_proj, down_proj");
    }
    targets[found] = true;
  }
}

LoraConfig read_adapter_config(const std::string& dir) {
  const std::string path = dir + "/" + kConfigFile;
  const json::Value c = json::parse_file(path);
  const auto field = [&](const char* key) { return c.find(key); };
  const auto fail = [&](const std::string& what) { throw Error(path + ": " + what); };
  const json::Value* type = field("peft_type");
  if (type == nullptr || !type->is_string() || type->as_string() != "LORA") {
    fail("'peft_type' must be \"LORA\"");
  }
  LoraConfig out;
  const json::Value* r = field("r");
  if (r == nullptr || !r->is_integer() || r->as_int() < 1) fail("'r' must be an integer >= 1");
  out.rank = static_cast<int>(r->as_int());
  const json::Value* alpha = field("lora_alpha");
  if (alpha == nullptr || !alpha->is_number()) fail("'lora_alpha' must be a number");
  out.alpha = alpha->as_number();
  const json::Value* rs = field("use_rslora");
  if (rs != nullptr && !rs->is_null()) {
    if (!rs->is_bool()) fail("'use_rslora' must be true or false");
    out.use_rslora = rs->as_bool();
  }
  const json::Value* targets = field("target_modules");
  std::vector<std::string> names;
  if (targets != nullptr && targets->is_string() && targets->as_string() == "all-linear") {
    names.push_back("all-linear");
  } else if (targets != nullptr && targets->is_array()) {
    for (const json::Value& v : targets->as_array()) {
      if (!v.is_string()) fail("'target_modules' must list module names");
      names.push_back(v.as_string());
    }
  } else {
    fail("'target_modules' must be \"all-linear\" or a list of module names (a regex is not "
         "supported)");
  }
  try {
    out.set_targets(names);
  } catch (const Error& e) {
    fail(e.what());
  }
  // What this model's adapters do not do is refused, not ignored.
  for (const char* key : {"use_dora", "lora_bias", "fan_in_fan_out"}) {
    const json::Value* v = field(key);
    if (v != nullptr && v->is_bool() && v->as_bool()) fail(std::string("'") + key + "' is not supported");
  }
  for (const char* key : {"layers_to_transform", "modules_to_save", "exclude_modules"}) {
    const json::Value* v = field(key);
    const bool empty = v == nullptr || v->is_null() || (v->is_array() && v->as_array().empty());
    if (empty) continue;
    if (std::string(key) == "modules_to_save" && v->is_array()) {
      // A critic's: its value head (score; classifier is PEFT's name in other models).
      bool ours = true, score = false;
      for (const json::Value& m : v->as_array()) {
        ours = ours && m.is_string() &&
               std::find(kHeadModules.begin(), kHeadModules.end(), m.as_string()) !=
                   kHeadModules.end();
        score = score || (m.is_string() && m.as_string() == "score");
      }
      if (ours && score) {
        out.value_head = true;
        continue;
      }
      fail("'modules_to_save' may only hold a critic's value head (\"classifier\", \"score\")");
    }
    fail(std::string("'") + key + "' is not supported");
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    const json::Value* v = field(key);
    const bool empty = v == nullptr || v->is_null() || (v->is_object() && v->as_object().empty());
    if (!empty) fail(std::string("'") + key + "' is not supported");
  }
  return out;
}

LoraLayout lora_layout(const ModelConfig& c, const LoraConfig& config) {
  if (config.rank < 1) throw Error("LoRA 'rank' must be >= 1");
  const int H = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(),
            K = c.num_kv_heads * c.head_dim;
  // in, out, first column, fused width of each module (kLoraModuleNames' order)
  const int shape[kLoraModules][4] = {{H, Q, 0, c.qkv_dim()}, {H, K, Q, c.qkv_dim()},
                                      {H, K, Q + K, c.qkv_dim()}, {Q, H, 0, H},
                                      {H, I, 0, 2 * I},          {H, I, I, 2 * I},
                                      {I, H, 0, H}};
  const size_t r = static_cast<size_t>(config.rank);
  LoraLayout out;
  for (int l = 0; l < c.num_layers; l++) {
    for (int m = 0; m < kLoraModules; m++) {
      if (!config.targets[m]) continue;
      LoraModule mod;
      mod.layer = l;
      mod.module = m;
      mod.in = shape[m][0];
      mod.out = shape[m][1];
      mod.col = shape[m][2];
      mod.ld = shape[m][3];
      mod.a = out.total;
      out.total = aligned(out.total + r * mod.in);
      mod.b = out.total;
      out.total = aligned(out.total + static_cast<size_t>(mod.out) * r);
      mod.prefix = "base_model.model.model.layers." + std::to_string(l) +
                   (m < 4 ? ".self_attn." : ".mlp.") + kLoraModuleNames[m];
      out.max_out = std::max(out.max_out, mod.out);
      out.modules.push_back(mod);
    }
  }
  if (config.value_head) {
    out.head_w = out.total;
    out.total = aligned(out.total + static_cast<size_t>(H));
    out.head_b = out.total;
    out.total = aligned(out.total + 1);
  }
  return out;
}

LoraScratch lora_scratch(DeviceBuffers& buffers, size_t rows, size_t rank, size_t max_out) {
  LoraScratch s;
  s.t = buffers.x(rows * rank);
  s.dt = buffers.x(rows * rank);
  s.y = buffers.x(rows * max_out);
  return s;
}

LoraAdapters::LoraAdapters(const ModelConfig& c, const LoraConfig& config, Backend& backend,
                           size_t pad_multiple)
    : config_(config), be_(backend) {
  LoraLayout layout = lora_layout(c, config_);
  modules_ = std::move(layout.modules);
  total_ = layout.total;
  capacity_ = (total_ + pad_multiple - 1) / pad_multiple * pad_multiple;
  max_out_ = layout.max_out;
  hidden_ = c.hidden_size;
  head_w_ = layout.head_w;
  head_b_ = layout.head_b;
  sites_.assign(static_cast<size_t>(c.num_layers), std::vector<std::vector<const LoraModule*>>(4));
  for (const LoraModule& mod : modules_) {
    sites_[static_cast<size_t>(mod.layer)][static_cast<size_t>(site_of(mod.module))].push_back(&mod);
  }
  params_ = be_.alloc(capacity_);
  be_.zero(params_, capacity_);
  weights_ = be_.x_elem() == sizeof(float) ? XPtr{params_, sizeof(float)} : be_.alloc_x(capacity_);
  params_changed(0, capacity_);
}

LoraAdapters::~LoraAdapters() {
  scratch_.reset();
  if (weights_.p != params_) be_.release(weights_.p);
  be_.release(params_);
  if (grads_ != nullptr) be_.release(grads_);
}

const std::vector<const LoraModule*>& LoraAdapters::at(int layer, LoraSite site) const {
  return sites_[static_cast<size_t>(layer)][static_cast<size_t>(site)];
}

void LoraAdapters::init_fresh(uint64_t seed, const std::vector<float>& head) {
  if (config_.value_head != (head.size() == static_cast<size_t>(hidden_) + 1)) {
    throw Error("LoraAdapters::init_fresh: a value head's start goes with a value head (a bug)");
  }
  std::vector<float> host(total_, 0.0f);
  if (config_.value_head) {
    std::copy(head.begin(), head.end() - 1, host.begin() + static_cast<long>(head_w_));
    host[head_b_] = head.back();
  }
  std::mt19937_64 gen(seed);
  for (const LoraModule& m : modules_) {
    // kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in).
    const double bound = 1.0 / std::sqrt(static_cast<double>(m.in));
    std::uniform_real_distribution<double> u(-bound, bound);
    for (size_t k = 0; k < static_cast<size_t>(config_.rank) * m.in; k++) {
      host[m.a + k] = static_cast<float>(u(gen));
    }
  }
  upload(host);
}

std::vector<float> LoraAdapters::download() const {
  std::vector<float> host(total_);
  be_.download(host.data(), params_, total_);
  return host;
}

void LoraAdapters::upload(const std::vector<float>& host) {
  if (host.size() != total_) throw Error("LoraAdapters::upload: wrong size (a bug)");
  be_.upload(params_, host.data(), total_);
  params_changed(0, total_);
}

void LoraAdapters::load(const std::string& dir) {
  const LoraConfig c = read_adapter_config(dir);
  const std::string path = dir + "/" + kConfigFile;
  if (c.rank != config_.rank || c.alpha != config_.alpha || c.use_rslora != config_.use_rslora ||
      c.target_names() != config_.target_names()) {
    throw Error(path + ": r, lora_alpha, use_rslora or target_modules differ from the adapter "
                       "asked for");
  }
  if (c.value_head != config_.value_head) {
    throw Error(path + (config_.value_head
                           ? ": a critic's adapter needs modules_to_save [\"classifier\", "
                             "\"score\"] (its value head)"
                           : ": modules_to_save holds a value head, which a policy has not"));
  }
  const SafetensorsSet set = SafetensorsSet::open_file(dir + "/" + kWeightsFile);
  std::vector<float> host(total_, 0.0f);
  std::set<std::string> expected;
  const int64_t r = config_.rank;
  for (const LoraModule& m : modules_) {
    for (const bool is_a : {true, false}) {
      const std::string name = m.prefix + (is_a ? ".lora_A.weight" : ".lora_B.weight");
      const TensorView* view = set.find(name);
      if (view == nullptr) throw Error(set.source() + ": tensor '" + name + "' is missing");
      read_f32(*view, is_a ? std::vector<int64_t>{r, m.in} : std::vector<int64_t>{m.out, r},
               host.data() + (is_a ? m.a : m.b));
      expected.insert(name);
    }
  }
  if (config_.value_head) {
    for (const auto& [name, offset, shape] :
         {std::tuple<std::string, size_t, std::vector<int64_t>>{kHeadWeight, head_w_, {1, hidden_}},
          {kHeadBias, head_b_, {1}}}) {
      const TensorView* view = set.find(name);
      if (view == nullptr) throw Error(set.source() + ": tensor '" + name + "' is missing");
      read_f32(*view, shape, host.data() + offset);
      expected.insert(name);
    }
  }
  for (const std::string& name : set.names()) {
    if (!expected.count(name)) {
      throw Error(set.source() + ": tensor '" + name + "' is not one of this adapter's");
    }
  }
  upload(host);
}

void LoraAdapters::save(const std::string& dir, const std::string& base_model,
                        const float* host) const {
  std::vector<float> own;
  if (host == nullptr) {
    own = download();
    host = own.data();
  }
  std::vector<TensorOut> out;
  const int64_t r = config_.rank;
  for (const LoraModule& m : modules_) {
    out.push_back({m.prefix + ".lora_A.weight", DType::F32, {r, m.in}, host + m.a});
    out.push_back({m.prefix + ".lora_B.weight", DType::F32, {m.out, r}, host + m.b});
  }
  if (config_.value_head) {
    out.push_back({kHeadWeight, DType::F32, {1, hidden_}, host + head_w_});
    out.push_back({kHeadBias, DType::F32, {1}, host + head_b_});
  }
  write_safetensors(dir + "/" + kWeightsFile, out, {{"format", "pt"}});
  json::Value targets = json::Value::array();
  for (const std::string& name : config_.target_names()) targets.push(json::Value(name));
  const double alpha = config_.alpha;
  const json::Value alpha_value = alpha == std::floor(alpha) && std::fabs(alpha) < 1e15
                                      ? json::Value(static_cast<int64_t>(alpha))
                                      : json::Value(alpha);
  // LoraConfig's fields (peft/tuners/lora/config.py) that say what these tensors are.
  json::Value to_save = json::Value();
  if (config_.value_head) {
    to_save = json::Value::array();
    for (const std::string& m : kHeadModules) to_save.push(json::Value(m));
  }
  const json::Value config = json::Value::object({
      {"peft_type", json::Value("LORA")},
      {"task_type", json::Value(config_.value_head ? "TOKEN_CLS" : "CAUSAL_LM")},
      {"modules_to_save", to_save},
      {"base_model_name_or_path", json::Value(base_model)},
      {"r", json::Value(config_.rank)},
      {"lora_alpha", alpha_value},
      {"use_rslora", json::Value(config_.use_rslora)},
      {"target_modules", targets},
      {"lora_dropout", json::Value(0.0)},
      {"bias", json::Value("none")},
      {"fan_in_fan_out", json::Value(false)},
      {"init_lora_weights", json::Value(true)},
      {"inference_mode", json::Value(true)},
      {"use_dora", json::Value(false)},
  });
  const std::string path = dir + "/" + kConfigFile;
  const std::string text = config.dump_pretty() + "\n";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw Error(path + ": cannot write");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw Error(path + ": cannot write");
}

float* LoraAdapters::grads() {
  if (grads_ == nullptr) {
    grads_ = be_.alloc(capacity_);
    be_.zero(grads_, capacity_);
  }
  return grads_;
}

void LoraAdapters::zero_grad() { be_.zero(grads(), capacity_); }

void LoraAdapters::release_grads() {
  if (grads_ == nullptr) return;
  be_.synchronize();  // the step has read them
  be_.release(grads_);
  grads_ = nullptr;
}

size_t LoraAdapters::weight_bytes() const {
  return capacity_ * sizeof(float) + (weights_.p != params_ ? capacity_ * weights_.elem : 0);
}

void LoraAdapters::params_changed(size_t begin, size_t end) {
  if (weights_.p != params_) be_.to_x(weights_ + begin, params_ + begin, end - begin);
}

void LoraAdapters::reserve(int N) {
  if (N <= scratch_rows_) return;
  scratch_.reset();
  scratch_ = std::make_unique<DeviceBuffers>(be_);
  const LoraScratch s = lora_scratch(*scratch_, static_cast<size_t>(N),
                                     static_cast<size_t>(config_.rank), static_cast<size_t>(max_out_));
  t_ = s.t;
  dt_ = s.dt;
  y_ = s.y;
  scratch_rows_ = N;
}

// PEFT's Linear.forward: result + lora_B(lora_A(x)) * scaling, each module alone.
void LoraAdapters::forward(int layer, LoraSite site, XPtr y, XPtr x, int N) {
  const std::vector<const LoraModule*>& mods = at(layer, site);
  if (mods.empty() || N == 0) return;
  reserve(N);
  const int r = config_.rank;
  const float s = static_cast<float>(config_.scaling());
  for (const LoraModule* m : mods) {
    be_.matmul_forward(t_, x, weights_ + m->a, {}, N, m->in, r);
    be_.matmul_forward(y_, t_, weights_ + m->b, {}, N, r, m->out);
    be_.scale(y_, s, static_cast<size_t>(N) * m->out);
    be_.copy_columns(y + m->col, m->ld, y_, m->out, N, m->out, true);
  }
}

// The same products' backward, as autograd runs it: d(lora_B out) = scaling · dy, then
// lora_B's and lora_A's. A x is recomputed (r values a row) rather than kept from the forward.
void LoraAdapters::backward(int layer, LoraSite site, XPtr dx, XPtr dy, XPtr x, int N) {
  const std::vector<const LoraModule*>& mods = at(layer, site);
  if (mods.empty() || N == 0) return;
  reserve(N);
  float* g = grads();
  const int r = config_.rank;
  const float s = static_cast<float>(config_.scaling());
  for (const LoraModule* m : mods) {
    be_.copy_columns(y_, m->out, dy + m->col, m->ld, N, m->out, false);
    be_.scale(y_, s, static_cast<size_t>(N) * m->out);
    be_.matmul_forward(t_, x, weights_ + m->a, {}, N, m->in, r);
    be_.matmul_backward(dt_, g + m->b, nullptr, y_, t_, weights_ + m->b, N, r, m->out, false);
    be_.matmul_backward(dx, g + m->a, nullptr, dt_, x, weights_ + m->a, N, m->in, r, true);
  }
}

void LoraAdapters::merge(const ParamLayout& layout, float* w) const {
  const std::vector<float> host = download();
  const double s = config_.scaling();
  const size_t r = static_cast<size_t>(config_.rank);
  for (const LoraModule& m : modules_) {
    const LayerParams& lp = layout.layer(m.layer);
    const size_t base[4] = {lp.qkv_w, lp.o_w, lp.gu_w, lp.down_w};
    float* W = w + base[static_cast<size_t>(site_of(m.module))] + static_cast<size_t>(m.col) * m.in;
    const float *A = host.data() + m.a, *B = host.data() + m.b;
    for (int o = 0; o < m.out; o++) {
      for (int i = 0; i < m.in; i++) {
        double d = 0;
        for (size_t k = 0; k < r; k++) {
          d += static_cast<double>(B[static_cast<size_t>(o) * r + k]) * A[k * m.in + i];
        }
        float& cell = W[static_cast<size_t>(o) * m.in + i];
        cell = static_cast<float>(cell + s * d);
      }
    }
  }
  if (config_.value_head) {
    std::copy(host.begin() + static_cast<long>(head_w_),
              host.begin() + static_cast<long>(head_w_) + hidden_, w + layout.value_w());
    w[layout.value_b()] = host[head_b_];
  }
}

}  // namespace sr1
