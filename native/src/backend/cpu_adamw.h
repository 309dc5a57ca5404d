// The optimizer's arithmetic on host memory, written once: the CPU backend runs it on its own
// buffers (cpu_backend.cpp's sum_squares, accumulate and adamw_update), and a learner whose
// optimizer state is offloaded (train/learner.h, optimizer_offload) runs it on any device, as
// DeepSpeed's ZeRO-Offload steps its CPU Adam (deepspeed/ops/adam/cpu_adam.py,
// csrc/adam/cpu_adam_impl.cpp): vectorised, one static share of the buffer per OpenMP thread.
// So an offloaded step on the CPU is the plain one bit for bit.
#pragma once
#include <cstddef>

#include "backend/backend.h"

namespace sr1::cpu {

// The sum of x[i]² in double: each thread's static share summed in order, then the shares.
double sum_squares(const float* x, size_t n);
// dst += src, fp32.
void accumulate(float* dst, const float* src, size_t n);
// Backend::adamw_update's step (PyTorch's AdamW order) on host buffers.
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& a);

}  // namespace sr1::cpu
