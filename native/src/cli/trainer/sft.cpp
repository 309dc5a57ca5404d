// searchr1-trainer sft: supervised next-token training; saves a Hugging Face folder.
#include <cstdio>
#include <memory>

#include "cli/common.h"
#include "cli/trainer/commands.h"
#include "cli/trainer/options.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "model/hf_folder.h"
#include "model/lora.h"
#include "model/qwen2.h"
#include "train/sft.h"
#include "util/error.h"

namespace sr1 {
namespace {

// The defaults shown are SftOptions' (with AdamWConfig's and LrSchedule's), which the parser
// below reads too.
std::vector<OptionSpec> sft_options() {
  const SftOptions d;
  const auto dflt = [](const std::string& v) { return " (default " + v + ")"; };
  return {
    {"model", "DIR", "Hugging Face model folder to start from (required)"},
    {"data", "IN", "safetensors with input_ids [B, T], optional attention_mask and loss_mask "
                   "(required)"},
    {"out", "DIR", "output Hugging Face folder (required)"},
    {"overwrite", "", "replace --out if it exists"},
    {"steps", "N", "optimizer steps" + dflt(std::to_string(d.steps))},
    {"batch-size", "N", "sequences per step, taken in order and wrapping (default: all)"},
    {"micro-batch-size", "N", "sequences per forward/backward; gradients accumulate "
                              "(default: batch size)"},
    {"lr", "X", "peak learning rate" + dflt(number_text(d.schedule.peak))},
    {"lr-schedule", "KIND", "constant | linear-warmup | cosine" + dflt(d.schedule.kind)},
    {"warmup-steps", "N", "linear warmup steps" + dflt(std::to_string(d.schedule.warmup_steps))},
    {"min-lr-ratio", "X",
     "cosine floor as a fraction of --lr" + dflt(number_text(d.schedule.min_lr_ratio))},
    {"weight-decay", "X", "AdamW decoupled weight decay" + dflt(number_text(d.adamw.weight_decay))},
    {"beta1", "X", "AdamW beta1" + dflt(number_text(d.adamw.beta1))},
    {"beta2", "X", "AdamW beta2" + dflt(number_text(d.adamw.beta2))},
    {"eps", "X", "AdamW epsilon" + dflt(number_text(d.adamw.eps))},
    {"max-grad-norm", "X",
     "clip the global gradient norm; 0 = off" + dflt(number_text(d.adamw.max_grad_norm, 1))},
    {"save-dtype", "D", "keep | bf16 | fp16 | fp32 (default keep: the dtype config.json "
                        "names)"},
    {"max-shard-size", "SIZE", "largest safetensors shard (default 5GB)"},
    {"metrics", "FILE", "also write one JSON line per step to FILE"},
    {"lora-rank", "R",
     "train fresh LoRA adapters of rank R (PEFT's init: A random, B zero) on the frozen "
     "model instead of the model; --out is then a PEFT adapter folder"},
    {"lora-alpha", "A", "their lora_alpha, scaling A / R" + dflt(number_text(LoraConfig().alpha))},
    {"lora-targets", "LIST",
     "their modules: all-linear (the default) or a list of q_proj, k_proj, v_proj, o_proj, "
     "gate_proj, up_proj, down_proj"},
    {"lora-seed", "N", "the seed of their fresh values (default 1)"},
  };
}

// --save-dtype; also accepts torch's names (bfloat16, float16, float32), which "keep" takes
// from config.json.
DType save_dtype(const std::string& name, const std::string& config_dtype) {
  DType d;
  if (float_dtype_from_text(name == "keep" ? config_dtype : name, &d)) return d;
  throw UsageError("--save-dtype: unknown dtype '" + name + "' (keep, bf16, fp16, fp32)");
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

int cmd_sft(const std::vector<std::string>& argv) {
  const Args args("searchr1-trainer sft",
                  "Trains on the token-mean cross-entropy of the loss_mask tokens (all\n"
                  "predicted tokens without one), prints the loss per step and saves the\n"
                  "model to --out (config and tokenizer files copied, safetensors weights).\n"
                  "With --lora-rank it trains LoRA adapters alone, the model frozen in its\n"
                  "compute copy, and saves them to --out as a PEFT adapter folder\n"
                  "(adapter_config.json, adapter_model.safetensors in F32).",
                  concat(concat(sft_options(), run_options(true)),
                         concat(device_options(), {profile_option()})),
                  argv,
                  {"searchr1-trainer sft --model models/Qwen2.5-0.5B-Instruct --data "
                   "sft.safetensors --out runs/sft/model --steps 20 --batch-size 4 "
                   "--micro-batch-size 2 --lr 1e-5 --lr-schedule cosine --warmup-steps 2 "
                   "--min-lr-ratio 0.1 --metrics sft.jsonl",
                   "searchr1-trainer sft --model models/Qwen2.5-0.5B-Instruct --data "
                   "sft.safetensors --out runs/sft/adapter --steps 20 --lr 1e-4 --lora-rank 8 "
                   "--lora-alpha 16 --lora-targets q_proj,v_proj"});
  if (print_help(args)) return 0;
  const std::string model_dir = args.required("model"), data_path = args.required("data");
  SftOptions opt;
  opt.steps = static_cast<int>(args.integer("steps", opt.steps, 1));
  opt.batch_size = static_cast<int>(args.integer("batch-size", opt.batch_size, 1));
  opt.micro_batch_size =
      static_cast<int>(args.integer("micro-batch-size", opt.micro_batch_size, 1));
  LrSchedule& lr = opt.schedule;
  lr.kind = args.text("lr-schedule", lr.kind);
  lr.peak = static_cast<float>(args.number("lr", lr.peak));
  lr.warmup_steps = static_cast<int>(args.integer("warmup-steps", lr.warmup_steps, 0));
  lr.total_steps = opt.steps;
  lr.min_lr_ratio = static_cast<float>(args.number("min-lr-ratio", lr.min_lr_ratio));
  lr.validate();
  AdamWConfig& adamw = opt.adamw;
  adamw.weight_decay = static_cast<float>(args.number("weight-decay", adamw.weight_decay));
  adamw.beta1 = static_cast<float>(args.number("beta1", adamw.beta1));
  adamw.beta2 = static_cast<float>(args.number("beta2", adamw.beta2));
  adamw.eps = static_cast<float>(args.number("eps", adamw.eps));
  adamw.max_grad_norm = static_cast<float>(args.number("max-grad-norm", adamw.max_grad_norm));
  opt.run = read_run_options(args);
  const unsigned long long max_shard = args.bytes("max-shard-size", kMaxShardBytes);

  const LoraConfig lora = read_lora_options(args);
  if (lora.rank == 0 && args.has("lora-seed")) throw UsageError("--lora-seed needs --lora-rank");
  for (const char* name : {"save-dtype", "max-shard-size"}) {
    if (lora.rank > 0 && args.has(name)) {
      throw UsageError(std::string("--") + name + " does not go with --lora-rank (the adapter " +
                       "folder holds F32 adapters alone)");
    }
  }
  const uint64_t lora_seed = static_cast<uint64_t>(args.integer("lora-seed", 1, 0));

  const auto backend = open_backend(args);
  const auto model = Qwen2Model::load(model_dir, *backend);
  const DType dtype = save_dtype(args.text("save-dtype", "keep"), model->config().torch_dtype);
  if (lora.rank > 0) {
    // The base frozen in its compute copy, as a LoRA learner keeps it (train/learner.cpp).
    auto adapters = std::make_unique<LoraAdapters>(model->config(), lora, *backend);
    adapters->init_fresh(lora_seed);
    model->drop_masters();
    model->attach_lora(std::move(adapters));
  }
  const auto file = SafetensorsFile::open(data_path);
  const Batch data = read_batch(*file, model->config().vocab_size);
  const std::vector<float> loss_mask = read_token_values(*file, "loss_mask", data, false);

  OutputFolder out(args.required("out"), args.flag("overwrite"));
  std::unique_ptr<std::FILE, FileCloser> metrics;
  if (args.has("metrics")) {
    const std::string path = args.required("metrics");
    metrics.reset(std::fopen(path.c_str(), "w"));
    if (!metrics) throw Error(path + ": cannot create metrics file");
  }
  install_interrupt_handler();
  double step_ms = 0;
  restart_profile(*backend);
  run_sft(*model, data, loss_mask, opt, [&](const SftStep& s) {
    step_ms += 1000 * s.seconds;
    std::printf("step %d/%d  loss %.6f  grad_norm %.4f  lr %.4e  tokens %ld  %.2fs  %.0f MiB\n",
                s.step, opt.steps, s.loss, s.grad_norm, s.lr, s.tokens, s.seconds,
                s.peak_memory_mb);
    std::fflush(stdout);
    if (metrics) {
      std::fprintf(metrics.get(),
                   "{\"step\":%d,\"loss\":%.9g,\"grad_norm\":%.9g,\"lr\":%.9g,\"tokens\":%ld,"
                   "\"seconds\":%.6f,\"peak_memory_mb\":%.3f}\n",
                   s.step, s.loss, s.grad_norm, s.lr, s.tokens, s.seconds, s.peak_memory_mb);
      std::fflush(metrics.get());
    }
    if (interrupted()) throw Interrupted{};
  });
  print_profile(*backend, step_ms);
  if (model->lora() != nullptr) {
    model->lora()->save(out.dir(), model_dir);
  } else {
    write_hf_model(out, *model, model_dir, dtype, max_shard);
  }
  out.commit();
  return 0;
}

}  // namespace sr1
