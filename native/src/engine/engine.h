// The inference engine: continuous batching over a paged KV cache with prefix reuse.
//
// Sequences wait in arrival order and run in steps. Each step decodes one token for every
// running sequence that has its whole context cached, and prefills up to `chunk_tokens`
// prompt tokens of the others (so a long prompt never stalls decoding for long). Sequences
// join and leave between steps. When the cache has no block for a decoding sequence, the
// newest running sequence is preempted: its blocks are released (the full ones stay in the
// prefix cache) and it waits at the front of the queue to be recomputed, keeping the
// tokens it already generated.
//
// LoRA adapters (PEFT folders) are loaded by name beside the base weights and applied
// unmerged to the rows of the sequences that name one (several adapters may share a step);
// each adapter's prefix cache is its own.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/sample_row.h"
#include "engine/block_manager.h"
#include "engine/grammar.h"
#include "engine/sampler.h"
#include "engine/token_mask.h"
#include "model/lora.h"
#include "model/qwen2.h"

namespace sr1 {

struct EngineOptions {
  int context_length = 0;  // longest prompt + output
  int max_running = 256;   // sequences in one step
  // Prompt tokens prefilled per step. searchr1-engine's default depends on the device: a
  // CPU step's cost grows with its rows, while a GPU is only kept busy by thousands of them
  // (vLLM's max_num_batched_tokens; Search-R1 ran vLLM with 8192).
  static constexpr int kCpuChunkTokens = 512, kGpuChunkTokens = 8192;
  int chunk_tokens = kCpuChunkTokens;
  int logits_chunk = 64;   // rows per language-model-head chunk
  // Decode steps replay graphs of the layers where the backend records them (vLLM's CUDA
  // graphs; --enforce-eager turns them off, as vLLM's enforce_eager).
  bool graphs = true;
};

// SGLang's and vLLM's penalties of the same names, and OpenAI's logit_bias
// (backend/sample_row.h's LogitsAdjust applies them).
struct Penalties {
  float repetition = 1;  // > 0; 1: off
  float frequency = 0, presence = 0;
  int min_new_tokens = 0;  // the end tokens are barred before this many tokens
  std::vector<std::pair<int32_t, float>> logit_bias;
  bool any() const {
    return repetition != 1 || frequency != 0 || presence != 0 || min_new_tokens > 0 ||
           !logit_bias.empty();
  }
};

struct GenerateRequest {
  std::string rid;
  std::vector<int32_t> input_ids;
  int max_new_tokens = 128;
  SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // How many of the most likely tokens to report beside each sampled one (0: none; a
  // vocabulary smaller than that reports all its tokens), at most kMaxTopLogprobs.
  int top_logprobs = 0;
  static constexpr int kMaxTopLogprobs = 1024;
  // The loaded LoRA adapter to generate with (Engine::load_adapter's name); empty: the base.
  std::string lora;
  // The grammar the output must follow (engine/grammar.h); null: none. EOS and the stop
  // tokens are drawn only where the grammar may end.
  std::shared_ptr<const Grammar> grammar;
  Penalties penalties;
};

// A LoRA adapter the engine serves beside its base weights, unmerged (PROTOCOL.md, "LoRA").
struct EngineAdapter {
  std::string name, path;
  std::unique_ptr<LoraAdapters> weights;
  // Its sequences' prefix-cache blocks hang off this root instead of the base's, so no KV
  // block is shared between adapters, or with the base; a fresh one per load.
  uint64_t root = 0;
  int order = 0;           // load order: a step's rows are grouped by it
  bool unloading = false;  // an unload waits for its sequences; new ones are refused
};

struct TokenOut {
  std::string rid;
  int32_t token;
  float logprob;
  // The request's top_logprobs most likely tokens with their log-probs under the
  // distribution `logprob` is taken under, most likely first (ties: lower id first).
  std::vector<TokenDraw> top;
};

struct Finished {
  std::string rid;
  std::string reason;   // stop, length, abort
  int32_t matched = -1;  // the stop token (reason stop), else -1
  int prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
};

struct StepResult {
  bool ran = false;  // the model ran (a prefill chunk may produce no token)
  std::vector<TokenOut> tokens;
  std::vector<Finished> finished;
  // Sequences ended because their next token could not be drawn (a grammar that became too
  // ambiguous): rid and why. Nothing more comes for them.
  std::vector<std::pair<std::string, std::string>> failed;
};

struct EngineStats {
  int running = 0, queued = 0;
  int kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0;
  uint64_t prompt_tokens = 0, prefix_hit_tokens = 0, generated_tokens = 0, decode_steps = 0;
  // Steps in which the KV cache was full: a queued sequence had to wait for room, or a
  // running one was preempted (preemptions counts those).
  uint64_t kv_full_steps = 0, preemptions = 0;
  // The KV cache's memory is given back (release_memory) until resume_memory.
  bool kv_released = false;
};

class Engine {
 public:
  Engine(Qwen2Model& model, int kv_blocks, int block_size, std::vector<int32_t> eos_ids,
         EngineOptions options);
  ~Engine();

  // Queues a request; throws sr1::Error with a message for the client when it is invalid
  // or can never fit the cache. max_new_tokens 0 finishes at once (see step()).
  void submit(GenerateRequest request);
  // Ends a live request with reason "abort"; nullopt-like empty rid when unknown.
  bool abort(const std::string& rid, Finished* out);
  std::vector<Finished> abort_all();

  // Runs one step when there is work; returns what it produced.
  StepResult step();
  bool has_work() const { return !running_.empty() || !waiting_.empty() || !instant_.empty(); }
  // Sequences that have started (running, or preempted after generating).
  bool has_started_work() const;
  // While paused, sequences that have not started stay queued (weight updates).
  void set_paused(bool paused) { paused_ = paused; }
  int live() const { return static_cast<int>(running_.size() + waiting_.size()); }
  // Queued sequences that have not started (they wait out a weight update).
  int not_started() const;
  // Drops the prefix cache; only when nothing is live.
  bool flush_cache();
  // Drops the prefix cache while queued sequences (which hold no blocks) wait: after a
  // weight update, when nothing is running.
  void reset_prefix_cache();
  // Frees the KV cache's memory (and drops the prefix cache): only when nothing is live;
  // until resume_memory(), submit() refuses. False with *why when refused.
  bool release_memory(std::string* why);
  // Takes the KV cache's memory again; false with *why when it cannot be had (still released).
  bool resume_memory(std::string* why);
  bool memory_released() const { return cache_.released(); }

  EngineStats stats() const;
  const EngineOptions& options() const { return opt_; }

  // LoRA adapters served beside the base weights, by name. load_adapter reads a PEFT folder
  // (model/lora.h) whose shapes and target modules fit the model; it throws naming the file
  // and field otherwise, or when the name is taken, and nothing changes.
  void load_adapter(const std::string& name, const std::string& dir);
  // Marks an adapter as going: generate refuses it from now on. False (with *why) when no
  // adapter has that name.
  bool begin_unload(const std::string& name, std::string* why);
  // Sequences queued or running with the adapter; forget_adapter once none is left.
  int adapter_users(const std::string& name) const;
  void forget_adapter(const std::string& name);
  // The loaded adapters (those being unloaded too): name, folder.
  std::vector<std::pair<std::string, std::string>> adapters() const;

  // The bytes each token id decodes to (engine/token_mask.h's VocabTrie; empty for special
  // tokens), which requests with a grammar need. Replaces what was set before; requests
  // already running keep the vocabulary they started with.
  void set_token_bytes(const std::vector<std::string>& token_bytes);

  // Device bytes of the model's buffers for the largest step under `options` (a prefill
  // chunk beside a decode row for every running sequence), which the KV cache must leave.
  static size_t largest_step_bytes(const ModelConfig& config, size_t x_elem,
                                   const EngineOptions& options, int block_size);
  // Positions per KV-cache block (vLLM's default block size).
  static constexpr int kBlockSize = 16;

 private:
  struct Sequence;
  using SeqPtr = std::unique_ptr<Sequence>;
  // Plans one step: which sequences run and how many of their tokens.
  struct Planned {
    Sequence* seq;
    int n;
  };
  std::vector<Planned> plan();
  // Block-table columns for sequences of up to `blocks` blocks: a power of two, so that
  // decode steps share a few graph shapes.
  static int table_columns(int blocks);
  bool admit(Sequence& s, std::unordered_set<uint64_t>& pending);
  bool grow(Sequence& s, int positions);  // blocks to cover `positions` tokens
  void preempt(Sequence& s);
  void release(Sequence& s);
  void publish_full_blocks(Sequence& s);
  void pending_hashes(const Sequence& s, std::unordered_set<uint64_t>& out) const;
  bool finished(Sequence& s, int32_t token, Finished* out) const;
  // The tokens a sequence with a grammar may draw next, end tokens included where it may end.
  std::vector<uint64_t> allowed_tokens(Sequence& s) const;
  // How a sequence's next row of logits changes (its penalties, its grammar); none: nothing.
  bool changes_logits(const Sequence& s) const;
  LogitsAdjust adjust_of(Sequence& s) const;
  Finished finish(Sequence& s, const std::string& reason, int32_t matched) const;
  void erase_running(Sequence* s);

  Qwen2Model& model_;
  PagedKvCache cache_;
  BlockManager blocks_;
  std::vector<int32_t> eos_;
  EngineOptions opt_;
  bool paused_ = false;
  uint64_t arrivals_ = 0;
  std::deque<SeqPtr> waiting_;      // arrival order; preempted sequences return to the front
  std::vector<SeqPtr> running_;     // arrival order
  std::vector<SeqPtr> instant_;     // max_new_tokens 0: finished by the next step()
  std::unordered_set<std::string> live_rids_;
  EngineStats totals_;
  std::map<std::string, std::unique_ptr<EngineAdapter>> adapters_;
  std::shared_ptr<const VocabTrie> vocab_;  // set_token_bytes'; null until then
  int adapter_loads_ = 0;
};

}  // namespace sr1
