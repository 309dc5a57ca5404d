#include "engine/engine.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace sr1 {

struct Engine::Sequence {
  GenerateRequest req;
  std::vector<int32_t> tokens;  // prompt, then the generated tokens
  int prompt_len = 0;
  TokenRng rng;
  uint64_t arrival = 0;
  std::vector<int> blocks;       // cache blocks of positions 0, BS, 2*BS, ...
  std::vector<uint64_t> hashes;  // prefix hashes of the leading blocks that are published
  int computed = 0;              // positions whose keys and values are in the cache
  int cached_tokens = 0;         // prompt positions the prefix cache supplied
  bool admitted_once = false;
  EngineAdapter* adapter = nullptr;         // the LoRA adapter it runs with; null: the base
  uint64_t root = BlockManager::kRootHash;  // its prefix hashes start here (the adapter's)
  std::unique_ptr<TokenMasks> masks;        // the request's grammar; null: none
  // For the penalties: each output token's count, and the tokens of the prompt and the output
  // (those the repetition penalty applies to).
  std::unordered_map<int32_t, int32_t> counts;
  std::unordered_set<int32_t> seen;

  Sequence(GenerateRequest r, uint64_t order)
      : req(std::move(r)), rng(req.seed), arrival(order) {
    tokens = req.input_ids;
    prompt_len = static_cast<int>(tokens.size());
  }
  int length() const { return static_cast<int>(tokens.size()); }
  int generated() const { return length() - prompt_len; }
  bool decoding() const { return computed == length() - 1; }
};

Engine::Engine(Qwen2Model& model, int kv_blocks, int block_size, std::vector<int32_t> eos_ids,
               EngineOptions options)
    : model_(model),
      cache_(model.be(), model.config(), kv_blocks, block_size),
      blocks_(kv_blocks, block_size),
      eos_(std::move(eos_ids)),
      opt_(options) {
  // Refused here, before the engine announces itself ready, rather than at the first step.
  model.be().require_head_dim(model.config().head_dim);
}

Engine::~Engine() = default;

void Engine::submit(GenerateRequest r) {
  const int V = model_.config().vocab_size, ctx = opt_.context_length;
  if (r.rid.empty()) throw Error("rid must be a non-empty string");
  if (cache_.released()) {
    throw Error("the KV cache is released (release_memory_occupation): resume it first");
  }
  if (live_rids_.count(r.rid) != 0) throw Error("rid '" + r.rid + "' is already live");
  if (r.input_ids.empty()) throw Error("input_ids must not be empty");
  for (int32_t id : r.input_ids) {
    if (id < 0 || id >= V) {
      throw Error("input_ids: token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(V) + ")");
    }
  }
  const int prompt = static_cast<int>(r.input_ids.size());
  if (prompt >= ctx) {
    throw Error("input_ids: a prompt of " + std::to_string(prompt) +
                " tokens does not fit the context length " + std::to_string(ctx));
  }
  if (r.max_new_tokens < 0) throw Error("max_new_tokens must be >= 0");
  const SamplingParams& p = r.sampling;
  if (!(p.temperature >= 0)) throw Error("temperature must be >= 0");
  if (!(p.top_p > 0 && p.top_p <= 1)) throw Error("top_p must be in (0, 1]");
  if (p.top_k == 0 || p.top_k < -1) throw Error("top_k must be -1 (off) or at least 1");
  if (!(p.min_p >= 0 && p.min_p <= 1)) throw Error("min_p must be in [0, 1]");
  if (r.top_logprobs < 0 || r.top_logprobs > GenerateRequest::kMaxTopLogprobs) {
    throw Error("top_logprobs must be in [0, " +
                std::to_string(GenerateRequest::kMaxTopLogprobs) + "], got " +
                std::to_string(r.top_logprobs));
  }
  if (r.grammar != nullptr && vocab_ == nullptr) {
    throw Error("grammar: the engine has no token bytes yet (send token_bytes first)");
  }
  if (r.grammar != nullptr && r.ignore_eos) {
    throw Error("grammar: ignore_eos cannot be set with a grammar (the grammar says where to end)");
  }
  const Penalties& pen = r.penalties;
  if (!(pen.repetition > 0 && std::isfinite(pen.repetition))) {
    throw Error("repetition_penalty must be above 0 (1: off)");
  }
  for (const auto& [name, x] : {std::pair<const char*, float>{"frequency_penalty", pen.frequency},
                                {"presence_penalty", pen.presence}}) {
    if (!(x >= -2 && x <= 2)) throw Error(std::string(name) + " must be in [-2, 2]");
  }
  if (pen.min_new_tokens < 0) throw Error("min_new_tokens must be >= 0");
  if (pen.min_new_tokens > 0 && r.grammar != nullptr) {
    throw Error("min_new_tokens cannot be set with a grammar (the grammar says where to end)");
  }
  for (const auto& [id, bias] : pen.logit_bias) {
    if (id < 0 || id >= V || !std::isfinite(bias)) {
      throw Error("logit_bias: token " + std::to_string(id) + " must be in [0, " +
                  std::to_string(V) + ") with a finite bias");
    }
  }
  EngineAdapter* adapter = nullptr;
  if (!r.lora.empty()) {
    const auto it = adapters_.find(r.lora);
    if (it == adapters_.end()) {
      std::string names;
      for (const auto& [name, a] : adapters_) names += (names.empty() ? "" : ", ") + name;
      throw Error("lora: no adapter named '" + r.lora + "' is loaded (loaded: " +
                  (names.empty() ? "none" : names) + ")");
    }
    if (it->second->unloading) throw Error("lora: adapter '" + r.lora + "' is being unloaded");
    adapter = it->second.get();
  }
  const int total = prompt + std::min(r.max_new_tokens, ctx - prompt);
  const int need = (total + blocks_.block_size() - 1) / blocks_.block_size();
  if (need > blocks_.num_blocks()) {
    throw Error("a prompt of " + std::to_string(prompt) + " tokens with max_new_tokens " +
                std::to_string(r.max_new_tokens) + " needs " + std::to_string(need) +
                " KV blocks but the cache holds " + std::to_string(blocks_.num_blocks()) +
                " (raise --kv-cache-mb)");
  }
  live_rids_.insert(r.rid);
  auto seq = std::make_unique<Sequence>(std::move(r), arrivals_++);
  seq->adapter = adapter;
  if (adapter != nullptr) seq->root = adapter->root;
  if (seq->req.grammar != nullptr) {
    seq->masks = std::make_unique<TokenMasks>(vocab_, seq->req.grammar);
  }
  if (seq->req.penalties.repetition != 1) {
    seq->seen.insert(seq->tokens.begin(), seq->tokens.end());
  }
  if (seq->req.max_new_tokens == 0) {
    instant_.push_back(std::move(seq));
  } else {
    waiting_.push_back(std::move(seq));
  }
}

bool Engine::has_started_work() const {
  if (!running_.empty()) return true;
  return std::any_of(waiting_.begin(), waiting_.end(),
                     [](const SeqPtr& s) { return s->generated() > 0; });
}

int Engine::not_started() const {
  return static_cast<int>(std::count_if(waiting_.begin(), waiting_.end(),
                                        [](const SeqPtr& s) { return s->generated() == 0; }));
}

Finished Engine::finish(Sequence& s, const std::string& reason, int32_t matched) const {
  return Finished{s.req.rid, reason, matched, s.prompt_len, s.cached_tokens, s.generated()};
}

bool Engine::abort(const std::string& rid, Finished* out) {
  const auto match = [&](const SeqPtr& s) { return s->req.rid == rid; };
  for (auto* list : {&running_, &instant_}) {
    const auto it = std::find_if(list->begin(), list->end(), match);
    if (it == list->end()) continue;
    release(**it);
    *out = finish(**it, "abort", -1);
    list->erase(it);
    live_rids_.erase(rid);
    return true;
  }
  const auto it = std::find_if(waiting_.begin(), waiting_.end(), match);
  if (it == waiting_.end()) return false;
  release(**it);
  *out = finish(**it, "abort", -1);
  waiting_.erase(it);
  live_rids_.erase(rid);
  return true;
}

std::vector<Finished> Engine::abort_all() {
  std::vector<std::string> rids(live_rids_.begin(), live_rids_.end());
  std::vector<Finished> out;
  for (const std::string& rid : rids) {
    Finished f;
    if (abort(rid, &f)) out.push_back(f);
  }
  return out;
}

bool Engine::flush_cache() {
  if (live() > 0) return false;
  blocks_.flush();
  return true;
}

bool Engine::release_memory(std::string* why) {
  if (cache_.released()) {
    *why = "the KV cache is already released";
    return false;
  }
  if (live() > 0 || !instant_.empty()) {
    *why = "requests are running or queued; the KV cache is kept";
    return false;
  }
  blocks_.flush();
  cache_.release();
  model_.release_paged();  // the step's buffers go back too; the next step takes them again
  return true;
}

bool Engine::resume_memory(std::string* why) {
  if (!cache_.released()) {
    *why = "the KV cache is not released";
    return false;
  }
  try {
    cache_.resume();
  } catch (const Error& e) {
    *why = std::string("the KV cache could not be taken again: ") + e.what();
    return false;
  }
  return true;
}

void Engine::reset_prefix_cache() {
  if (!running_.empty()) throw Error("engine: prefix cache reset while sequences run");
  blocks_.flush();
}

EngineStats Engine::stats() const {
  EngineStats s = totals_;
  s.running = static_cast<int>(running_.size());
  s.queued = static_cast<int>(waiting_.size() + instant_.size());
  s.kv_blocks_total = blocks_.num_blocks();
  s.kv_blocks_used = blocks_.used();
  s.kv_blocks_cached = blocks_.cached();
  s.kv_released = cache_.released();
  return s;
}

// ---- LoRA adapters ----

namespace {

// splitmix64's finalizer: a root hash for each adapter load, far from the base's.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void Engine::load_adapter(const std::string& name, const std::string& dir) {
  if (name.empty()) throw Error("lora_name must be a non-empty string");
  if (adapters_.count(name) != 0) {
    throw Error("a LoRA adapter named '" + name + "' is already loaded (from " +
                adapters_.at(name)->path + "); unload it first");
  }
  // read_adapter_config and load throw naming the file and field (or tensor) that does not
  // fit this model; nothing is kept then.
  auto weights = std::make_unique<LoraAdapters>(model_.config(), read_adapter_config(dir),
                                                model_.be());
  weights->load(dir);
  auto a = std::make_unique<EngineAdapter>();
  a->name = name;
  a->path = dir;
  a->weights = std::move(weights);
  a->order = ++adapter_loads_;
  a->root = mix(BlockManager::kRootHash ^ static_cast<uint64_t>(a->order));
  adapters_[name] = std::move(a);
}

bool Engine::begin_unload(const std::string& name, std::string* why) {
  const auto it = adapters_.find(name);
  if (it == adapters_.end()) {
    *why = "no LoRA adapter named '" + name + "' is loaded";
    return false;
  }
  if (it->second->unloading) {
    *why = "the LoRA adapter '" + name + "' is already being unloaded";
    return false;
  }
  it->second->unloading = true;
  return true;
}

int Engine::adapter_users(const std::string& name) const {
  const auto uses = [&](const SeqPtr& s) {
    return s->adapter != nullptr && s->adapter->name == name;
  };
  return static_cast<int>(std::count_if(running_.begin(), running_.end(), uses) +
                          std::count_if(waiting_.begin(), waiting_.end(), uses) +
                          std::count_if(instant_.begin(), instant_.end(), uses));
}

void Engine::forget_adapter(const std::string& name) {
  if (adapter_users(name) != 0) throw Error("engine: adapter unloaded while in use (a bug)");
  adapters_.erase(name);
}

std::vector<std::pair<std::string, std::string>> Engine::adapters() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, a] : adapters_) out.emplace_back(name, a->path);
  return out;
}

// ---- cache bookkeeping ----

bool Engine::grow(Sequence& s, int positions) {
  const int need = (positions + blocks_.block_size() - 1) / blocks_.block_size();
  while (static_cast<int>(s.blocks.size()) < need) {
    const int b = blocks_.allocate();
    if (b < 0) return false;
    s.blocks.push_back(b);
  }
  return true;
}

void Engine::release(Sequence& s) {
  for (int b : s.blocks) blocks_.release(b);
  s.blocks.clear();
  s.hashes.clear();
  s.computed = 0;
}

void Engine::publish_full_blocks(Sequence& s) {
  const int BS = blocks_.block_size();
  while (static_cast<int>(s.hashes.size()) < s.computed / BS) {
    const size_t i = s.hashes.size();
    const uint64_t parent = i == 0 ? s.root : s.hashes.back();
    const int32_t* tokens = s.tokens.data() + i * BS;
    const uint64_t h = blocks_.hash(parent, tokens);
    blocks_.publish(s.blocks[i], parent, h, tokens);
    s.hashes.push_back(h);
  }
}

// Hashes of the full blocks a prefilling sequence has yet to publish.
void Engine::pending_hashes(const Sequence& s, std::unordered_set<uint64_t>& out) const {
  const int BS = blocks_.block_size();
  uint64_t parent = s.hashes.empty() ? s.root : s.hashes.back();
  for (int i = static_cast<int>(s.hashes.size()); i < s.length() / BS; i++) {
    parent = blocks_.hash(parent, s.tokens.data() + static_cast<size_t>(i) * BS);
    out.insert(parent);
  }
}

void Engine::preempt(Sequence& s) {
  release(s);
  const auto it = std::find_if(running_.begin(), running_.end(),
                               [&](const SeqPtr& p) { return p.get() == &s; });
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

void Engine::erase_running(Sequence* s) {
  running_.erase(std::find_if(running_.begin(), running_.end(),
                              [&](const SeqPtr& p) { return p.get() == s; }));
}

// Takes the cached prefix of a waiting sequence. Returns false (holding nothing) when the
// next block it needs is being computed by a running sequence: it waits a step and reuses
// that block instead of computing it a second time (GRPO's n copies of one prompt).
bool Engine::admit(Sequence& s, std::unordered_set<uint64_t>& pending) {
  const int BS = blocks_.block_size();
  const int reusable = (s.length() - 1) / BS;  // the last token is always computed
  uint64_t parent = s.root;
  for (int i = 0; i < reusable; i++) {
    const int32_t* tokens = s.tokens.data() + static_cast<size_t>(i) * BS;
    const uint64_t h = blocks_.hash(parent, tokens);
    const int b = blocks_.acquire_cached(parent, h, tokens);
    if (b < 0) break;
    s.blocks.push_back(b);
    s.hashes.push_back(h);
    parent = h;
  }
  s.computed = static_cast<int>(s.blocks.size()) * BS;
  const size_t next = s.blocks.size();
  if (static_cast<int>(next) < s.length() / BS &&
      pending.count(blocks_.hash(parent, s.tokens.data() + next * BS)) != 0) {
    release(s);
    return false;
  }
  return true;
}

std::vector<Engine::Planned> Engine::plan() {
  std::vector<Planned> out;
  bool full = false;
  // Decoding sequences first, one token each; preempt the newest when blocks run out.
  for (size_t i = 0; i < running_.size(); i++) {
    Sequence& s = *running_[i];
    if (!s.decoding()) continue;
    bool preempted_self = false;
    while (!grow(s, s.computed + 1)) {
      Sequence* victim = running_.back().get();
      preempt(*victim);
      totals_.preemptions++;
      full = true;
      if (victim == &s) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;  // s was the last running sequence
    out.push_back(Planned{&s, 1});
  }

  // Then prompt tokens, up to chunk_tokens: sequences mid-prefill, then new ones in order.
  int budget = opt_.chunk_tokens;
  std::unordered_set<uint64_t> pending;
  for (const SeqPtr& s : running_) {
    if (!s->decoding()) pending_hashes(*s, pending);
  }
  for (const SeqPtr& p : running_) {
    Sequence& s = *p;
    if (s.decoding() || budget == 0) continue;
    int n = std::min(budget, s.length() - s.computed);
    if (!grow(s, s.computed + n)) {
      n = static_cast<int>(s.blocks.size()) * blocks_.block_size() - s.computed;
    }
    if (n <= 0) continue;
    out.push_back(Planned{&s, n});
    budget -= n;
  }
  for (size_t j = 0; j < waiting_.size() && budget > 0 &&
                     static_cast<int>(running_.size()) < opt_.max_running;) {
    Sequence& s = *waiting_[j];
    if ((paused_ && s.generated() == 0) || !admit(s, pending)) {
      j++;
      continue;
    }
    const int n = std::min(budget, s.length() - s.computed);
    if (!grow(s, s.computed + n)) {
      release(s);
      full = true;
      break;  // no room: later arrivals wait too, so the queue keeps its order
    }
    if (!s.admitted_once) {
      s.admitted_once = true;
      s.cached_tokens = s.computed;
      totals_.prompt_tokens += s.prompt_len;
      totals_.prefix_hit_tokens += s.computed;
    }
    pending_hashes(s, pending);
    SeqPtr moved = std::move(waiting_[j]);
    waiting_.erase(waiting_.begin() + static_cast<long>(j));
    const auto at = std::find_if(running_.begin(), running_.end(), [&](const SeqPtr& r) {
      return r->arrival > moved->arrival;
    });
    running_.insert(at, std::move(moved));
    out.push_back(Planned{&s, n});
    budget -= n;
  }
  totals_.kv_full_steps += full;
  return out;
}

bool Engine::finished(Sequence& s, int32_t token, Finished* out) const {
  const auto has = [&](const std::vector<int32_t>& ids) {
    return std::find(ids.begin(), ids.end(), token) != ids.end();
  };
  if ((!s.req.ignore_eos && has(eos_)) || has(s.req.stop_token_ids)) {
    *out = finish(s, "stop", token);
  } else if (s.generated() >= s.req.max_new_tokens || s.length() >= opt_.context_length) {
    *out = finish(s, "length", -1);
  } else {
    return false;
  }
  return true;
}

std::vector<uint64_t> Engine::allowed_tokens(Sequence& s) const {
  std::vector<uint64_t> mask = s.masks->allowed();
  const auto set = [&](int32_t id, bool on) {
    if (id < 0 || static_cast<size_t>(id) / 64 >= mask.size()) return;
    const uint64_t bit = uint64_t{1} << (id % 64);
    mask[id / 64] = on ? (mask[id / 64] | bit) : (mask[id / 64] & ~bit);
  };
  // The end tokens come only where the grammar may end, and then always may.
  const bool end = s.masks->accepts();
  for (int32_t id : eos_) set(id, end);
  for (int32_t id : s.req.stop_token_ids) set(id, end);
  // A grammar no token can go on with (a byte no token spells) ends the sequence.
  if (std::all_of(mask.begin(), mask.end(), [](uint64_t w) { return w == 0; })) {
    for (int32_t id : eos_) set(id, true);
  }
  return mask;
}

bool Engine::changes_logits(const Sequence& s) const {
  return s.masks != nullptr || s.req.penalties.any();
}

LogitsAdjust Engine::adjust_of(Sequence& s) const {
  const Penalties& p = s.req.penalties;
  LogitsAdjust a;
  a.bias = p.logit_bias;
  if (s.generated() < p.min_new_tokens) {  // vLLM's min_tokens: no end token yet
    if (!s.req.ignore_eos) a.barred = eos_;
    a.barred.insert(a.barred.end(), s.req.stop_token_ids.begin(), s.req.stop_token_ids.end());
  }
  a.repetition = p.repetition;
  if (p.repetition != 1) a.seen.assign(s.seen.begin(), s.seen.end());
  a.frequency = p.frequency;
  a.presence = p.presence;
  if (p.frequency != 0 || p.presence != 0) a.counts.assign(s.counts.begin(), s.counts.end());
  if (s.masks != nullptr) a.allowed = allowed_tokens(s);
  return a;
}

void Engine::set_token_bytes(const std::vector<std::string>& token_bytes) {
  vocab_ = std::make_shared<const VocabTrie>(token_bytes, model_.config().vocab_size);
}

int Engine::table_columns(int blocks) {
  int columns = 1;
  while (columns < blocks) columns *= 2;
  return columns;
}

size_t Engine::largest_step_bytes(const ModelConfig& config, size_t x_elem,
                                  const EngineOptions& options, int block_size) {
  const int columns = table_columns((options.context_length + block_size - 1) / block_size);
  return PagedBuffers::bytes(x_elem, config, options.chunk_tokens + options.max_running,
                             options.max_running * columns, options.logits_chunk);
}

StepResult Engine::step() {
  StepResult res;
  for (SeqPtr& s : instant_) {
    res.finished.push_back(finish(*s, "length", -1));
    live_rids_.erase(s->req.rid);
  }
  instant_.clear();
  std::vector<Planned> planned = plan();
  if (planned.empty()) return res;
  res.ran = true;
  // The rows of one adapter lie together: the base first, then each adapter in load order.
  const auto order = [](const Planned& p) { return p.seq->adapter ? p.seq->adapter->order : 0; };
  std::stable_sort(planned.begin(), planned.end(),
                   [&](const Planned& a, const Planned& b) { return order(a) < order(b); });

  // The step's rows: each planned sequence's next n positions.
  PagedStep step;
  step.num_seqs = static_cast<int>(planned.size());
  int most_blocks = 1;
  for (const Planned& p : planned) {
    most_blocks = std::max(most_blocks, static_cast<int>(p.seq->blocks.size()));
  }
  step.max_blocks = table_columns(most_blocks);
  step.block_tables.assign(static_cast<size_t>(step.num_seqs) * step.max_blocks, 0);
  std::vector<Sequence*> samplers;  // the sequence of each sample row
  std::vector<LogitsAdjust> adjusts;  // of the sample rows whose logits change
  std::vector<std::pair<Sequence*, std::string>> failed;
  const int BS = blocks_.block_size();
  for (int i = 0; i < step.num_seqs; i++) {
    Sequence& s = *planned[i].seq;
    std::copy(s.blocks.begin(), s.blocks.end(),
              step.block_tables.begin() + static_cast<long>(i) * step.max_blocks);
    if (s.adapter != nullptr) {
      if (step.lora.empty() || step.lora.back().adapters != s.adapter->weights.get()) {
        step.lora.push_back(LoraRows{s.adapter->weights.get(), step.rows(), 0});
      }
      step.lora.back().rows += planned[i].n;
    }
    for (int p = s.computed; p < s.computed + planned[i].n; p++) {
      step.ids.push_back(s.tokens[p]);
      step.pos.push_back(p);
      step.slots.push_back(s.blocks[p / BS] * BS + p % BS);
      step.seq.push_back(i);
    }
    if (s.computed + planned[i].n == s.length()) {
      if (changes_logits(s)) {
        try {
          adjusts.push_back(adjust_of(s));
        } catch (const Error& e) {  // its row runs, but draws nothing: the sequence ends
          failed.emplace_back(&s, e.what());
          continue;
        }
      }
      step.sample_rows.push_back(step.rows() - 1);
      step.sampling.push_back(backend_row(s.req.sampling, s.rng));
      step.top_logprobs.push_back(s.req.top_logprobs);
      samplers.push_back(&s);
    }
  }
  if (!adjusts.empty()) {  // pointers taken once `adjusts` no longer grows
    size_t a = 0;
    for (Sequence* s : samplers) {
      step.adjust.push_back(changes_logits(*s) ? &adjusts[a++] : nullptr);
    }
  }

  std::vector<std::vector<TokenDraw>> top;
  const std::vector<TokenDraw> sampled =
      model_.forward_paged(step, cache_, opt_.logits_chunk, opt_.graphs, &top);
  totals_.decode_steps++;

  for (const Planned& p : planned) {
    p.seq->computed += p.n;
    publish_full_blocks(*p.seq);
  }
  for (auto& [s, why] : failed) {
    res.failed.emplace_back(s->req.rid, why);
    live_rids_.erase(s->req.rid);
    release(*s);
    erase_running(s);
  }
  for (size_t r = 0; r < samplers.size(); r++) {
    Sequence& s = *samplers[r];
    s.tokens.push_back(sampled[r].token);
    totals_.generated_tokens++;
    res.tokens.push_back(
        TokenOut{s.req.rid, sampled[r].token, sampled[r].logprob, std::move(top[r])});
    if (s.masks != nullptr) s.masks->advance(sampled[r].token);  // an end token: no bytes
    if (s.req.penalties.any()) {
      s.counts[sampled[r].token]++;
      if (s.req.penalties.repetition != 1) s.seen.insert(sampled[r].token);
    }
    Finished f;
    if (finished(s, sampled[r].token, &f)) {
      res.finished.push_back(f);
      live_rids_.erase(s.req.rid);
      release(s);
      erase_running(&s);
    }
  }
  return res;
}

}  // namespace sr1
