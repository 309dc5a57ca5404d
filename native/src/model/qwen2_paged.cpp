// The inference engine's forward pass (Qwen2Model::forward_paged) and its KV cache. Each
// step runs only the new tokens: their keys and values join the paged cache, and their
// queries attend over everything their sequence has cached, so a decode step costs one
// row per sequence and a prefill chunk one row per prompt token.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "backend/sample_row.h"
#include "model/qwen2.h"
#include "util/error.h"

namespace sr1 {

PagedKvCache::PagedKvCache(Backend& backend, const ModelConfig& c, int num_blocks,
                           int block_size)
    : be_(backend),
      num_blocks_(num_blocks),
      block_size_(block_size),
      layer_elems_(static_cast<size_t>(num_blocks) * c.num_kv_heads * block_size * c.head_dim),
      total_elems_(2 * static_cast<size_t>(c.num_layers) * layer_elems_) {
  base_ = be_.alloc_x(total_elems_);
}

PagedKvCache::~PagedKvCache() { release(); }

void PagedKvCache::release() {
  if (base_.null()) return;
  be_.release(base_.p);
  base_.p = nullptr;
}

void PagedKvCache::resume() {
  if (!base_.null()) return;
  base_ = be_.alloc_x(total_elems_);
}

size_t PagedKvCache::bytes_per_block(const ModelConfig& c, int block_size, size_t x_elem) {
  return 2 * static_cast<size_t>(c.num_layers) * c.num_kv_heads * block_size * c.head_dim *
         x_elem;
}

PagedBuffers::PagedBuffers(Backend* backend, size_t x_elem, const ModelConfig& c, int rows_,
                           int seqs_blocks_, int chunk_)
    : mem(backend, x_elem), rows(rows_), seqs_blocks(seqs_blocks_), chunk(chunk_) {
  const size_t R = rows, H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const size_t C = chunk;
  ints = mem.i(5 * R + seqs_blocks);
  x = mem.x(R * H);
  ln = mem.x(R * H);
  rstd = mem.f(R);
  qkv = mem.x(R * c.qkv_dim());
  att = mem.x(R * c.q_dim());
  h = mem.x(R * H);
  gu = mem.x(R * 2 * I);
  act = mem.x(R * I);
  head_in = mem.x(C * H);
  logits = mem.x(C * V);
}

size_t PagedBuffers::bytes(size_t x_elem, const ModelConfig& c, int rows, int seqs_blocks,
                           int chunk) {
  return PagedBuffers(nullptr, x_elem, c, rows, seqs_blocks, chunk).mem.bytes();
}

namespace {

// The device work `run` queues, recorded as a graph instead of run.
template <typename Run>
std::unique_ptr<DeviceGraph> record(Backend& be, const Run& run) {
  be.begin_capture();
  try {
    run();
  } catch (...) {
    try {
      be.end_capture();
    } catch (const Error&) {  // the capture is invalid: the first error is the one to report
    }
    throw;
  }
  return be.end_capture();
}

}  // namespace

int Qwen2Model::graph_rows(int n) {
  constexpr int kLargestGraph = 512;
  if (n > kLargestGraph) return 0;
  if (n <= 4) return n <= 1 ? 1 : n <= 2 ? 2 : 4;
  return (n + 7) / 8 * 8;
}

void Qwen2Model::paged_layers(const PagedShape& ps, const int32_t* ids, const int32_t* pos,
                              const int32_t* slots, const int32_t* seq, const int32_t* tables,
                              PagedKvCache& cache, const std::vector<LoraRows>& lora) {
  const ModelConfig& c = config_;
  const int N = ps.rows, H = c.hidden_size, I = c.intermediate_size;
  const XPtr P = weights_;
  PagedBuffers* b = paged_.get();
  // Each adapter's rows add scaling * B (A x) to the base matmul's output, unmerged: the
  // trainer's own products (LoraAdapters::forward) on the rows of that adapter's sequences.
  const auto adapt = [&](int l, LoraSite site, XPtr y, int y_width, XPtr x, int x_width) {
    for (const LoraRows& r : lora) {
      r.adapters->forward(l, site, y + static_cast<size_t>(r.begin) * y_width,
                          x + static_cast<size_t>(r.begin) * x_width, r.rows);
    }
  };
  be_.embedding_forward(b->x, ids, P + layout_.embed(), N, H);
  be_.rmsnorm_forward(b->ln, b->rstd, b->x, P + layout_.layer(0).ln1, N, H, c.rms_norm_eps);
  // Each residual add runs with the norm after it (ln holds a layer's first norm on entry).
  for (int l = 0; l < c.num_layers; l++) {
    const LayerParams& lp = layout_.layer(l);
    be_.matmul_forward(b->qkv, b->ln, P + lp.qkv_w, c.attention_bias ? P + lp.qkv_b : XPtr{}, N,
                       H, c.qkv_dim());
    adapt(l, LoraSite::Qkv, b->qkv, c.qkv_dim(), b->ln, H);
    be_.rope_kv_store(b->qkv, pos, cache.k(l), cache.v(l), slots, ps, c.rope_theta);
    be_.paged_attention(b->att, b->qkv, cache.k(l), cache.v(l), tables, seq, pos, ps);
    be_.matmul_forward(b->h, b->att, P + lp.o_w, {}, N, c.q_dim(), H);
    adapt(l, LoraSite::O, b->h, H, b->att, c.q_dim());
    be_.add_rmsnorm_forward(b->h, b->ln, b->rstd, b->h, b->x, P + lp.ln2, N, H,
                            c.rms_norm_eps);
    if (lora.empty()) {
      be_.matmul_swiglu_forward(b->act, b->gu, b->ln, P + lp.gu_w, N, H, I);
    } else {  // the adapters join gate/up before the activation
      be_.matmul_forward(b->gu, b->ln, P + lp.gu_w, {}, N, H, 2 * I);
      adapt(l, LoraSite::GateUp, b->gu, 2 * I, b->ln, H);
      be_.swiglu_forward(b->act, b->gu, N, I);
    }
    be_.matmul_forward(b->x, b->act, P + lp.down_w, {}, N, I, H);  // x is free: h holds it
    adapt(l, LoraSite::Down, b->x, H, b->act, I);
    if (l + 1 < c.num_layers) {
      be_.add_rmsnorm_forward(b->x, b->ln, b->rstd, b->x, b->h, P + layout_.layer(l + 1).ln1, N,
                              H, c.rms_norm_eps);
    } else {
      be_.add(b->x, b->x, b->h, static_cast<size_t>(N) * H);  // the head norms its rows itself
    }
  }
}

std::vector<TokenDraw> Qwen2Model::forward_paged(const PagedStep& step, PagedKvCache& cache,
                                                 int logits_chunk, bool graphs,
                                                 std::vector<std::vector<TokenDraw>>* top) {
  const ModelConfig& c = config_;
  const int N = step.rows(), H = c.hidden_size, V = c.vocab_size;
  const int table_size = step.num_seqs * step.max_blocks;
  const int chunk = std::max(1, logits_chunk);
  const int n_out = static_cast<int>(step.sample_rows.size());
  std::vector<TokenDraw> drawn(n_out);
  if (top != nullptr) top->assign(n_out, {});
  const auto top_of = [&](int r) { return step.top_logprobs.empty() ? 0 : step.top_logprobs[r]; };
  const auto adjust_of = [&](int r) { return step.adjust.empty() ? nullptr : step.adjust[r]; };
  if (N == 0) return drawn;
  // A decode step (every row samples, so each is its own sequence's one row) runs R >= N rows
  // when it replays a graph: the last row repeated, which writes the same key and value to
  // the same slot and whose outputs no one reads. A step with adapter rows runs op by op (a
  // graph would hold one step's adapters and row ranges).
  const int padded =
      graphs && be_.can_capture() && n_out == N && step.lora.empty() ? graph_rows(N) : 0;
  const int R = padded > 0 ? padded : N;

  PagedBuffers* b = paged_.get();
  if (b == nullptr || R > b->rows || table_size > b->seqs_blocks || chunk > b->chunk) {
    paged_.reset();  // free before allocating the larger set
    paged_ = std::make_unique<PagedBuffers>(&be_, be_.x_elem(), c, std::max(R, 64),
                                            std::max(table_size, 1024), chunk);
    b = paged_.get();
  }
  // The step's integers go to the device in one copy (each copy waits for the device).
  std::vector<int32_t>& up = b->ints_staging;
  up.clear();
  for (const std::vector<int32_t>* part :
       {&step.ids, &step.pos, &step.slots, &step.seq, &step.sample_rows}) {
    up.insert(up.end(), part->begin(), part->end());
    up.insert(up.end(), R - part->size(), part->empty() ? 0 : part->back());
  }
  up.insert(up.end(), step.block_tables.begin(), step.block_tables.end());
  be_.upload_i32(b->ints, up.data(), up.size());
  const int32_t* ids = b->ints;
  const int32_t *pos = ids + R, *slots = pos + R, *seq = slots + R, *sample_rows = seq + R;
  const int32_t* tables = sample_rows + R;

  const PagedShape ps{R, c.num_heads, c.num_kv_heads, c.head_dim, cache.block_size(),
                      step.max_blocks};
  const auto layers = [&] { paged_layers(ps, ids, pos, slots, seq, tables, cache, step.lora); };
  if (padded == 0) {
    layers();
  } else {
    if (b->graph_cache != cache.k(0).p) {  // the cache was released and taken again
      b->graphs.clear();
      b->seen.clear();
      b->graph_cache = cache.k(0).p;
    }
    const std::pair<int, int> shape{R, step.max_blocks};
    std::unique_ptr<DeviceGraph>& graph = b->graphs[shape];
    if (graph == nullptr && !b->seen.insert(shape).second && !b->graphs_failed) {
      try {
        graph = record(be_, layers);
      } catch (const Error& e) {  // the steps still run, op by op
        b->graphs_failed = true;
        std::fprintf(stderr, "searchr1: warning: decode steps run without graphs: %s\n",
                     e.what());
      }
    }
    if (graph != nullptr) {
      graph->replay();
    } else {
      layers();
    }
  }

  // Only the rows that sample go through the final norm and the head.
  const XPtr P = weights_;
  for (int c0 = 0; c0 < n_out; c0 += chunk) {
    const int n = std::min(chunk, n_out - c0);
    be_.gather_rows(b->head_in, b->x, sample_rows + c0, n, H);
    be_.rmsnorm_forward(b->ln, b->rstd, b->head_in, P + layout_.norm(), n, H, c.rms_norm_eps);
    be_.matmul_forward(b->logits, b->ln, P + layout_.lm_head(), {}, n, H, V);
    be_.sample_tokens(drawn.data() + c0, b->logits, step.sampling.data() + c0, n, V);
    // Only the rows the device left undone, those that report their most likely tokens and
    // those whose logits change (penalties, a grammar) bring their logits to the host.
    std::vector<int> host;
    for (int r = 0; r < n; r++) {
      if (drawn[c0 + r].token < 0 || (top != nullptr && top_of(c0 + r) > 0) ||
          adjust_of(c0 + r) != nullptr) {
        host.push_back(r);
      }
    }
    const int k = static_cast<int>(host.size());
    b->host_logits.resize(static_cast<size_t>(k) * V);
    for (int j = 0; j < k; j++) {
      be_.download_x(b->host_logits.data() + static_cast<size_t>(j) * V,
                     b->logits + static_cast<size_t>(host[j]) * V, V);
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int j = 0; j < k; j++) {
      const int r = c0 + host[j];
      float* row_logits = b->host_logits.data() + static_cast<size_t>(j) * V;
      if (const LogitsAdjust* adjust = adjust_of(r)) {
        adjust->apply(row_logits, V);
        drawn[r].token = -1;  // what the device drew from the unchanged row does not count
      }
      if (drawn[r].token < 0) drawn[r] = sample_row(row_logits, V, step.sampling[r]);
      if (top != nullptr && top_of(r) > 0) {
        (*top)[r] = top_logprobs(row_logits, V, step.sampling[r], top_of(r));
      }
    }
  }
  return drawn;
}

}  // namespace sr1
