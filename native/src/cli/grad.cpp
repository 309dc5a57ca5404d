// searchr1-trainer grad: the loss L = -sum w_t * logprob_t of a batch and the gradient of
// every parameter, for checking the backward pass and for debugging losses.
#include "cli/commands.h"
#include "cli/common.h"

namespace sr1 {

int cmd_grad(const std::vector<std::string>& argv) {
  const Args args("searchr1-trainer grad",
                  "Reads input_ids, attention_mask and per-token 'weights' [B, T] from IN and\n"
                  "writes OUT with 'loss' (float32 [1], L = -sum weights * logprobs),\n"
                  "'logprobs' [B, T] and 'grad.<tensor name>' for every parameter.",
                  batch_command_options("safetensors batch with 'weights'", true), argv,
                  {"searchr1-trainer grad --model models/Qwen2.5-0.5B-Instruct --batch "
                   "batch.safetensors --out grads.safetensors --recompute --logits-chunk 64"});
  if (print_help(args)) return 0;
  BatchCommand c = open_batch_command(args);
  const std::vector<float> weights = read_token_values(*c.file, "weights", c.batch, true);

  std::vector<float> logprobs(c.batch.ids.size());
  const float loss =
      static_cast<float>(c.model->backward(c.batch, weights.data(), c.run, logprobs.data()));
  std::vector<float> grads(c.model->param_buffer_size());
  c.backend->download(grads.data(), c.model->grads(), grads.size());

  std::vector<TensorOut> tensors = {
      {"loss", DType::F32, {1}, &loss},
      {"logprobs", DType::F32, {c.batch.B, c.batch.T}, logprobs.data()}};
  for (const ParamTensor& t : c.model->layout().tensors()) {
    tensors.push_back({"grad." + t.name, DType::F32, t.shape, grads.data() + t.offset});
  }
  write_safetensors(c.out, tensors);
  return 0;
}

}  // namespace sr1
