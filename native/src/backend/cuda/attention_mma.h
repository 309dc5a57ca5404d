// The attention forward pass of attention_mma.cu, which attention.cu's attention_forward runs
// (unless SEARCHR1_ATTENTION=wmma) once it has found the spans.
#pragma once
#include "backend/cuda/kernels.h"

namespace sr1::cuda {

// out and lse as attention_forward; span_begin/span_end [B*T] as attention.cu finds them;
// scale_log2 = log2(e) / sqrt(head_dim). Head dims as attention_supports.
void attention_forward_mma(bf16* out, float* lse, const bf16* qkv, const int32_t* key_mask,
                           const int32_t* span_begin, const int32_t* span_end,
                           const AttentionShape& s, float scale_log2, cudaStream_t stream);

}  // namespace sr1::cuda
