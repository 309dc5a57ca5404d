// searchr1-trainer score: per-token log-probs and entropies of a batch.
#include <chrono>
#include <cstdio>
#include <vector>

#include "cli/common.h"
#include "cli/trainer/commands.h"
#include "cli/trainer/options.h"
#include "train/minibatch.h"

namespace sr1 {

int cmd_score(const std::vector<std::string>& argv) {
  const Args args(
      "searchr1-trainer score",
      "Writes OUT with 'logprobs' and 'entropy' (float32 [B, T]): at t >= 1 the\n"
      "log-probability of input_ids[b, t] given the tokens before it, and the\n"
      "entropy of that distribution; 0 at position 0 and at padding.",
      concat(batch_command_options(
                 "safetensors with input_ids [B, T] and an optional attention_mask", false),
             {{"repeat", "K",
               "run the forward pass K times and print each pass's seconds and peak memory as a "
               "JSON line (for benchmarks)"},
              profile_option()}),
      argv,
      {"searchr1-trainer score --model models/Qwen2.5-0.5B-Instruct --batch batch.safetensors "
       "--out scores.safetensors",
       "searchr1-trainer score --model models/Qwen2.5-0.5B-Instruct --batch batch.safetensors "
       "--out scores.safetensors --device cuda --repeat 5"});
  if (print_help(args)) return 0;
  BatchCommand c = open_batch_command(args);
  const long repeat = args.integer("repeat", 1, 1);
  // The sequences packed end to end: no compute on padding (log-probs as the trainer's).
  const MicroBatch packed = packed_batch(c.batch);
  std::vector<float> plp(packed.source.size()), pent(plp.size());
  double pass_ms = 0;
  restart_profile(*c.backend);
  for (long pass = 1; pass <= repeat; pass++) {
    c.backend->reset_peak_bytes();
    const auto start = std::chrono::steady_clock::now();
    c.model->score(packed.batch, c.run, plp.data(), pent.data());
    c.backend->synchronize();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    pass_ms += 1000 * seconds;
    if (args.has("repeat")) {
      std::printf("{\"pass\":%ld,\"seconds\":%.6f,\"peak_memory_mb\":%.3f}\n", pass, seconds,
                  static_cast<double>(c.backend->peak_bytes()) / (1 << 20));
    }
  }
  print_profile(*c.backend, pass_ms);
  std::vector<float> logprobs(c.batch.ids.size()), entropy(c.batch.ids.size());
  unpack(packed, plp.data(), logprobs.data());
  unpack(packed, pent.data(), entropy.data());
  const std::vector<int64_t> shape = {c.batch.B, c.batch.T};
  write_safetensors(c.out, {{"logprobs", DType::F32, shape, logprobs.data()},
                            {"entropy", DType::F32, shape, entropy.data()}});
  return 0;
}

}  // namespace sr1
