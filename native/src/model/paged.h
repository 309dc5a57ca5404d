// What the inference engine hands the model for one step: a ragged batch of new tokens
// from several sequences whose earlier keys and values live in a paged cache (see
// PagedShape in backend/backend.h for the cache layout), and the device memory both need.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/device_buffers.h"

namespace sr1 {

struct LogitsAdjust;  // backend/sample_row.h

class LoraAdapters;

// Rows [begin, begin + rows) of a step run through `adapters` (model/lora.h) beside the base
// weights: the engine serving a LoRA adapter unmerged (engine/PROTOCOL.md, "LoRA").
struct LoraRows {
  LoraAdapters* adapters = nullptr;
  int begin = 0, rows = 0;
};

struct PagedStep {
  int num_seqs = 0;
  int max_blocks = 0;                 // columns of block_tables
  std::vector<int32_t> ids;           // [rows] token ids
  std::vector<int32_t> pos;           // [rows] position of the token in its sequence
  std::vector<int32_t> slots;         // [rows] cache slot its key and value go to
  std::vector<int32_t> seq;           // [rows] index of its sequence in this step
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks]
  std::vector<int32_t> sample_rows;   // rows whose next token is drawn
  std::vector<SampleRow> sampling;    // how, for each of sample_rows
  // For each of sample_rows, how many of its most likely tokens to report (top_logprobs in
  // backend/sample_row.h); empty: none for any row.
  std::vector<int32_t> top_logprobs;
  // For each of sample_rows, how its logits change before it is drawn (penalties, a
  // grammar's mask: backend/sample_row.h's LogitsAdjust; null: not at all), or empty: no row
  // changes. Such a row is drawn on the host from its changed logits.
  std::vector<const LogitsAdjust*> adjust;
  // The row ranges that add an adapter's products (disjoint; the other rows: the base alone).
  std::vector<LoraRows> lora;
  int rows() const { return static_cast<int>(ids.size()); }
};

// Keys and values of every layer for `num_blocks` blocks of `block_size` positions, in the
// backend's compute type. release() gives the memory back to the device (SGLang's
// release_memory_occupation of the KV cache, so a trainer on the same GPU can use it) and
// resume() takes it again, the same size; what it held is gone (the caller drops its
// prefix cache).
class PagedKvCache {
 public:
  PagedKvCache(Backend& backend, const ModelConfig& c, int num_blocks, int block_size);
  ~PagedKvCache();
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;
  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  XPtr k(int layer) const { return base_ + static_cast<size_t>(2 * layer) * layer_elems_; }
  XPtr v(int layer) const { return base_ + static_cast<size_t>(2 * layer + 1) * layer_elems_; }
  // Bytes one block takes over all layers (keys and values).
  static size_t bytes_per_block(const ModelConfig& c, int block_size, size_t x_elem);
  bool released() const { return base_.null(); }
  void release();
  // Throws (out of memory) and stays released when the memory cannot be had.
  void resume();

 private:
  Backend& be_;
  int num_blocks_, block_size_;
  size_t layer_elems_, total_elems_;
  XPtr base_;
};

// Activations of one engine step, sized for the largest step seen so far, and the graphs of
// decode steps recorded on them (which die with them).
struct PagedBuffers {
  // Room for steps of `rows` rows, `seqs_blocks` block-table entries and logits chunks of
  // `chunk` rows: allocated from `backend`, or with none only counted (DeviceBuffers).
  PagedBuffers(Backend* backend, size_t x_elem, const ModelConfig& c, int rows, int seqs_blocks,
               int chunk);
  // Device bytes of such a set with compute-type elements of `x_elem` bytes, unallocated.
  static size_t bytes(size_t x_elem, const ModelConfig& c, int rows, int seqs_blocks, int chunk);
  DeviceBuffers mem;
  int rows = 0, seqs_blocks = 0, chunk = 0;
  // The step's ids, pos, slots, seq (each of the rows run), sample_rows (as many) and
  // block_tables end to end, and their copy on the host.
  int32_t* ints = nullptr;
  std::vector<int32_t> ints_staging;
  XPtr x, ln, qkv, att, h, gu, act, head_in, logits;
  float* rstd = nullptr;
  std::vector<float> host_logits;  // rows the host samples or ranks
  // The layers of a decode step by (rows run, block-table columns); a shape is recorded the
  // second time it runs (the first loads the kernels and plans the matmuls). They hold the
  // cache's pointers: `graph_cache` is the cache they were recorded on.
  std::map<std::pair<int, int>, std::unique_ptr<DeviceGraph>> graphs;
  std::set<std::pair<int, int>> seen;
  const void* graph_cache = nullptr;
  bool graphs_failed = false;  // a recording failed: run op by op
};

}  // namespace sr1
