#include "train/sft.h"

#include <chrono>

#include "train/minibatch.h"
#include "util/error.h"

namespace sr1 {
namespace {

// The rows of step `step` (batch_size of them from row step*batch_size, wrapping around).
std::vector<int> step_rows(int step, int batch_size, int B) {
  std::vector<int> rows(batch_size);
  for (int r = 0; r < batch_size; r++) {
    rows[r] = static_cast<int>((static_cast<long>(step) * batch_size + r) % B);
  }
  return rows;
}

}  // namespace

void run_sft(Qwen2Model& model, const Batch& data, const std::vector<float>& loss_mask,
             const SftOptions& opt, const std::function<void(const SftStep&)>& on_step) {
  const int batch_size = opt.batch_size > 0 ? opt.batch_size : data.B;
  const int micro = opt.micro_batch_size > 0 ? opt.micro_batch_size : batch_size;
  if (batch_size > data.B) {
    throw UsageError("--batch-size " + std::to_string(batch_size) + " is larger than the " +
                     std::to_string(data.B) + " sequences in --data");
  }
  if (batch_size % micro != 0) {
    throw UsageError("--micro-batch-size " + std::to_string(micro) +
                     " must divide --batch-size " + std::to_string(batch_size));
  }
  opt.schedule.validate();
  LoraAdapters* lora = model.lora();
  const size_t trained = lora != nullptr ? lora->size() : model.param_buffer_size();
  AdamW optimizer(model.be(), trained, opt.adamw);

  for (int s = 0; s < opt.steps; s++) {
    const auto start = std::chrono::steady_clock::now();
    model.be().reset_peak_bytes();
    const std::vector<int> rows = step_rows(s, batch_size, data.B);
    const Batch batch = select_rows(data, rows);
    // coef = 1/tokens on each target token: the loss is the token mean over the whole step,
    // whatever the micro-batch split.
    std::vector<float> coef(batch.ids.size(), 0.0f);
    long tokens = 0;
    for (int b = 0; b < batch.B; b++) {
      for (int t = 0; t < batch.T; t++) {
        const size_t src = static_cast<size_t>(rows[b]) * data.T + t;
        const bool target = loss_mask.empty() || loss_mask[src] != 0.0f;
        if (target && batch.predicted(b, t)) {
          coef[static_cast<size_t>(b) * batch.T + t] = 1.0f;
          tokens++;
        }
      }
    }
    if (tokens == 0) {
      throw Error("step " + std::to_string(s + 1) + ": its sequences have no loss tokens");
    }
    for (float& c : coef) c /= static_cast<float>(tokens);

    if (lora != nullptr) {
      lora->zero_grad();
    } else {
      model.zero_grad();
    }
    double loss = 0;
    for (int m = 0; m < batch_size; m += micro) {
      // The micro-batch's sequences packed end to end: no compute on padding.
      const MicroBatch part = packed_batch(batch.rows(m, m + micro));
      const std::vector<float> part_coef =
          pack(part, coef.data() + static_cast<size_t>(m) * batch.T);
      loss += model.backward(part.batch, part_coef.data(), opt.run);
    }
    const float lr = opt.schedule.at(s);
    double norm = 0;
    if (lora != nullptr) {
      norm = optimizer.step(lora->params(), lora->grads(), lr);
      lora->params_changed(0, trained);
    } else {
      norm = optimizer.step(model.params(), model.grads(), lr);
      model.params_changed();
    }
    model.be().synchronize();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    on_step(SftStep{s + 1, loss, norm, lr, tokens, seconds,
                    static_cast<double>(model.be().peak_bytes()) / (1 << 20)});
  }
}

}  // namespace sr1
