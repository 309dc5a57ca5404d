// searchr1-trainer grad: the loss L = -sum w_t * logprob_t of a batch and the gradient of
// every parameter, for checking the backward pass and for debugging losses.
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "model/qwen2.h"

namespace sr1 {

int cmd_grad(const std::vector<std::string>& argv) {
  const Args args("grad",
                  "Reads input_ids, attention_mask and per-token 'weights' [B, T] from IN and\n"
                  "writes OUT with 'loss' (float32 [1], L = -sum weights * logprobs),\n"
                  "'logprobs' [B, T] and 'grad.<tensor name>' for every parameter.",
                  concat(concat({{"model", "DIR", "Hugging Face model folder (required)"},
                                 {"batch", "IN", "safetensors batch with 'weights' (required)"},
                                 {"out", "OUT", "output safetensors file (required)"}},
                                run_options(true)),
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
  const std::vector<float> weights = read_token_values(*file, "weights", batch, true);

  std::vector<float> logprobs(batch.ids.size());
  const float loss = static_cast<float>(model->backward(batch, weights.data(), opt, logprobs.data()));
  std::vector<float> grads(model->num_params());
  backend->download(grads.data(), model->grads(), grads.size());

  std::vector<TensorOut> tensors = {{"loss", DType::F32, {1}, &loss},
                                    {"logprobs", DType::F32, {batch.B, batch.T}, logprobs.data()}};
  for (const ParamTensor& t : model->layout().tensors()) {
    tensors.push_back({"grad." + t.name, DType::F32, t.shape, grads.data() + t.offset});
  }
  write_safetensors(out, tensors);
  return 0;
}

}  // namespace sr1
