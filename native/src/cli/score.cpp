// searchr1-trainer score: per-token log-probs and entropies of a batch.
#include "cli/commands.h"
#include "cli/common.h"

namespace sr1 {

int cmd_score(const std::vector<std::string>& argv) {
  const Args args("score",
                  "Writes OUT with 'logprobs' and 'entropy' (float32 [B, T]): at t >= 1 the\n"
                  "log-probability of input_ids[b, t] given the tokens before it, and the\n"
                  "entropy of that distribution; 0 at position 0 and at padding.",
                  batch_command_options(
                      "safetensors with input_ids [B, T] and an optional attention_mask", false),
                  argv);
  if (print_help(args)) return 0;
  BatchCommand c = open_batch_command(args);
  std::vector<float> logprobs(c.batch.ids.size()), entropy(c.batch.ids.size());
  c.model->score(c.batch, c.run, logprobs.data(), entropy.data());
  const std::vector<int64_t> shape = {c.batch.B, c.batch.T};
  write_safetensors(c.out, {{"logprobs", DType::F32, shape, logprobs.data()},
                            {"entropy", DType::F32, shape, entropy.data()}});
  return 0;
}

}  // namespace sr1
