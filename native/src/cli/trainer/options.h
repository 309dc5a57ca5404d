// Options the trainer's subcommands share: how the model runs (--logits-chunk,
// --temperature, --recompute), and the model, batch and output file of score and grad.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/args.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "model/lora.h"
#include "model/qwen2.h"

namespace sr1 {

// --logits-chunk, --temperature, and --recompute where a backward pass runs; the defaults
// are RunOptions'.
std::vector<OptionSpec> run_options(bool backward);
RunOptions read_run_options(const Args& args);

// What score and grad share: --model, --batch, --out, the run and device options, and the
// model and batch they load.
std::vector<OptionSpec> batch_command_options(const std::string& batch_help, bool backward);
struct BatchCommand {
  std::unique_ptr<Backend> backend;  // declared first: the model releases into it
  std::unique_ptr<Qwen2Model> model;
  std::unique_ptr<SafetensorsFile> file;
  Batch batch;
  RunOptions run;
  std::string out;
};
BatchCommand open_batch_command(const Args& args);

// A list option's comma-separated entries, empty ones dropped.
std::vector<std::string> split_list(const std::string& list);

// The fresh adapters --lora-rank R, --lora-targets LIST (all-linear by default) and, where
// the command has it, --lora-alpha A ask for (plan sizes them, sft trains them); rank 0
// without --lora-rank, when the other two are refused.
LoraConfig read_lora_options(const Args& args);

}  // namespace sr1
