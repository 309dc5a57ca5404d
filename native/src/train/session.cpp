#include "train/session.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <utility>
#include <vector>

#include "backend/profiled_backend.h"
#include "io/safetensors.h"
#include "model/hf_folder.h"
#include "train/actor.h"
#include "train/critic.h"
#include "train/data_parallel.h"
#include "train/minibatch.h"
#include "util/error.h"

namespace sr1 {

void TrainerSession::reset() {
  actor.reset();
  critic_learner.reset();
  critic.reset();
  reference.reset();
  policy.reset();
}

Qwen2Model& TrainerSession::model(const std::string& which) {
  if (!policy) throw Error("no model is loaded (send 'load' first)");
  if (which == "policy") return *policy;
  if (which == "reference") {
    if (policy->lora() != nullptr) return *policy;  // its adapters off: log_probs says so
    if (!reference) throw Error("no reference model was loaded ('reference' in 'load')");
    return *reference;
  }
  throw Error("'model' must be \"policy\" or \"reference\", got \"" + which + "\"");
}

Learner& TrainerSession::actor_learner() {
  if (!actor) throw Error("no model is loaded (send 'load' first)");
  return *actor;
}

Learner& TrainerSession::critic_of() {
  if (!critic_learner) throw Error("no critic was loaded ('critic' in 'load')");
  return *critic_learner;
}

namespace {

AdamWConfig read_adamw(const JsonFields& f) {
  AdamWConfig c;
  c.beta1 = static_cast<float>(f.number("beta1", c.beta1));
  c.beta2 = static_cast<float>(f.number("beta2", c.beta2));
  c.eps = static_cast<float>(f.number("eps", c.eps));
  c.weight_decay = static_cast<float>(f.number("weight_decay", c.weight_decay));
  c.max_grad_norm = static_cast<float>(f.number("grad_clip", c.max_grad_norm));
  return c;
}

LrSchedule read_schedule(const JsonFields& f, float default_lr) {
  LrSchedule s;
  s.kind = f.text("lr_schedule", s.kind);
  s.peak = static_cast<float>(f.number("lr", default_lr));
  s.warmup_steps = static_cast<int>(f.integer("warmup_steps", s.warmup_steps));
  s.total_steps = static_cast<int>(f.integer("total_steps", s.total_steps));
  s.min_lr_ratio = static_cast<float>(f.number("min_lr_ratio", s.min_lr_ratio));
  return s;
}

// The temperature is the field's, else RunOptions' default (not the command line's).
RunOptions read_run(const JsonFields& f, const RunOptions& base) {
  RunOptions run = base;
  run.temperature = static_cast<float>(f.number("temperature", RunOptions().temperature));
  if (!(run.temperature > 0)) throw Error("'temperature' must be > 0");
  return run;
}

// Sequences per forward pass of log_probs and values; 0 (default) = the whole batch.
int read_micro_batch_size(const JsonFields& f) {
  const long n = f.integer("micro_batch_size", 0);
  if (n < 0) throw Error("'micro_batch_size' must be >= 0");
  return static_cast<int>(n);
}

MiniBatching read_batching(const JsonFields& f) {
  MiniBatching m;
  m.mini_batch_size = static_cast<int>(f.integer("ppo_mini_batch_size", m.mini_batch_size));
  m.epochs = static_cast<int>(f.integer("ppo_epochs", m.epochs));
  m.max_token_len = f.integer("ppo_max_token_len_per_gpu", m.max_token_len);
  m.shuffle = f.boolean("shuffle", m.shuffle);
  m.remove_padding = f.boolean("remove_padding", m.remove_padding);
  if (m.mini_batch_size < 0 || m.epochs < 1 || m.max_token_len < 0) {
    throw Error("ppo_mini_batch_size and ppo_max_token_len_per_gpu must be >= 0, ppo_epochs >= 1");
  }
  return m;
}

LossAgg read_loss_agg(const JsonFields& f, LossAgg fallback) {
  return f.has("loss_agg_mode") ? parse_loss_agg(f.text("loss_agg_mode"), OptionStyle::Field)
                                : fallback;
}

PpoConfig read_ppo(const JsonFields& f) {
  PpoConfig p;
  if (f.has("clip_ratio")) p.clip_low = p.clip_high = static_cast<float>(f.number("clip_ratio"));
  p.clip_low = static_cast<float>(f.number("clip_ratio_low", p.clip_low));
  p.clip_high = static_cast<float>(f.number("clip_ratio_high", p.clip_high));
  p.clip_c = static_cast<float>(f.number("clip_ratio_c", p.clip_c));
  if (!(p.clip_low >= 0 && p.clip_low < 1 && p.clip_high >= 0 && p.clip_c > 1)) {
    throw Error("clip ratios must be in [0, 1) (high: >= 0) and clip_ratio_c above 1");
  }
  if (f.has("kl_loss_type")) p.kl_type = parse_kl_type(f.text("kl_loss_type"), OptionStyle::Field);
  p.kl_coef = static_cast<float>(f.number("kl_loss_coef", p.kl_coef));
  p.entropy_coeff = static_cast<float>(f.number("entropy_coeff", p.entropy_coeff));
  p.agg = read_loss_agg(f, p.agg);
  return p;
}

struct BatchFile {
  std::unique_ptr<SafetensorsFile> file;
  Batch batch;
  std::vector<float> tensor(const char* name) const {
    return read_token_values(*file, name, batch, true);
  }
};

BatchFile open_batch(const JsonFields& f, const Qwen2Model& model) {
  BatchFile b;
  b.file = SafetensorsFile::open(f.text("batch"));
  b.batch = read_batch(*b.file, model.config().vocab_size);
  return b;
}

void write_token_tensors(const std::string& path, const Batch& batch,
                         const std::vector<std::pair<std::string, const float*>>& tensors) {
  std::vector<TensorOut> out;
  for (const auto& [name, data] : tensors) {
    out.push_back({name, DType::F32, {batch.B, batch.T}, data});
  }
  write_safetensors(path, out);
}

// The fields each op takes (besides "op" and "id").
const std::vector<std::string> kOptimFields = {"lr", "lr_schedule", "warmup_steps", "total_steps",
                                               "min_lr_ratio", "beta1", "beta2", "eps",
                                               "weight_decay", "grad_clip"};
const std::vector<std::string> kBatchingFields = {"ppo_mini_batch_size", "ppo_epochs",
                                                  "ppo_max_token_len_per_gpu", "shuffle",
                                                  "remove_padding"};
const std::vector<std::string> kOps = {"load", "log_probs", "values", "update_actor",
                                       "update_critic", "export", "save_checkpoint",
                                       "load_checkpoint", "profile", "shutdown"};

std::vector<std::string> fields_of(const std::string& op) {
  if (std::find(kOps.begin(), kOps.end(), op) == kOps.end()) {
    std::string list;
    for (const std::string& o : kOps) list += (list.empty() ? "" : ", ") + o;
    throw Error("unknown op '" + op + "' (" + list + ")");
  }
  std::vector<std::string> k = {"op", "id"};
  const auto add = [&](const std::vector<std::string>& more) {
    k.insert(k.end(), more.begin(), more.end());
  };
  if (op == "load") {
    add({"policy", "reference", "reference_offload", "critic", "actor_optim", "critic_optim",
         "seed", "zero_stage", "actor_offload", "critic_offload", "lora", "critic_lora"});
  }
  if (op == "log_probs") add({"model", "batch", "out", "temperature", "micro_batch_size"});
  if (op == "values") add({"batch", "out", "micro_batch_size"});
  if (op == "update_actor") {
    add({"batch", "clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c",
         "kl_loss_type", "kl_loss_coef", "entropy_coeff", "loss_agg_mode", "temperature"});
    add(kBatchingFields);
  }
  if (op == "update_critic") {
    add({"batch", "cliprange_value", "loss_agg_mode"});
    add(kBatchingFields);
  }
  if (op == "export") add({"out", "node_outs", "dtype", "adapter"});
  if (op == "save_checkpoint") add({"dir", "overwrite"});
  if (op == "load_checkpoint") add({"dir"});
  return k;
}

// load's actor_offload or critic_offload (learner.h): {param, grad, optimizer}, each false
// when absent; an error names the field.
Offload read_offload(const JsonFields& f, const char* key) {
  const JsonFields o = f.object(key);
  try {
    o.only({"param", "grad", "optimizer"});
    return Offload{o.boolean("param", false), o.boolean("grad", false),
                   o.boolean("optimizer", false)};
  } catch (const Error& e) {
    throw Error(std::string("in '") + key + "': " + e.what());
  }
}

// load's `lora` or `critic_lora` (`key`; SERVE.md): a fresh adapter (`rank`, ...) or one from
// a PEFT folder (`path`), whose fields, where given too, must be the folder's; its buffers
// padded for the ZeRO shards. A critic's adapters train its value head too, a fresh one from
// the loaded head (before the learner drops the base's masters).
std::unique_ptr<LoraAdapters> read_lora(const JsonFields& load, const std::string& key,
                                        const Qwen2Model& model, Backend& be, uint64_t seed,
                                        size_t pad) {
  const JsonFields f = load.object(key.c_str());
  f.only({"rank", "alpha", "target_modules", "use_rslora", "path", "seed"});
  const bool critic = model.head_kind() == Head::Value;
  LoraConfig c;
  c.value_head = critic;
  const std::string path = f.text("path", "");
  if (!path.empty()) c = read_adapter_config(path);
  const auto field = [&](const char* name, const std::string& given, const std::string& file) {
    if (!path.empty() && given != file) {
      throw Error("'" + key + "." + name + "' is " + given + ", but " + path +
                  "/adapter_config.json has " + file);
    }
  };
  if (f.has("rank")) {
    const long rank = f.integer("rank");
    if (rank < 1) throw Error("'" + key + ".rank' must be >= 1");
    field("rank", std::to_string(rank), std::to_string(c.rank));
    c.rank = static_cast<int>(rank);
  } else if (path.empty()) {
    throw Error("'" + key + "' needs 'rank' (a fresh adapter) or 'path' (a PEFT adapter folder)");
  }
  if (f.has("alpha")) {
    const double alpha = f.number("alpha");
    field("alpha", json::Value(alpha).dump(), json::Value(c.alpha).dump());
    c.alpha = alpha;
  }
  if (f.has("use_rslora")) {
    const bool rs = f.boolean("use_rslora");
    field("use_rslora", rs ? "true" : "false", c.use_rslora ? "true" : "false");
    c.use_rslora = rs;
  }
  if (f.has("target_modules")) {
    LoraConfig given = c;
    try {
      given.set_targets(f.required("target_modules").is_string()
                            ? std::vector<std::string>{f.text("target_modules")}
                            : f.text_list("target_modules"));
    } catch (const Error& e) {
      throw Error("in '" + key + "': " + e.what());
    }
    const auto joined = [](const LoraConfig& x) {
      std::string s;
      for (const std::string& n : x.target_names()) s += (s.empty() ? "" : ",") + n;
      return s;
    };
    field("target_modules", joined(given), joined(c));
    c = given;
  }
  if (!path.empty() && f.has("seed")) {
    throw Error("'" + key + ".seed' is for a fresh adapter, not 'path'");
  }
  if (!path.empty() && c.value_head != critic) {
    throw Error("'" + key + ".path': " + path + "/adapter_config.json is " +
                (critic ? "a policy's adapter (a critic's has modules_to_save [\"classifier\", "
                          "\"score\"], task TOKEN_CLS)"
                        : "a critic's adapter (modules_to_save score)"));
  }
  auto adapters = std::make_unique<LoraAdapters>(model.config(), c, be, pad);
  if (path.empty()) {
    adapters->init_fresh(static_cast<uint64_t>(f.integer("seed", static_cast<int64_t>(seed))),
                         critic ? model.value_head() : std::vector<float>{});
  } else {
    adapters->load(path);
  }
  return adapters;
}

// The load reply's `lora` or `critic_lora`: what the adapters are and how many values train.
json::Value lora_reply(const LoraAdapters& lora, int hidden) {
  size_t trainable = 0;
  for (const LoraModule& m : lora.modules()) {
    trainable += static_cast<size_t>(lora.config().rank) * (m.in + m.out);
  }
  if (lora.config().value_head) trainable += static_cast<size_t>(hidden) + 1;
  json::Value targets = json::Value::array();
  for (const std::string& n : lora.config().target_names()) targets.push(json::Value(n));
  return json::Value::object({{"rank", lora.config().rank},
                              {"alpha", lora.config().alpha},
                              {"scaling", lora.config().scaling()},
                              {"use_rslora", lora.config().use_rslora},
                              {"target_modules", targets},
                              {"value_head", lora.config().value_head},
                              {"trainable_parameters", static_cast<int64_t>(trainable)}});
}

// All or nothing: the new models and learners replace the session's only once all loaded.
// The trained models' buffers are padded for the ZeRO shards (learner.h); the reference,
// which nobody trains, keeps its compute copy alone (no fp32 masters where that is not them).
void load(TrainerSession& s, const JsonFields& f) {
  const uint64_t seed = static_cast<uint64_t>(f.integer("seed", 1));
  const long stage = f.integer("zero_stage", 0);
  if (stage < 0 || stage > 2) {
    throw Error("'zero_stage' must be 0, 1 or 2, got " + std::to_string(stage));
  }
  const size_t pad = zero_pad_multiple(static_cast<int>(stage), s.comm.size());
  const JsonFields actor_optim = f.object("actor_optim"), critic_optim = f.object("critic_optim");
  actor_optim.only(kOptimFields);
  critic_optim.only(kOptimFields);
  const Offload actor_offload = read_offload(f, "actor_offload");
  const Offload critic_offload = read_offload(f, "critic_offload");
  if (f.has("critic_offload") && !f.has("critic")) {
    throw Error("'critic_offload' needs a 'critic' to offload");
  }
  TrainerSession next{s.be, s.comm, s.run, f.text("policy"),
                      f.has("critic") ? f.text("critic") : "",
                      nullptr, nullptr, nullptr, nullptr, nullptr};
  // With LoRA the adapters are sharded, not the frozen base.
  next.policy = Qwen2Model::load(next.policy_dir, s.be, Head::LanguageModel,
                                 f.has("lora") ? 1 : pad);
  if (f.has("lora")) {
    // The reference is the policy with its adapters off; the learner trains the adapters.
    for (const char* key : {"reference", "reference_offload"}) {
      if (f.has(key)) {
        throw Error(std::string("'") + key + "' does not go with 'lora' (the reference is the " +
                    "policy with its adapters off: there is no second model)");
      }
    }
    if (actor_offload.grad || actor_offload.optimizer) {
      throw Error("'actor_offload' with 'lora': only 'param' (the frozen base's compute copy " +
                  std::string("between commands); the adapters' gradients and AdamW moments ") +
                  "stay on the device");
    }
    next.policy->attach_lora(read_lora(f, "lora", *next.policy, s.be, seed, pad));
  }
  next.reference_offload = f.boolean("reference_offload", false);
  if (next.reference_offload && !f.has("reference")) {
    throw Error("'reference_offload' needs a 'reference' to offload");
  }
  if (f.has("reference")) {
    next.reference = Qwen2Model::load(f.text("reference"), s.be);
    next.reference->drop_masters();
    if (next.reference_offload) next.reference->to_host();
  }
  next.actor = std::make_unique<Learner>(*next.policy, read_adamw(actor_optim),
                                         read_schedule(actor_optim, kActorLr), seed, s.comm,
                                         static_cast<int>(stage), actor_offload);
  if (actor_offload.param) next.policy->to_host();  // with LoRA: the frozen base
  if (f.has("critic_lora") && !f.has("critic")) {
    throw Error("'critic_lora' needs a 'critic' to attach the adapters to");
  }
  if (f.has("critic")) {
    // With adapters the critic's base is frozen (not sharded): they train, with its value head.
    next.critic = Qwen2Model::load(next.critic_dir, s.be, Head::Value,
                                   f.has("critic_lora") ? 1 : pad);
    if (f.has("critic_lora")) {
      if (critic_offload.grad || critic_offload.optimizer) {
        throw Error("'critic_offload' with 'critic_lora': only 'param' (the frozen base's " +
                    std::string("compute copy between commands); the adapters' gradients and ") +
                    "AdamW moments stay on the device");
      }
      next.critic->attach_lora(read_lora(f, "critic_lora", *next.critic, s.be, seed + 1, pad));
    }
    next.critic_learner = std::make_unique<Learner>(
        *next.critic, read_adamw(critic_optim), read_schedule(critic_optim, kCriticLr), seed + 1,
        s.comm, static_cast<int>(stage), critic_offload);
    if (critic_offload.param) next.critic->to_host();
  }
  s.reset();
  s.policy_dir = next.policy_dir;
  s.critic_dir = next.critic_dir;
  s.policy = std::move(next.policy);
  s.reference = std::move(next.reference);
  s.critic = std::move(next.critic);
  s.actor = std::move(next.actor);
  s.critic_learner = std::move(next.critic_learner);
  s.reference_offload = next.reference_offload;
}

// The models a command runs on come to the device for it, and those that waited in host
// memory (load's reference_offload, and the param offload of actor_offload and
// critic_offload) go back after it, as verl's workers wrap each method in
// load_fsdp_model_to_gpu and offload_fsdp_model_to_cpu (verl/workers/fsdp_workers.py); after
// a failed command too. A trained model's weights are copied out only when they changed
// (Qwen2Model::to_host). Every one of them frees its activation buffers after the command
// (to_host with the weights), so a phase holds those of its own passes alone, as PyTorch
// frees a pass's activations when it ends (its caching allocator keeps the memory, to the
// same effect for the next pass); the next command allocates them again (a cudaMalloc each
// on CUDA, whose backend pools nothing: milliseconds, against commands of seconds).
class OnDevice {
 public:
  OnDevice() = default;
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  ~OnDevice() {
    for (Qwen2Model* m : used_) m->release_activations();
    for (Qwen2Model* m : back_) {
      try {
        m->to_host();
      } catch (const Error&) {  // a device error; the next command reports it
      }
    }
  }
  void bring(Qwen2Model& m) {
    used_.push_back(&m);
    if (!m.on_host()) return;
    back_.push_back(&m);
    m.to_device();
  }

 private:
  std::vector<Qwen2Model*> used_, back_;
};

// Switches a model's adapters off for a scope.
class AdaptersOff {
 public:
  AdaptersOff(Qwen2Model& m, bool off) : m_(off ? &m : nullptr) {
    if (m_ != nullptr) m_->set_adapters_enabled(false);
  }
  ~AdaptersOff() {
    if (m_ != nullptr) m_->set_adapters_enabled(true);
  }
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;

 private:
  Qwen2Model* m_;
};

// Runs `write` on the ranks that `writes` (the ranks hold the same weights and outputs), then
// has every rank wait for them: the writers' outcomes are summed over the ranks, so every
// rank replies after the files are complete, and with an error when a writer could not write
// them (`writers` names them in that message).
void on_writers(TrainerSession& s, const std::string& op, bool writes, const std::string& writers,
                const std::function<void()>& write) {
  if (s.comm.local()) return write();
  std::string error;
  if (writes) {
    try {
      write();
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const double failed = all_reduce_sum(s.comm, error.empty() ? 0 : 1, op + "'s outcome on " + writers);
  if (!error.empty()) throw Error(error);
  if (failed != 0) throw Error(op + " failed on " + writers + ", which write the files (their replies say why)");
}

void on_rank_0(TrainerSession& s, const std::string& op, const std::function<void()>& write) {
  on_writers(s, op, s.comm.rank() == 0, "rank 0", write);
}

// What a checkpoint holds, on rank 0: every learner's whole state (Learner::snapshot, a
// collective from ZeRO stage 1 on, so every rank takes it).
struct CheckpointState {
  Learner::Snapshot actor, critic;
};

CheckpointState checkpoint_state(TrainerSession& s) {
  CheckpointState c;
  c.actor = s.actor_learner().snapshot("save_checkpoint's actor state");
  if (s.critic) c.critic = s.critic_learner->snapshot("save_checkpoint's critic state");
  return c;
}

// fp32 weights and every learner's state: loading them resumes bit-exactly. The layout is
// one rank's at every ZeRO stage and number of ranks (learner.h), so it resumes on any.
void save_checkpoint(TrainerSession& s, const std::string& dir, bool overwrite,
                     const CheckpointState& state) {
  if (!overwrite && std::filesystem::exists(dir)) {
    throw Error(dir + ": already exists (set \"overwrite\": true to replace it)");
  }
  OutputFolder out(dir, overwrite);
  const auto save_model = [&](Qwen2Model& m, const std::string& source, const char* name,
                              const std::vector<float>& masters) {
    OutputFolder part(out.dir() + "/" + name, false);
    write_hf_model(part, m, source, DType::F32, kMaxShardBytes,
                   masters.empty() ? nullptr : masters.data());
    part.commit();
  };
  if (s.policy->lora() != nullptr) {  // the adapter alone: the base is the loaded policy
    OutputFolder part(out.dir() + "/adapter", false);
    s.policy->lora()->save(part.dir(), s.policy_dir);
    part.commit();
  } else {
    save_model(*s.policy, s.policy_dir, "policy", state.actor.masters);
  }
  Learner::save_state(state.actor, out.dir(), "actor");
  if (s.critic && s.critic->lora() != nullptr) {  // its adapter, value head included
    OutputFolder part(out.dir() + "/critic_adapter", false);
    s.critic->lora()->save(part.dir(), s.critic_dir);
    part.commit();
    Learner::save_state(state.critic, out.dir(), "critic");
  } else if (s.critic) {
    save_model(*s.critic, s.critic_dir, "critic", state.critic.masters);
    Learner::save_state(state.critic, out.dir(), "critic");
  }
  out.commit();
}

// All or nothing: every file is read and checked before anything changes.
void load_checkpoint(TrainerSession& s, const std::string& dir) {
  Qwen2Model& policy = s.model("policy");
  LoraAdapters* lora = policy.lora();
  if (lora == nullptr) policy.check_weights(dir + "/policy");
  const Learner::State actor = s.actor_learner().read_state(dir, "actor", dir + "/policy");
  Learner::State critic;
  LoraAdapters* critic_lora = s.critic ? s.critic->lora() : nullptr;
  if (s.critic) {
    if (critic_lora == nullptr) s.critic->check_weights(dir + "/critic");
    critic = s.critic_learner->read_state(dir, "critic", dir + "/critic");
  }
  // The adapters check everything they read before they change.
  if (lora != nullptr) lora->load(dir + "/adapter");
  if (critic_lora != nullptr) critic_lora->load(dir + "/critic_adapter");
  if (lora == nullptr) policy.reload_weights(dir + "/policy");
  s.actor->restore_state(actor);
  if (s.critic) {
    if (critic_lora == nullptr) s.critic->reload_weights(dir + "/critic");
    s.critic_learner->restore_state(critic);
  }
}

// The trained models (a checkpoint's).
void bring_trained(TrainerSession& s, OnDevice& on_device) {
  on_device.bring(s.model("policy"));
  if (s.critic) on_device.bring(*s.critic);
}

// The load reply's `memory`: bytes this rank holds for each model (Learner::Memory).
json::Value memory_reply(const TrainerSession& s) {
  const auto learner = [](const Learner& l) { return l.memory().json(); };
  json::Value r = json::Value::object({{"actor", learner(*s.actor)}});
  if (s.reference) {
    r.set("reference",
          json::Value::object({{"weights", static_cast<int64_t>(s.reference->weight_bytes())},
                               {"master_weights",
                                static_cast<int64_t>(s.reference->master_bytes())},
                               {"host_weights",
                                static_cast<int64_t>(s.reference->host_bytes())}}));
  }
  if (s.critic_learner) r.set("critic", learner(*s.critic_learner));
  return r;
}

}  // namespace

json::Value handle_command(TrainerSession& s, const std::string& op, const JsonFields& f) {
  json::Value r = json::Value::object();
  f.only(fields_of(op));
  OnDevice on_device;
  if (op == "load") {
    load(s, f);
    r.set("parameters", static_cast<int64_t>(s.policy->param_buffer_size()));
    r.set("device", s.be.name());
    r.set("zero_stage", s.actor->zero_stage());
    const int hidden = s.policy->config().hidden_size;
    if (const LoraAdapters* lora = s.policy->lora()) r.set("lora", lora_reply(*lora, hidden));
    if (s.critic && s.critic->lora() != nullptr) {
      r.set("critic_lora", lora_reply(*s.critic->lora(), hidden));
    }
    r.set("memory", memory_reply(s));
  } else if (op == "log_probs") {
    const std::string which = f.text("model", "policy");
    Qwen2Model& m = s.model(which);
    on_device.bring(m);
    // A LoRA policy's reference: the same model with its adapters off (on again after).
    AdaptersOff off(m, which == "reference" && m.lora() != nullptr);
    const BatchFile b = open_batch(f, m);
    const RunOptions run = read_run(f, s.run);
    // This rank's rows, then every rank's (zeros elsewhere: the sum is exact).
    const size_t n = b.batch.ids.size();
    std::vector<float> out(2 * n);
    float *lp = out.data(), *ent = out.data() + n;
    for (const MicroBatch& p : rank_packed_groups(b.batch, read_micro_batch_size(f), s.comm)) {
      std::vector<float> plp(p.source.size()), pent(plp.size());
      m.score(p.batch, run, plp.data(), pent.data());
      unpack(p, plp.data(), lp);
      unpack(p, pent.data(), ent);
    }
    s.comm.all_reduce_sum_host(out.data(), out.size(), "log_probs's outputs");
    const std::string path = f.text("out");
    on_rank_0(s, op, [&] {
      write_token_tensors(path, b.batch, {{"log_probs", lp}, {"entropy", ent}});
    });
  } else if (op == "values") {
    Qwen2Model& critic = s.critic_of().model();
    on_device.bring(critic);
    const BatchFile b = open_batch(f, critic);
    std::vector<float> v(b.batch.ids.size());
    for (const MicroBatch& p : rank_packed_groups(b.batch, read_micro_batch_size(f), s.comm)) {
      std::vector<float> pv(p.source.size());
      critic.values(p.batch, s.run, pv.data());
      unpack(p, pv.data(), v.data());
    }
    s.comm.all_reduce_sum_host(v.data(), v.size(), "values's outputs");
    const std::string path = f.text("out");
    on_rank_0(s, op, [&] { write_token_tensors(path, b.batch, {{"values", v.data()}}); });
  } else if (op == "update_actor") {
    Learner& actor = s.actor_learner();
    on_device.bring(actor.model());
    ActorUpdateOptions opt{read_ppo(f), read_batching(f), read_run(f, s.run)};
    const BatchFile b = open_batch(f, actor.model());
    // Without a KL term the reference log-probs are optional (kl_loss is then null).
    const bool with_ref = opt.ppo.kl_coef != 0 || b.file->find("ref_log_probs") != nullptr;
    // rollout_is_weights (rollout correction) is optional: without it every weight is 1.
    const bool with_is = b.file->find("rollout_is_weights") != nullptr;
    const RolloutTokens tokens{b.tensor("response_mask"), b.tensor("old_log_probs"),
                               with_ref ? b.tensor("ref_log_probs") : std::vector<float>{},
                               b.tensor("advantages"),
                               with_is ? b.tensor("rollout_is_weights") : std::vector<float>{}};
    const ActorMetrics m = update_actor(actor, b.batch, tokens, opt);
    r.set("pg_loss", m.pg_loss);
    r.set("pg_clipfrac", m.pg_clipfrac);
    r.set("ppo_kl", m.ppo_kl);
    r.set("entropy", m.entropy);
    r.set("kl_loss", with_ref ? json::Value(m.kl_loss) : json::Value());
    r.set("grad_norm", m.grad_norm);
    r.set("lr", static_cast<double>(m.lr));
    r.set("tokens", static_cast<int64_t>(m.tokens));
    r.set("optimizer_steps", m.steps);
    r.set("micro_batches", m.micro_batches);
    r.set("global_step", actor.steps());
  } else if (op == "update_critic") {
    Learner& critic = s.critic_of();
    on_device.bring(critic.model());
    CriticUpdateOptions opt;
    opt.cliprange_value = static_cast<float>(f.number("cliprange_value", opt.cliprange_value));
    if (!(opt.cliprange_value >= 0)) throw Error("'cliprange_value' must be >= 0");
    opt.agg = read_loss_agg(f, opt.agg);
    opt.batching = read_batching(f);
    opt.run = s.run;
    const BatchFile b = open_batch(f, critic.model());
    const CriticTokens tokens{b.tensor("response_mask"), b.tensor("values"), b.tensor("returns")};
    const CriticMetrics m = update_critic(critic, b.batch, tokens, opt);
    r.set("vf_loss", m.vf_loss);
    r.set("vf_clipfrac", m.vf_clipfrac);
    r.set("vpred_mean", m.vpred_mean);
    r.set("grad_norm", m.grad_norm);
    r.set("lr", static_cast<double>(m.lr));
    r.set("optimizer_steps", m.steps);
    r.set("micro_batches", m.micro_batches);
    r.set("global_step", critic.steps());
  } else if (op == "export") {
    Qwen2Model& m = s.model("policy");
    on_device.bring(m);
    // `adapter`: the LoRA adapter alone, a PEFT folder as save_checkpoint's dir/adapter (in
    // fp32, as the trainer keeps it), for an engine that serves it unmerged.
    const bool adapter = f.boolean("adapter", false);
    if (adapter && m.lora() == nullptr) {
      throw Error("'adapter': the policy has no LoRA adapter (load without 'lora')");
    }
    DType dtype;
    const std::string name = f.text("dtype", adapter ? "fp32" : "bf16");
    if (!float_dtype_from_text(name, &dtype)) {
      throw Error("'dtype' must be bf16, fp16 or fp32, got \"" + name + "\"");
    }
    if (adapter && dtype != DType::F32) {
      throw Error("'dtype' \"" + name + "\" with 'adapter': the adapter is written in fp32, as "
                  "the trainer keeps it");
    }
    // Without whole fp32 masters (ZeRO on CUDA) the bf16 compute copy is the bf16 export
    // exactly; any other dtype is written from the fp32 shards, gathered to rank 0.
    const bool gathered = m.lora() == nullptr && m.params() == nullptr && dtype != DType::BF16;
    // With LoRA: the base with each adapter merged into it (PEFT's merge_and_unload).
    std::vector<float> merged;
    if (m.lora() != nullptr && !adapter) {
      merged.resize(m.param_buffer_size());
      // The frozen base has no fp32 masters apart from its compute copy (Learner, LoRA).
      if (m.params() != nullptr) s.be.download(merged.data(), m.params(), merged.size());
      else s.be.download_x(merged.data(), m.weights(), merged.size());
      m.lora()->merge(m.layout(), merged.data());
    }
    const auto write = [&](const std::string& path, const std::vector<float>& masters) {
      OutputFolder out(path, true);
      if (adapter) {
        m.lora()->save(out.dir(), s.policy_dir);
      } else {
        write_hf_model(out, m, s.policy_dir, dtype, kMaxShardBytes,
                       masters.empty() ? nullptr : masters.data());
      }
      out.commit();
    };
    if (f.has("node_outs")) {
      // One folder per node, which the node's first rank writes from its own whole copy.
      if (f.has("out")) throw Error("export: give 'out' or 'node_outs', not both");
      const std::vector<std::string> outs = f.text_list("node_outs");
      if (gathered) {
        throw Error("'node_outs': each node's first rank writes its compute copy, which here "
                    "holds bf16 alone (ZeRO on CUDA): give dtype bf16");
      }
      // A writer's own error (its node past the list) is summed like a failed write, so the
      // other ranks reply instead of waiting for it.
      on_writers(s, op, s.local_rank == 0, "each node's first rank", [&] {
        if (static_cast<size_t>(s.node) >= outs.size()) {
          throw Error("'node_outs' names " + std::to_string(outs.size()) +
                      " folders, but this rank runs on node " + std::to_string(s.node));
        }
        write(outs[static_cast<size_t>(s.node)], merged);
      });
    } else {
      const std::string path = f.text("out");
      const std::vector<float> masters =
          gathered ? s.actor_learner().gather_masters("export's fp32 weights") : merged;
      on_rank_0(s, op, [&] { write(path, masters); });
    }
  } else if (op == "save_checkpoint") {
    bring_trained(s, on_device);
    const std::string dir = f.text("dir");
    const bool overwrite = f.boolean("overwrite", false);
    const CheckpointState state = checkpoint_state(s);
    on_rank_0(s, op, [&] { save_checkpoint(s, dir, overwrite, state); });
    r.set("global_step", s.actor_learner().steps());
  } else if (op == "load_checkpoint") {
    bring_trained(s, on_device);
    load_checkpoint(s, f.text("dir"));
    r.set("global_step", s.actor_learner().steps());
  } else if (op == "profile") {
    auto* profiled = dynamic_cast<ProfiledBackend*>(&s.be);
    if (profiled == nullptr) throw Error("profile: this trainer was started without --profile");
    const json::Value times = profiled->take_times();
    r.set("ops", *times.find("ops"));
    r.set("device_ms", *times.find("device_ms"));
  }
  return r;
}


}  // namespace sr1
