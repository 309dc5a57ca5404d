// searchr1-trainer serve: the long-lived trainer that `train` drives. Commands arrive as
// JSON lines on stdin, one reply per command on stdout; tensors travel in safetensors
// files. The protocol is in train/SERVE.md.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "train/actor.h"
#include "util/error.h"
#include "util/json_fields.h"

namespace sr1 {
namespace {

void reply(json::Value r) { std::cout << r.dump() << std::endl; }

// The models and the actor's optimizer of one run.
struct Session {
  Backend& be;
  RunOptions run;
  std::string policy_dir;
  std::unique_ptr<Qwen2Model> policy, reference;
  std::unique_ptr<Actor> actor;

  Qwen2Model& model(const std::string& which) {
    if (!policy) throw Error("no model is loaded (send 'load' first)");
    if (which == "policy") return *policy;
    if (which == "reference") {
      if (!reference) throw Error("no reference model was loaded");
      return *reference;
    }
    throw Error("'model' must be \"policy\" or \"reference\", got \"" + which + "\"");
  }
  Actor& trainer() {
    if (!actor) throw Error("no model is loaded (send 'load' first)");
    return *actor;
  }
};

AdamWConfig read_adamw(const JsonFields& f) {
  AdamWConfig c;
  c.beta1 = static_cast<float>(f.number("beta1", c.beta1));
  c.beta2 = static_cast<float>(f.number("beta2", c.beta2));
  c.eps = static_cast<float>(f.number("eps", c.eps));
  c.weight_decay = static_cast<float>(f.number("weight_decay", c.weight_decay));
  c.max_grad_norm = static_cast<float>(f.number("grad_clip", c.max_grad_norm));
  return c;
}

LrSchedule read_schedule(const JsonFields& f) {
  LrSchedule s;
  s.kind = f.text("lr_schedule", s.kind);
  s.peak = static_cast<float>(f.number("lr", 1e-6));
  s.warmup_steps = static_cast<int>(f.integer("warmup_steps", 0));
  s.total_steps = static_cast<int>(f.integer("total_steps", 1));
  s.min_lr_ratio = static_cast<float>(f.number("min_lr_ratio", 0.0));
  return s;
}

ActorUpdateOptions read_update(const JsonFields& f, const RunOptions& run) {
  ActorUpdateOptions o;
  o.run = run;
  o.run.temperature = static_cast<float>(f.number("temperature", 1.0));
  if (!(o.run.temperature > 0)) throw Error("'temperature' must be > 0");
  o.mini_batch_size = static_cast<int>(f.integer("ppo_mini_batch_size", 0));
  o.epochs = static_cast<int>(f.integer("ppo_epochs", 1));
  o.max_token_len = f.integer("ppo_max_token_len_per_gpu", 0);
  o.shuffle = f.boolean("shuffle", true);
  if (o.mini_batch_size < 0 || o.epochs < 1 || o.max_token_len < 0) {
    throw Error("ppo_mini_batch_size and ppo_max_token_len_per_gpu must be >= 0, ppo_epochs >= 1");
  }
  PpoConfig& p = o.ppo;
  const double clip = f.number("clip_ratio", 0.2);
  p.clip_low = static_cast<float>(f.number("clip_ratio_low", clip));
  p.clip_high = static_cast<float>(f.number("clip_ratio_high", clip));
  p.clip_c = static_cast<float>(f.number("clip_ratio_c", 3.0));
  if (!(p.clip_low >= 0 && p.clip_low < 1 && p.clip_high >= 0 && p.clip_c > 1)) {
    throw Error("clip ratios must be in [0, 1) (high: >= 0) and clip_ratio_c above 1");
  }
  p.kl_type = parse_kl_type(f.text("kl_loss_type", "low_var_kl"));
  p.kl_coef = static_cast<float>(f.number("kl_loss_coef", 0.0));
  p.entropy_coeff = static_cast<float>(f.number("entropy_coeff", 0.0));
  p.agg = parse_loss_agg(f.text("loss_agg_mode", "token-mean"));
  return o;
}

struct BatchFile {
  std::unique_ptr<SafetensorsFile> file;
  Batch batch;
};

BatchFile open_batch(const JsonFields& f, const Qwen2Model& model) {
  BatchFile b;
  b.file = SafetensorsFile::open(f.text("batch"));
  b.batch = read_batch(*b.file, model.config().vocab_size);
  return b;
}

json::Value handle(Session& s, const std::string& op, const JsonFields& f) {
  json::Value r = json::Value::object();
  if (op == "load") {
    s.actor.reset();  // releases into the backend before the models go
    s.reference.reset();
    s.policy.reset();
    s.policy_dir = f.text("policy");
    s.policy = Qwen2Model::load(s.policy_dir, s.be);
    if (f.has("reference")) s.reference = Qwen2Model::load(f.text("reference"), s.be);
    s.actor = std::make_unique<Actor>(*s.policy, read_adamw(f), read_schedule(f),
                                      static_cast<uint64_t>(f.integer("seed", 1)));
    r.set("parameters", static_cast<int64_t>(s.policy->param_buffer_size()));
    r.set("device", s.be.name());
  } else if (op == "log_probs") {
    Qwen2Model& m = s.model(f.text("model", "policy"));
    const BatchFile b = open_batch(f, m);
    RunOptions run = s.run;
    run.temperature = static_cast<float>(f.number("temperature", 1.0));
    if (!(run.temperature > 0)) throw Error("'temperature' must be > 0");
    const std::vector<int64_t> shape = {b.batch.B, b.batch.T};
    std::vector<float> lp(b.batch.ids.size()), ent(lp.size());
    m.score(b.batch, run, lp.data(), ent.data());
    write_safetensors(f.text("out"), {{"log_probs", DType::F32, shape, lp.data()},
                                      {"entropy", DType::F32, shape, ent.data()}});
  } else if (op == "update_actor") {
    Actor& actor = s.trainer();
    const ActorUpdateOptions opt = read_update(f, s.run);
    const BatchFile b = open_batch(f, *s.policy);
    const auto tensor = [&](const char* name) {
      return read_token_values(*b.file, name, b.batch, true);
    };
    const RolloutTokens tokens{tensor("response_mask"), tensor("old_log_probs"),
                               opt.ppo.kl_coef != 0 ? tensor("ref_log_probs")
                                                    : std::vector<float>(b.batch.ids.size()),
                               tensor("advantages")};
    const ActorMetrics m = actor.update(b.batch, tokens, opt);
    r.set("pg_loss", m.pg_loss);
    r.set("pg_clipfrac", m.pg_clipfrac);
    r.set("ppo_kl", m.ppo_kl);
    r.set("entropy", m.entropy);
    r.set("kl_loss", m.kl_loss);
    r.set("grad_norm", m.grad_norm);
    r.set("lr", static_cast<double>(m.lr));
    r.set("tokens", static_cast<int64_t>(m.tokens));
    r.set("optimizer_steps", m.steps);
    r.set("micro_batches", m.micro_batches);
    r.set("global_step", actor.steps());
  } else if (op == "export") {
    Qwen2Model& m = s.model("policy");
    DType dtype;
    const std::string name = f.text("dtype", "bf16");
    if (!float_dtype_from_text(name, &dtype)) {
      throw Error("'dtype' must be bf16, fp16 or fp32, got \"" + name + "\"");
    }
    OutputFolder out(f.text("out"), true);
    write_hf_model(out, m, s.policy_dir, dtype, 5000000000ULL);
    out.commit();
  } else if (op == "save_checkpoint") {
    Actor& actor = s.trainer();
    // fp32 weights and optimizer state: loading them resumes bit-exactly.
    OutputFolder out(f.text("dir"), f.boolean("overwrite", false));
    OutputFolder policy_part(out.dir() + "/policy", false);
    write_hf_model(policy_part, *s.policy, s.policy_dir, DType::F32, 5000000000ULL);
    policy_part.commit();
    actor.save_state(out.dir());
    out.commit();
    r.set("global_step", actor.steps());
  } else if (op == "load_checkpoint") {
    Actor& actor = s.trainer();
    const std::string dir = f.text("dir");
    s.policy->reload_weights(dir + "/policy");
    actor.load_state(dir);
    r.set("global_step", actor.steps());
  } else {
    throw Error("unknown op '" + op + "' (load, log_probs, update_actor, export, "
                "save_checkpoint, load_checkpoint, shutdown)");
  }
  return r;
}

}  // namespace

int cmd_serve(const std::vector<std::string>& argv) {
  const Args args("searchr1-trainer serve",
                  "Runs as the trainer of a `train` run: JSON commands on stdin, one JSON reply\n"
                  "per command on stdout (protocol: native/src/train/SERVE.md).",
                  concat(run_options(true), device_options()), argv,
                  {"echo '{\"op\":\"shutdown\",\"id\":1}' | searchr1-trainer serve --threads 2"});
  if (print_help(args)) return 0;
  const std::unique_ptr<Backend> backend = open_backend(args);
  Session s{*backend, read_run_options(args), "", nullptr, nullptr, nullptr};
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    json::Value id;
    json::Value r;
    try {
      const json::Value cmd = json::parse(line);
      if (!cmd.is_object()) throw Error("a command must be a JSON object");
      const JsonFields f(cmd);
      if (const json::Value* v = cmd.find("id")) id = *v;
      const std::string op = f.text("op");
      if (op == "shutdown") {
        reply(json::Value::object({{"id", id}, {"ok", true}}));
        return 0;
      }
      r = handle(s, op, f);
      r.set("ok", true);
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      r = json::Value::object({{"ok", false}, {"error", e.what()}});
    }
    r.set("id", id);
    reply(r);
  }
  return 0;
}

}  // namespace sr1
