// The inference engine's forward pass (Qwen2Model::forward_paged) and its KV cache. Each
// step runs only the new tokens: their keys and values join the paged cache, and their
// queries attend over everything their sequence has cached, so a decode step costs one
// row per sequence and a prefill chunk one row per prompt token.
#include <algorithm>
#include <vector>

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

std::vector<TokenDraw> Qwen2Model::forward_paged(const PagedStep& step, PagedKvCache& cache,
                                                 int logits_chunk, const HostSampler& host) {
  const ModelConfig& c = config_;
  const int N = step.rows(), H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int table_size = step.num_seqs * step.max_blocks;
  const int chunk = std::max(1, logits_chunk);
  const int n_out = static_cast<int>(step.sample_rows.size());
  std::vector<TokenDraw> drawn(n_out);
  if (N == 0) return drawn;

  PagedBuffers* b = paged_.get();
  if (b == nullptr || N > b->rows || table_size > b->seqs_blocks || chunk > b->chunk) {
    paged_.reset();  // free before allocating the larger set
    auto fresh = std::make_unique<PagedBuffers>(be_);
    b = fresh.get();
    b->rows = std::max(N, 64);
    b->seqs_blocks = std::max(table_size, 1024);
    b->chunk = chunk;
    const size_t R = b->rows;
    DeviceBuffers& m = b->mem;
    b->ints = m.i(5 * R + b->seqs_blocks);
    b->x = m.x(R * H);
    b->ln = m.x(R * H);
    b->rstd = m.f(R);
    b->qkv = m.x(R * c.qkv_dim());
    b->att = m.x(R * c.q_dim());
    b->h = m.x(R * H);
    b->gu = m.x(R * 2 * I);
    b->act = m.x(R * I);
    b->head_in = m.x(static_cast<size_t>(chunk) * H);
    b->logits = m.x(static_cast<size_t>(chunk) * V);
    paged_ = std::move(fresh);
  }
  // The step's integers go to the device in one copy (each copy waits for the device).
  std::vector<int32_t>& up = b->ints_staging;
  up.clear();
  for (const std::vector<int32_t>* part :
       {&step.ids, &step.pos, &step.slots, &step.seq, &step.sample_rows, &step.block_tables}) {
    up.insert(up.end(), part->begin(), part->end());
  }
  be_.upload_i32(b->ints, up.data(), up.size());
  const int32_t* ids = b->ints;
  const int32_t *pos = ids + N, *slots = pos + N, *seq = slots + N, *sample_rows = seq + N;
  const int32_t* tables = sample_rows + n_out;

  const PagedShape ps{N, c.num_heads, c.num_kv_heads, c.head_dim, cache.block_size(),
                      step.max_blocks};
  const AttentionShape rope_shape{1, N, c.num_heads, c.num_kv_heads, c.head_dim};
  const XPtr P = weights_;
  be_.embedding_forward(b->x, ids, P + layout_.embed(), N, H);
  for (int l = 0; l < c.num_layers; l++) {
    const LayerParams& lp = layout_.layer(l);
    be_.rmsnorm_forward(b->ln, b->rstd, b->x, P + lp.ln1, N, H, c.rms_norm_eps);
    be_.matmul_forward(b->qkv, b->ln, P + lp.qkv_w, c.attention_bias ? P + lp.qkv_b : XPtr{}, N,
                       H, c.qkv_dim());
    be_.rope_forward(b->qkv, pos, rope_shape, c.rope_theta);
    be_.kv_store(cache.k(l), cache.v(l), b->qkv, slots, ps);
    be_.paged_attention(b->att, b->qkv, cache.k(l), cache.v(l), tables, seq, pos, ps);
    be_.matmul_forward(b->h, b->att, P + lp.o_w, {}, N, c.q_dim(), H);
    be_.add(b->h, b->h, b->x, static_cast<size_t>(N) * H);
    be_.rmsnorm_forward(b->ln, b->rstd, b->h, P + lp.ln2, N, H, c.rms_norm_eps);
    be_.matmul_forward(b->gu, b->ln, P + lp.gu_w, {}, N, H, 2 * I);
    be_.swiglu_forward(b->act, b->gu, N, I);
    be_.matmul_forward(b->x, b->act, P + lp.down_w, {}, N, I, H);  // x is free: h holds it
    be_.add(b->x, b->x, b->h, static_cast<size_t>(N) * H);
  }

  // Only the rows that sample go through the final norm and the head.
  for (int c0 = 0; c0 < n_out; c0 += chunk) {
    const int n = std::min(chunk, n_out - c0);
    be_.gather_rows(b->head_in, b->x, sample_rows + c0, n, H);
    be_.rmsnorm_forward(b->ln, b->rstd, b->head_in, P + layout_.norm(), n, H, c.rms_norm_eps);
    be_.matmul_forward(b->logits, b->ln, P + layout_.lm_head(), {}, n, H, V);
    be_.sample_tokens(drawn.data() + c0, b->logits, step.sampling.data() + c0, n, V);
    // Only the rows the device skipped bring their logits to the host.
    std::vector<int> skipped;
    for (int r = 0; r < n; r++) {
      if (step.sampling[c0 + r].temperature < 0) skipped.push_back(r);
    }
    const int k = static_cast<int>(skipped.size());
    b->host_logits.resize(static_cast<size_t>(k) * V);
    for (int j = 0; j < k; j++) {
      be_.download_x(b->host_logits.data() + static_cast<size_t>(j) * V,
                     b->logits + static_cast<size_t>(skipped[j]) * V, V);
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int j = 0; j < k; j++) {
      drawn[c0 + skipped[j]] =
          host(c0 + skipped[j], b->host_logits.data() + static_cast<size_t>(j) * V);
    }
  }
  return drawn;
}

}  // namespace sr1
