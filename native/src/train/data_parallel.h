// How the data-parallel ranks of a run (collective/comm.h) share the work of a batch. Every
// rank reads the same batch file and takes its rows by one deterministic rule, so no rank is
// told which rows are its own and all agree without a message: the rows go to the ranks
// balanced by real tokens, longest first, each to the rank with the fewest tokens so far
// (ties: the lower rank; rows of equal length: the earlier row first). A rank keeps its rows
// in the batch's order. With one rank these are the one-rank functions of minibatch.h,
// unchanged.
#pragma once
#include <vector>

#include "collective/comm.h"
#include "model/batch.h"
#include "train/minibatch.h"

namespace sr1 {

// The rank of each row, given each row's real tokens.
std::vector<int> rank_of_rows(const std::vector<long>& tokens, int ranks);

// The rows of `batch` that `rank` of `ranks` takes, in the batch's order.
std::vector<int> rows_of_rank(const Batch& batch, int rank, int ranks);

// micro_batches (minibatch.h) over this rank's rows of the mini-batch `part`, cut by the
// rank's own token budget (ppo_max_token_len_per_gpu); `source` holds positions of `part`.
std::vector<MicroBatch> rank_micro_batches(const Batch& part, const MiniBatching& m,
                                           const Comm& comm);

// packed_groups (minibatch.h) over this rank's rows of `batch`, `rows` of them per group
// (verl's log_prob_micro_batch_size_per_gpu); `source` holds positions of `batch`.
std::vector<MicroBatch> rank_packed_groups(const Batch& batch, int rows, const Comm& comm);

}  // namespace sr1
