// searchr1-trainer score: per-token log-probs and entropies of a batch.
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "model/qwen2.h"

namespace sr1 {

int cmd_score(const std::vector<std::string>& argv) {
  const Args args("score",
                  "Writes OUT with 'logprobs' and 'entropy' (float32 [B, T]): at t >= 1 the\n"
                  "log-probability of input_ids[b, t] given the tokens before it, and the\n"
                  "entropy of that distribution; 0 at position 0 and at padding.",
                  concat(concat({{"model", "DIR", "Hugging Face model folder (required)"},
                                 {"batch", "IN", "safetensors with input_ids [B, T] and an "
                                                 "optional attention_mask (required)"},
                                 {"out", "OUT", "output safetensors file (required)"}},
                                run_options(false)),
                         device_options()),
                  argv);
  if (args.help_requested()) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  const std::string model_dir = args.required("model"), in = args.required("batch"),
                    out = args.required("out");
  const RunOptions opt = read_run_options(args);
  const auto backend = open_backend(args);
  const auto model = Qwen2Model::load(model_dir, *backend);
  const auto file = SafetensorsFile::open(in);
  const Batch batch = read_batch(*file, model->config().vocab_size);

  std::vector<float> logprobs(batch.ids.size()), entropy(batch.ids.size());
  model->score(batch, opt, logprobs.data(), entropy.data());
  const std::vector<int64_t> shape = {batch.B, batch.T};
  write_safetensors(out, {{"logprobs", DType::F32, shape, logprobs.data()},
                          {"entropy", DType::F32, shape, entropy.data()}});
  return 0;
}

}  // namespace sr1
