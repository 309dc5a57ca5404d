// searchr1-trainer grad: the loss of a batch and the gradient of every parameter, for
// checking the backward pass and an objective against one's own implementation. Two
// objectives: `weights` (L = -sum w_t * logprob_t) and `ppo` (the actor's RL objective).
#include "cli/common.h"
#include "cli/trainer/commands.h"
#include "cli/trainer/options.h"
#include "train/ppo_loss.h"
#include "util/error.h"

namespace sr1 {
namespace {

// The defaults shown are PpoConfig's, which read_ppo_config reads too.
std::vector<OptionSpec> ppo_options() {
  const PpoConfig d;
  return {{"loss", "weights|ppo", "the objective (default weights)"},
          {"clip-ratio", "EPS",
           "ppo: clip range of the ratio (default " + number_text(d.clip_low) + ")"},
          {"clip-ratio-low", "EPS", "ppo: lower clip range (default --clip-ratio)"},
          {"clip-ratio-high", "EPS", "ppo: upper clip range (default --clip-ratio)"},
          {"clip-ratio-c", "C",
           "ppo: dual-clip bound for negative advantages (default " + number_text(d.clip_c) + ")"},
          {"kl-loss-type", "TYPE", "ppo: low_var_kl (default), kl, mse or abs"},
          {"kl-loss-coef", "X",
           "ppo: weight of the KL loss (default " + number_text(d.kl_coef) + ": no KL term)"},
          {"entropy-coeff", "X",
           "ppo: weight of the entropy bonus (default " + number_text(d.entropy_coeff) + ")"},
          {"loss-agg-mode", "MODE",
           "ppo: token-mean (default), seq-mean-token-sum or seq-mean-token-mean"}};
}

float non_negative(const Args& args, const std::string& name, double fallback) {
  const double v = args.number(name, fallback);
  if (!(v >= 0)) throw UsageError("--" + name + " must be >= 0");
  return static_cast<float>(v);
}

PpoConfig read_ppo_config(const Args& args) {
  PpoConfig c;
  if (args.has("clip-ratio")) c.clip_low = c.clip_high = non_negative(args, "clip-ratio", 0);
  c.clip_low = non_negative(args, "clip-ratio-low", c.clip_low);
  c.clip_high = non_negative(args, "clip-ratio-high", c.clip_high);
  if (c.clip_low >= 1.0f) throw UsageError("--clip-ratio-low must be below 1");
  c.clip_c = static_cast<float>(args.number("clip-ratio-c", c.clip_c));
  if (!(c.clip_c > 1.0f)) throw UsageError("--clip-ratio-c must be greater than 1");
  if (args.has("kl-loss-type")) {
    c.kl_type = parse_kl_type(args.text("kl-loss-type", ""), OptionStyle::Flag);
  }
  c.kl_coef = non_negative(args, "kl-loss-coef", c.kl_coef);
  c.entropy_coeff = static_cast<float>(args.number("entropy-coeff", c.entropy_coeff));
  if (args.has("loss-agg-mode")) {
    c.agg = parse_loss_agg(args.text("loss-agg-mode", ""), OptionStyle::Flag);
  }
  return c;
}

}  // namespace

int cmd_grad(const std::vector<std::string>& argv) {
  const Args args(
      "searchr1-trainer grad",
      "Reads a batch (input_ids, attention_mask) from IN and writes OUT with the loss, the\n"
      "log-probs and 'grad.<tensor name>' for every parameter (with --lora, for every\n"
      "adapter tensor, by PEFT's names: the base is frozen).\n"
      "--loss weights: per-token 'weights' [B, T]; loss = -sum weights * logprobs.\n"
      "--loss ppo: 'response_mask', 'old_log_probs', 'ref_log_probs', 'advantages' [B, T],\n"
      "aligned as score's log-probs (position t: token t given those before it); the loss\n"
      "tokens are the predicted ones in the response mask, other values are ignored.\n"
      "loss = pg_loss - entropy_coeff * entropy + kl_loss_coef * kl_loss, each term\n"
      "aggregated with --loss-agg-mode; OUT also holds pg_loss, pg_clipfrac, kl_loss, entropy.",
      concat(batch_command_options("safetensors batch", true), ppo_options()), argv,
      {"searchr1-trainer grad --model models/Qwen2.5-0.5B-Instruct --batch "
       "batch.safetensors --out grads.safetensors --recompute --logits-chunk 64",
       "searchr1-trainer grad --loss ppo --model models/Qwen2.5-0.5B-Instruct --batch "
       "rollout.safetensors --out grads.safetensors --kl-loss-coef 0.001 --kl-loss-type "
       "low_var_kl"});
  if (print_help(args)) return 0;
  const std::string loss_kind = args.text("loss", "weights");
  if (loss_kind != "weights" && loss_kind != "ppo") {
    throw UsageError("--loss: '" + loss_kind + "' is not one of weights, ppo");
  }
  const PpoConfig ppo = read_ppo_config(args);
  BatchCommand c = open_batch_command(args);
  const Batch& batch = c.batch;
  std::vector<float> logprobs(batch.ids.size());
  std::vector<float> scalars;  // loss first, then the objective's own figures
  std::vector<std::string> names = {"loss"};
  if (loss_kind == "weights") {
    const std::vector<float> weights = read_token_values(*c.file, "weights", batch, true);
    scalars.push_back(
        static_cast<float>(c.model->backward(batch, weights.data(), c.run, logprobs.data())));
  } else {
    const auto tensor = [&](const char* name) {
      return read_token_values(*c.file, name, batch, true);
    };
    PpoObjective objective(batch, tensor("response_mask"), tensor("old_log_probs"),
                           tensor("ref_log_probs"), tensor("advantages"), ppo);
    c.model->backward(batch, objective, c.run, logprobs.data());
    scalars = {static_cast<float>(objective.loss()), static_cast<float>(objective.pg_loss()),
               static_cast<float>(objective.pg_clipfrac()),
               static_cast<float>(objective.kl_loss()), static_cast<float>(objective.entropy())};
    names = {"loss", "pg_loss", "pg_clipfrac", "kl_loss", "entropy"};
  }
  LoraAdapters* lora = c.model->lora();
  std::vector<float> grads(lora != nullptr ? lora->size() : c.model->param_buffer_size());
  c.backend->download(grads.data(), lora != nullptr ? lora->grads() : c.model->grads(),
                      grads.size());

  std::vector<TensorOut> tensors;
  for (size_t k = 0; k < names.size(); k++) {
    tensors.push_back({names[k], DType::F32, {1}, &scalars[k]});
  }
  tensors.push_back({"logprobs", DType::F32, {batch.B, batch.T}, logprobs.data()});
  if (lora != nullptr) {
    const int64_t r = lora->config().rank;
    for (const LoraModule& m : lora->modules()) {
      tensors.push_back({"grad." + m.prefix + ".lora_A.weight", DType::F32, {r, m.in},
                         grads.data() + m.a});
      tensors.push_back({"grad." + m.prefix + ".lora_B.weight", DType::F32, {m.out, r},
                         grads.data() + m.b});
    }
  }
  for (const ParamTensor& t : lora != nullptr ? std::vector<ParamTensor>{}
                                              : c.model->layout().tensors()) {
    tensors.push_back({"grad." + t.name, DType::F32, t.shape, grads.data() + t.offset});
  }
  write_safetensors(c.out, tensors);
  return 0;
}

}  // namespace sr1
