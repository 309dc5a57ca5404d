#include "cli/trainer/options.h"

#include <sstream>

#include "cli/common.h"
#include "util/error.h"

namespace sr1 {

std::vector<OptionSpec> run_options(bool backward) {
  const RunOptions d;
  std::vector<OptionSpec> specs = {
      {"logits-chunk", "N",
       "token rows per vocabulary-sized logits block (default " +
           std::to_string(kCpuLogitsChunk) + " on the CPU, " + std::to_string(kGpuLogitsChunk) +
           " on CUDA)"},
      {"temperature", "T",
       "divide the logits by T before the softmax, as verl does (default " +
           number_text(d.temperature) + ")"}};
  if (backward) {
    specs.push_back({"recompute", "", "recompute layer activations in backward (less memory)"});
  }
  return specs;
}

RunOptions read_run_options(const Args& args) {
  RunOptions opt;
  opt.logits_chunk = static_cast<int>(args.integer("logits-chunk", opt.logits_chunk, 1));
  opt.recompute = args.flag("recompute");
  opt.temperature = static_cast<float>(args.number("temperature", opt.temperature));
  if (!(opt.temperature > 0)) throw UsageError("--temperature must be > 0");
  return opt;
}

std::vector<OptionSpec> batch_command_options(const std::string& batch_help, bool backward) {
  return concat(concat({{"model", "DIR", "Hugging Face model folder (required)"},
                        {"batch", "IN", batch_help + " (required)"},
                        {"out", "OUT", "output safetensors file (required)"},
                        {"lora", "DIR",
                         std::string("a PEFT LoRA adapter folder on top of the model") +
                             (backward ? " (the base frozen: the adapters' gradients alone)"
                                       : "")}},
                       run_options(backward)),
                device_options());
}

BatchCommand open_batch_command(const Args& args) {
  BatchCommand c;
  const std::string model_dir = args.required("model"), in = args.required("batch");
  c.out = args.required("out");
  c.run = read_run_options(args);
  c.backend = open_backend(args);
  c.model = Qwen2Model::load(model_dir, *c.backend);
  if (args.has("lora")) {
    const std::string dir = args.required("lora");
    auto adapters =
        std::make_unique<LoraAdapters>(c.model->config(), read_adapter_config(dir), *c.backend);
    adapters->load(dir);
    c.model->attach_lora(std::move(adapters));
  }
  c.file = SafetensorsFile::open(in);
  c.batch = read_batch(*c.file, c.model->config().vocab_size);
  return c;
}

std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

LoraConfig read_lora_options(const Args& args) {
  LoraConfig c;
  if (!args.has("lora-rank")) {
    for (const char* name : {"lora-targets", "lora-alpha"}) {
      if (args.has(name)) throw UsageError(std::string("--") + name + " needs --lora-rank");
    }
    c.rank = 0;
    return c;
  }
  c.rank = static_cast<int>(args.integer("lora-rank", 0, 1));
  if (args.has("lora-alpha")) c.alpha = args.number("lora-alpha", c.alpha);
  try {
    c.set_targets(split_list(args.text("lora-targets", "all-linear")));
  } catch (const Error& e) {
    throw UsageError(std::string("--lora-targets: ") + e.what());
  }
  return c;
}

}  // namespace sr1
