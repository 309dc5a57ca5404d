// searchr1-trainer plan: the device bytes the trainer and the engine would allocate for a
// model, read off the code that allocates them (the layouts counted, not allocated), for
// `searchr1 train --dry-run`'s memory plan (src/planning/memory-plan.ts). Only config.json
// is read: a model's weights are not needed.
#include <cstdio>

#include "backend/backend.h"
#include "cli/common.h"
#include "cli/trainer/commands.h"
#include "cli/trainer/options.h"
#include "engine/engine.h"
#include "engine/kv_budget.h"
#include "model/lora.h"
#include "model/paged.h"
#include "train/learner.h"
#include "util/error.h"
#include "util/json.h"

namespace sr1 {
namespace {

Offload read_offload(const Args& args) {
  Offload o;
  for (const std::string& part : split_list(args.text("offload", ""))) {
    if (part == "param") o.param = true;
    else if (part == "grad") o.grad = true;
    else if (part == "optimizer") o.optimizer = true;
    else throw UsageError("--offload: '" + part + "' is not one of param, grad, optimizer");
  }
  return o;
}

std::vector<size_t> read_tokens(const Args& args) {
  std::vector<size_t> out;
  for (const std::string& part : split_list(args.text("tokens", ""))) {
    size_t used = 0;
    long long n = -1;
    try {
      n = std::stoll(part, &used);
    } catch (const std::exception&) {
    }
    if (used != part.size() || n < 1) {
      throw UsageError("--tokens: '" + part + "' is not a positive whole number");
    }
    out.push_back(static_cast<size_t>(n));
  }
  return out;
}

json::Value bytes(size_t b) { return json::Value(static_cast<int64_t>(b)); }

// The activations of passes over `N` token rows, and the CUDA attention's scratch.
json::Value pass_json(const ModelConfig& c, size_t x_elem, bool cuda, size_t N) {
  const int chunk = Qwen2Model::default_logits_chunk(cuda);
  AttentionShape shape{1, static_cast<int>(N), c.num_heads, c.num_kv_heads, c.head_dim};
  return json::Value::object(
      {{"tokens", bytes(N)},
       {"forward", bytes(Qwen2Model::activation_bytes(c, x_elem, N, false, false, chunk))},
       {"backward", bytes(Qwen2Model::activation_bytes(c, x_elem, N, true, false, chunk))},
       {"backward_recompute",
        bytes(Qwen2Model::activation_bytes(c, x_elem, N, true, true, chunk))},
       {"attention_forward_scratch", bytes(cuda ? attention_forward_scratch(shape) : 0)},
       {"attention_backward_scratch", bytes(cuda ? attention_backward_scratch(shape) : 0)}});
}

// The adapters of load's `lora`: their flat buffer, their learner and each pass's scratch.
json::Value lora_json(const LoraConfig& config, const ModelConfig& c, const ParamLayout& layout,
                      size_t x_elem, int ranks, Offload offload,
                      const std::vector<size_t>& tokens) {
  const LoraLayout lora = lora_layout(c, config);
  json::Value scratch = json::Value::array();
  for (size_t N : tokens) {
    DeviceBuffers counted(nullptr, x_elem);
    lora_scratch(counted, N, static_cast<size_t>(config.rank), static_cast<size_t>(lora.max_out));
    scratch.push(bytes(counted.bytes()));
  }
  json::Value learner = json::Value::array();
  for (int stage = 0; stage <= 2; stage++) {
    learner.push(Learner::planned(layout, ranks, stage, x_elem, offload, &lora).json());
  }
  return json::Value::object(
      {{"floats", bytes(lora.total)}, {"learner", learner}, {"scratch", scratch}});
}

// The engine `train` starts on this device (searchr1-engine's defaults, cli/engine/main.cpp):
// its compute copy, its largest step's buffers, and the KV cache its budget gives it.
json::Value engine_json(const Args& args, const std::string& dir, const ModelConfig& c,
                        const ParamLayout& layout, size_t x_elem, bool cuda) {
  EngineOptions opt;
  opt.context_length = args.has("context-length")
                           ? static_cast<int>(args.integer("context-length", 0, 2))
                           : read_max_positions(dir);
  opt.chunk_tokens = cuda ? EngineOptions::kGpuChunkTokens : EngineOptions::kCpuChunkTokens;
  const int block = Engine::kBlockSize;
  const size_t weights = layout.total() * x_elem;
  const size_t workspace = cuda ? kMatmulWorkspaceBytes : 0;
  const size_t step = Engine::largest_step_bytes(c, x_elem, opt, block);
  const double gib = args.number("device-memory-gib", 0);
  if (!(gib > 0)) throw UsageError("--device-memory-gib must be above 0");
  const size_t total = static_cast<size_t>(gib * (1ull << 30));
  KvBudget budget;
  if (args.has("gpu-memory-utilization")) {
    budget.gpu_memory_utilization = args.number("gpu-memory-utilization", 0);
  }
  budget.context = opt.context_length;
  budget.max_running = opt.max_running;
  budget.block_size = block;
  budget.step_bytes = step;
  const size_t live = weights + workspace;
  const DeviceMemory device{!cuda, total, live, total > live ? total - live : 0, x_elem};
  json::Value out = json::Value::object(
      {{"weights", bytes(weights)},
       {"workspace", bytes(workspace)},
       {"step", bytes(step)},
       {"chunk_tokens", opt.chunk_tokens},
       {"max_running", opt.max_running},
       {"context_length", opt.context_length},
       {"block_size", block},
       {"kv_block", bytes(PagedKvCache::bytes_per_block(c, block, x_elem))}});
  try {
    out.set("kv_blocks", kv_blocks_for(budget, device, c));
    out.set("refused", json::Value());
  } catch (const UsageError& e) {  // no room for a block: the engine would refuse to start
    out.set("kv_blocks", 0);
    out.set("refused", e.what());
  }
  return out;
}

}  // namespace

int cmd_plan(const std::vector<std::string>& argv) {
  const Args args(
      "searchr1-trainer plan",
      "Prints one JSON line: the device bytes the trainer and the engine would allocate for\n"
      "the model, counted by the code that allocates them, without loading the weights:\n"
      "'parameters' and 'floats' (the flat buffer, alignment gaps included); 'learner': a\n"
      "trained model's bytes per rank at ZeRO stage 0, 1 and 2 (as the load reply's\n"
      "'memory'); 'compute_copy': an untrained copy's (the reference's); 'passes': for each\n"
      "--tokens count, the activations of a forward pass, of a backward pass with and\n"
      "without recomputation, and the CUDA attention's scratch; 'workspace': cuBLASLt's;\n"
      "with --device-memory-gib, 'engine': the engine's weights, step buffers and KV cache;\n"
      "with --lora-rank, 'lora': the adapters' 'floats', their 'learner' at ZeRO stage 0, 1\n"
      "and 2 (the base's compute copy and the adapters' state, as the load reply's\n"
      "'memory') and each pass's adapter 'scratch'; with --head value too, a critic's\n"
      "adapters (load's 'critic_lora'), the value head trained in full beside them.",
      {{"model", "DIR", "a Hugging Face folder; only its config.json is read (required)"},
       {"head", "KIND", "lm (a policy; the default) or value (a critic)"},
       {"device", "DEVICE", "cpu (fp32) or cuda (bf16 compute copy) (required)"},
       {"ranks", "N", "data-parallel ranks over every node (default 1)"},
       {"offload", "LIST", "what the learner keeps in host memory: param,grad,optimizer"},
       {"tokens", "LIST", "token rows of the passes to size, e.g. 4096,16384"},
       {"lora-rank", "R", "LoRA adapters of rank R on the model (load's 'lora' or 'critic_lora')"},
       {"lora-targets", "LIST", "their modules: all-linear (the default) or q_proj,k_proj,..."},
       {"device-memory-gib", "G", "the device's memory: plan the engine on it too"},
       {"gpu-memory-utilization", "U",
        "the engine's share of the device (searchr1-engine's option)"},
       {"context-length", "N", "the engine's context (default: max_position_embeddings)"}},
      argv,
      {"searchr1-trainer plan --model models/Qwen2.5-0.5B-Instruct --device cuda --ranks 8 "
       "--tokens 4096,16384 --device-memory-gib 80 --gpu-memory-utilization 0.4"});
  if (print_help(args)) return 0;
  const std::string dir = args.required("model");
  const std::string device = args.required("device");
  if (device != "cpu" && device != "cuda") {
    throw UsageError("--device: '" + device + "' is not cpu or cuda");
  }
  const std::string head_name = args.text("head", "lm");
  if (head_name != "lm" && head_name != "value") {
    throw UsageError("--head: '" + head_name + "' is not lm or value");
  }
  const bool cuda = device == "cuda";
  const size_t x_elem = cuda ? 2 : sizeof(float);
  const int ranks = static_cast<int>(args.integer("ranks", 1, 1));
  const Offload offload = read_offload(args);
  const std::vector<size_t> tokens = read_tokens(args);
  LoraConfig lora = read_lora_options(args);
  lora.value_head = head_name == "value";  // a critic's adapters train its value head too
  if (lora.rank > 0 && (offload.grad || offload.optimizer)) {
    throw UsageError("--offload: with --lora-rank only param (the frozen base) is offloaded");
  }
  const ModelConfig c = load_model_config(dir);
  const ParamLayout layout(c, head_name == "value" ? Head::Value : Head::LanguageModel);

  size_t parameters = 0;
  for (const ParamTensor& t : layout.tensors()) parameters += t.numel;
  json::Value learner = json::Value::array();
  for (int stage = 0; stage <= 2; stage++) {
    learner.push(Learner::planned(layout, ranks, stage, x_elem, offload).json());
  }
  json::Value passes = json::Value::array();
  for (size_t N : tokens) passes.push(pass_json(c, x_elem, cuda, N));
  json::Value out = json::Value::object({{"parameters", bytes(parameters)},
                                         {"floats", bytes(layout.total())},
                                         {"learner", learner},
                                         {"compute_copy", bytes(layout.total() * x_elem)},
                                         {"passes", passes},
                                         {"workspace", bytes(cuda ? kMatmulWorkspaceBytes : 0)}});
  if (args.has("device-memory-gib")) {
    out.set("engine", engine_json(args, dir, c, layout, x_elem, cuda));
  }
  if (lora.rank > 0) {
    out.set("lora", lora_json(lora, c, layout, x_elem, ranks, offload, tokens));
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace sr1
