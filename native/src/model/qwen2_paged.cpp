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

void Qwen2Model::forward_paged(const PagedStep& step, PagedKvCache& cache, int logits_chunk,
                               const LogitsSink& sink) {
  const ModelConfig& c = config_;
  const int N = step.rows(), H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int table_size = step.num_seqs * step.max_blocks;
  const int chunk = std::max(1, logits_chunk);
  if (N == 0) return;

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
    b->ids = m.i(R);
    b->pos = m.i(R);
    b->slots = m.i(R);
    b->seq = m.i(R);
    b->sample_rows = m.i(R);
    b->tables = m.i(b->seqs_blocks);
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
  const int n_out = static_cast<int>(step.sample_rows.size());
  be_.upload_i32(b->ids, step.ids.data(), N);
  be_.upload_i32(b->pos, step.pos.data(), N);
  be_.upload_i32(b->slots, step.slots.data(), N);
  be_.upload_i32(b->seq, step.seq.data(), N);
  be_.upload_i32(b->tables, step.block_tables.data(), table_size);
  if (n_out > 0) be_.upload_i32(b->sample_rows, step.sample_rows.data(), n_out);

  const PagedShape ps{N, c.num_heads, c.num_kv_heads, c.head_dim, cache.block_size(),
                      step.max_blocks};
  const AttentionShape rope_shape{1, N, c.num_heads, c.num_kv_heads, c.head_dim};
  const XPtr P = weights_;
  be_.embedding_forward(b->x, b->ids, P + layout_.embed(), N, H);
  for (int l = 0; l < c.num_layers; l++) {
    const LayerParams& lp = layout_.layer(l);
    be_.rmsnorm_forward(b->ln, b->rstd, b->x, P + lp.ln1, N, H, c.rms_norm_eps);
    be_.matmul_forward(b->qkv, b->ln, P + lp.qkv_w, c.attention_bias ? P + lp.qkv_b : XPtr{}, N,
                       H, c.qkv_dim());
    be_.rope_forward(b->qkv, b->pos, rope_shape, c.rope_theta);
    be_.kv_store(cache.k(l), cache.v(l), b->qkv, b->slots, ps);
    be_.paged_attention(b->att, b->qkv, cache.k(l), cache.v(l), b->tables, b->seq, b->pos, ps);
    be_.matmul_forward(b->h, b->att, P + lp.o_w, {}, N, c.q_dim(), H);
    be_.add(b->h, b->h, b->x, static_cast<size_t>(N) * H);
    be_.rmsnorm_forward(b->ln, b->rstd, b->h, P + lp.ln2, N, H, c.rms_norm_eps);
    be_.matmul_forward(b->gu, b->ln, P + lp.gu_w, {}, N, H, 2 * I);
    be_.swiglu_forward(b->act, b->gu, N, I);
    be_.matmul_forward(b->x, b->act, P + lp.down_w, {}, N, I, H);  // x is free: h holds it
    be_.add(b->x, b->x, b->h, static_cast<size_t>(N) * H);
  }

  // Only the rows that sample go through the final norm and the head.
  std::vector<float>& host = b->host_logits;
  host.resize(static_cast<size_t>(std::min(chunk, n_out)) * V);
  for (int c0 = 0; c0 < n_out; c0 += chunk) {
    const int n = std::min(chunk, n_out - c0);
    be_.gather_rows(b->head_in, b->x, b->sample_rows + c0, n, H);
    be_.rmsnorm_forward(b->ln, b->rstd, b->head_in, P + layout_.norm(), n, H, c.rms_norm_eps);
    be_.matmul_forward(b->logits, b->ln, P + layout_.lm_head(), {}, n, H, V);
    be_.download_x(host.data(), b->logits, static_cast<size_t>(n) * V);
    sink(c0, n, host.data());
  }
}

}  // namespace sr1
