// How an RL update walks a rollout batch (verl's dp_actor / dp_critic): `epochs` passes,
// each shuffling the sequences with the learner's generator and cutting them into
// mini-batches of `mini_batch_size` (one optimizer step each), whose gradients accumulate
// over micro-batches of consecutive rows cut by a budget of real tokens.
#pragma once
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "model/batch.h"

namespace sr1 {

struct MiniBatching {
  int mini_batch_size = 0;  // sequences per optimizer step; 0 = the whole batch
  int epochs = 1;
  long max_token_len = 0;   // real tokens per micro-batch; 0 = the whole mini-batch
  bool shuffle = true;
  // Micro-batches without padding (verl's use_remove_padding): the sequences of a
  // micro-batch packed end to end into one row, each keeping its positions and attending
  // only to itself, so the computation is that of the padded batch, minus the padding.
  bool remove_padding = true;
};

// One micro-batch, and where each of its positions comes from: source[i] is the position
// (row * T + t) in the mini-batch of position i of `batch` (-1 for padding it added).
struct MicroBatch {
  Batch batch;
  std::vector<int32_t> source;
};

// Calls `step` with the rows of each mini-batch, in order. Throws UsageError when the
// mini-batch size does not divide the batch.
void for_each_mini_batch(int B, const MiniBatching& m, std::mt19937_64& rng,
                         const std::function<void(const std::vector<int>& rows)>& step);

// The micro-batches of a mini-batch: consecutive rows, as many as fit in `budget` real
// tokens (at least one row; budget 0 = all rows in one), packed into one row with
// remove_padding. A row packs from its first to its last real token, so padding inside it
// (a hole in its mask) stays where it is and the same tokens are predicted.
std::vector<MicroBatch> micro_batches(const Batch& batch, long budget, bool remove_padding);

// The batch's sequences in groups of `rows` consecutive rows (0 = all in one group), each
// group packed into one row, for the forward passes of log_probs and values (verl's
// log_prob_micro_batch_size): each sequence is computed as in any other packing, so its
// log-probs are those an update's packed micro-batches compute, whatever the grouping.
std::vector<MicroBatch> packed_groups(const Batch& batch, int rows);
// All the batch's sequences packed into one row: packed_groups(batch, 0)'s one group.
MicroBatch packed_batch(const Batch& batch);

// A per-position output of a micro-batch in the layout of the batch it came from:
// out[source[i]] = x[i]; positions of `out` the micro-batch does not hold (padding, other
// micro-batches' rows) are left as they are.
void unpack(const MicroBatch& mb, const float* x, float* out);
// The reverse: a per-position tensor x of the batch in the micro-batch's layout,
// out[i] = x[source[i]], zeros on the padding the micro-batch added.
std::vector<float> pack(const MicroBatch& mb, const float* x);

// The given rows of a batch, and of a per-token [B*T] tensor aligned with it.
Batch select_rows(const Batch& data, const std::vector<int>& rows);
std::vector<float> select_rows(const std::vector<float>& x, const std::vector<int>& rows, int T);

}  // namespace sr1
