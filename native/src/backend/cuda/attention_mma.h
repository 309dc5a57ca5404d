// The attention passes of attention_mma.cu, which attention.cu's attention_forward and
// attention_backward run with SEARCHR1_ATTENTION=mma once they have found the spans.
#pragma once
#include "backend/cuda/kernels.h"

namespace sr1::cuda {

// out and lse as attention_forward; span_begin/span_end [B*T] as attention.cu finds them;
// scale_log2 = log2(e) / sqrt(head_dim). Head dims as attention_supports.
void attention_forward_mma(bf16* out, float* lse, const bf16* qkv, const int32_t* key_mask,
                           const int32_t* span_begin, const int32_t* span_end,
                           const AttentionShape& s, float scale_log2, cudaStream_t stream);

// dqkv's k and v parts (every key row written), and dQ added into the fp32 scratch dq [B*T,
// NH*hd]; delta [B, NH, T] as attention.cu's delta kernel computes it; scale = 1/sqrt(hd).
// Causal only, as attention_backward.
void attention_backward_mma(bf16* dqkv, float* dq, const bf16* dout, const bf16* qkv,
                            const float* lse, const float* delta, const int32_t* key_mask,
                            const int32_t* span_begin, const int32_t* span_end,
                            const AttentionShape& s, float scale, cudaStream_t stream);

}  // namespace sr1::cuda
