// Supervised next-token training: token-mean cross-entropy over the loss-masked tokens of
// each step's sequences, gradient accumulation over micro-batches, AdamW.
#pragma once
#include <functional>
#include <vector>

#include "model/batch.h"
#include "model/qwen2.h"
#include "train/adamw.h"
#include "train/schedule.h"

namespace sr1 {

struct SftOptions {
  int steps = 1;
  int batch_size = 0;        // sequences per step; 0 = all of them
  int micro_batch_size = 0;  // sequences per forward/backward; 0 = batch_size
  LrSchedule schedule;
  AdamWConfig adamw;
  RunOptions run;
};

struct SftStep {
  int step;  // 1-based
  double loss, grad_norm;
  float lr;
  long tokens;  // loss tokens in the step
  double seconds;
  double peak_memory_mb;  // most backend memory held at once during the step
};

// Trains on `data`, whose rows are taken in order batch_size at a time, wrapping around.
// With LoRA adapters attached (model.lora()), the adapters alone: AdamW over their flat fp32
// buffer, the base frozen (drop its fp32 masters first, as a LoRA learner does).
// `loss_mask` ([B*T], may be empty = every predicted token) selects the target tokens.
// Throws sr1::UsageError for batch sizes that do not fit the data.
void run_sft(Qwen2Model& model, const Batch& data, const std::vector<float>& loss_mask,
             const SftOptions& opt, const std::function<void(const SftStep&)>& on_step);

}  // namespace sr1
