// Next-token sampling of one row of logits on the host: the CPU backend's sample_tokens and
// the inference engine's host sampler (engine/sampler.cpp) share these, so both give the
// same tokens and log-probs from the same logits and draws. The CUDA twin is
// backend/cuda/sampling.cu.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace sr1 {

// Of softmax(logits * inv_t): the lowest id among the largest logits, the largest scaled
// logit, and log Σ exp(logit * inv_t - max) (fp64).
struct SoftmaxStats {
  int32_t argmax = 0;
  double max = 0, log_sum = 0;
  float inv_t = 1;
  // log_softmax(logits * inv_t)[token]
  float logprob(const float* logits, int32_t token) const {
    return static_cast<float>(static_cast<double>(logits[token]) * inv_t - max - log_sum);
  }
  double prob(const float* logits, int32_t token) const;
};
SoftmaxStats softmax_stats(const float* logits, int V, float inv_t);

// What changes a row's logits before it is drawn (on the host), in vLLM's order (its logits
// processors, then apply_penalties: vllm/model_executor/layers/utils.py; SGLang's penalizers
// define the same penalties): OpenAI's logit_bias is added; the barred tokens (the end tokens
// before min_new_tokens) go to -inf; CTRL's repetition penalty divides a positive logit of a
// token seen in the prompt or the output by `repetition` and multiplies a negative one; each
// output token's logit loses frequency × its count and presence once; last, a grammar's mask
// sets the tokens it refuses to -inf. sample_row then draws, and reports log-probs, under the
// changed distribution (temperature applies after).
struct LogitsAdjust {
  std::vector<std::pair<int32_t, float>> bias;
  std::vector<int32_t> barred;
  float repetition = 1;
  std::vector<int32_t> seen;
  float frequency = 0, presence = 0;
  std::vector<std::pair<int32_t, int32_t>> counts;  // output token, how many times
  std::vector<uint64_t> allowed;  // bit id % 64 of word id / 64 (engine/token_mask.h); empty: all
  void apply(float* logits, int V) const;
};

// Backend::sample_tokens' rule for one row. A filtered row (SGLang's definitions): sorted by
// probability (ties by id), a token is dropped when the mass of the tokens before it exceeds
// top_p, when its rank is top_k or more, or when its probability is below min_p times the
// largest; the rest are renormalised and the draw (uniform × their mass) walks them in that
// order. The log-prob is always over the whole vocabulary, before any cut.
TokenDraw sample_row(const float* logits, int V, const SampleRow& row);

// The `k` most likely tokens (k <= V) of the distribution sample_row's log-prob is taken
// under (log_softmax(logits / temperature) over the whole vocabulary, temperature 1 when
// greedy), most likely first, ties by the lower id: SGLang's output_top_logprobs and
// OpenAI's top_logprobs for the row. Tokens whose logit is -inf (masked out by a grammar)
// are not listed.
std::vector<TokenDraw> top_logprobs(const float* logits, int V, const SampleRow& row, int k);

}  // namespace sr1
