// Elementwise and row-copy kernels of the CUDA backend: embedding, SwiGLU, GELU, residual add,
// row gather/scatter for the language-model head, fp32 -> bf16 rounding and rotary
// embedding. Memory-bound; arithmetic in fp32 as in the CPU reference.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace sr1::cuda {
namespace {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements; the cap only bounds the grid, each thread
// then takes several elements.
unsigned flat_blocks(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 65536));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// One block per row r: dst row (dst_rows ? dst_rows[r] : r) = src row (src_rows ? src_rows[r]
// : r), rows of `units` elements of T (int4 moves eight bf16 at once).
template <typename T>
__global__ void copy_rows_kernel(T* dst, const int32_t* dst_rows, const T* src,
                                 const int32_t* src_rows, int units) {
  const int r = blockIdx.x;
  T* d = dst + static_cast<size_t>(dst_rows != nullptr ? dst_rows[r] : r) * units;
  const T* s = src + static_cast<size_t>(src_rows != nullptr ? src_rows[r] : r) * units;
  for (int c = threadIdx.x; c < units; c += blockDim.x) d[c] = s[c];
}

void copy_rows(bf16* dst, const int32_t* dst_rows, const bf16* src, const int32_t* src_rows,
               int n, int C, cudaStream_t stream, const char* kernel) {
  if (n == 0 || C == 0) return;
  // Rows of a multiple of 8 elements keep every row 16-byte aligned if the buffer is.
  if (C % 8 == 0 && aligned16(dst) && aligned16(src)) {
    copy_rows_kernel<<<n, 128, 0, stream>>>(reinterpret_cast<int4*>(dst), dst_rows,
                                            reinterpret_cast<const int4*>(src), src_rows, C / 8);
  } else {
    copy_rows_kernel<<<n, 128, 0, stream>>>(dst, dst_rows, src, src_rows, C);
  }
  check_launch(kernel);
}

// One block per row: rows may share an id, hence the atomics.
__global__ void embedding_backward_kernel(float* dwte, const bf16* dout, const int32_t* ids,
                                          int C) {
  const int n = blockIdx.x;
  float* d = dwte + static_cast<size_t>(ids[n]) * C;
  const bf16* g = dout + static_cast<size_t>(n) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(d + c, __bfloat162float(g[c]));
}

// One block per row.
__global__ void swiglu_forward_kernel(bf16* out, const bf16* gu, int I) {
  const size_t row = blockIdx.x;
  const bf16* g = gu + row * 2 * I;
  const bf16* u = g + I;
  bf16* o = out + row * I;
  for (int i = threadIdx.x; i < I; i += blockDim.x) {
    const float gi = __bfloat162float(g[i]);
    o[i] = __float2bfloat16_rn(gi / (1.0f + expf(-gi)) * __bfloat162float(u[i]));
  }
}

__global__ void swiglu_backward_kernel(bf16* dgu, const bf16* dout, const bf16* gu, int I) {
  const size_t row = blockIdx.x;
  const bf16* g = gu + row * 2 * I;
  const bf16* u = g + I;
  const bf16* d = dout + row * I;
  bf16* dg = dgu + row * 2 * I;
  bf16* du = dg + I;
  for (int i = threadIdx.x; i < I; i += blockDim.x) {
    const float gi = __bfloat162float(g[i]), di = __bfloat162float(d[i]);
    const float sig = 1.0f / (1.0f + expf(-gi));
    du[i] = __float2bfloat16_rn(di * gi * sig);
    dg[i] = __float2bfloat16_rn(di * __bfloat162float(u[i]) * sig * (1.0f + gi * (1.0f - sig)));
  }
}

// out may alias a: each element is read before it is written, by the same thread.
__global__ void add_kernel(bf16* out, const bf16* a, const bf16* b, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
  }
}

__global__ void copy_columns_kernel(bf16* dst, int ld_dst, const bf16* src, int ld_src, int cols,
                                    size_t n, bool accumulate) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / cols, c = i % cols;
    bf16* d = dst + r * ld_dst + c;
    const bf16 s = src[r * ld_src + c];
    *d = accumulate ? __float2bfloat16_rn(__bfloat162float(*d) + __bfloat162float(s)) : s;
  }
}

__global__ void scale_kernel(bf16* x, float s, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * s);
  }
}

// The exact GELU. erff has no fast intrinsic, so --use_fast_math leaves it accurate (to 2 ulp).
__global__ void gelu_forward_kernel(bf16* out, const bf16* inp, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float x = __bfloat162float(inp[i]);
    out[i] = __float2bfloat16_rn(0.5f * x * (1.0f + erff(x * 0.70710678118654752f)));
  }
}

__global__ void f32_to_bf16_kernel(bf16* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = __float2bfloat16_rn(src[i]);
  }
}

// One thread per (row, j < hd/2): the angle's cos/sin are computed once and applied to the
// pair (j, j + hd/2) of every q and k head of the row. The angle is rounded exactly as
// RopeTable does (IEEE fp32 division even under --use_fast_math; pow in double rounded to
// float, which is what powf returns for the head dims and thetas models use), and cos/sin
// are taken in double like the reference.
// With a cache (store.k non-null: the engine's SEARCHR1_FUSED_DECODE=on, not yet run on a
// GPU), the thread also writes its pair of each rotated key head and of each value head to
// the row's slot.
__global__ void rope_kernel(bf16* qkv, const int32_t* pos, int N, int hd, int num_heads,
                            int num_kv_heads, float theta, float sign, KvStore store) {
  const int half = hd / 2;
  const PagedShape cache{N, num_heads, num_kv_heads, hd, store.block_size, 0};
  const size_t items = static_cast<size_t>(N) * half;
  for (size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; idx < items;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t n = idx / half;
    const int j = static_cast<int>(idx % half);
    const float exponent = __fdiv_rn(static_cast<float>(2 * j), static_cast<float>(hd));
    const float inv_freq = __fdiv_rn(
        1.0f, static_cast<float>(pow(static_cast<double>(theta), static_cast<double>(exponent))));
    const float angle = static_cast<float>(pos[n]) * inv_freq;
    double sin_a, cos_a;
    sincos(static_cast<double>(angle), &sin_a, &cos_a);
    const float c = static_cast<float>(cos_a), s = sign * static_cast<float>(sin_a);
    bf16* row = qkv + n * cache.qkv_dim();
    for (int h = 0; h < num_heads + num_kv_heads; h++) {
      bf16* x = row + h * hd;
      const float x1 = __bfloat162float(x[j]), x2 = __bfloat162float(x[j + half]);
      x[j] = __float2bfloat16_rn(x1 * c - x2 * s);
      x[j + half] = __float2bfloat16_rn(x2 * c + x1 * s);
    }
    if (store.k == nullptr) continue;
    const int slot = store.slots[n];
    for (int g = 0; g < num_kv_heads; g++) {
      const size_t at = cache.cache_offset(slot / store.block_size, g, slot % store.block_size);
      const bf16* k = row + (num_heads + g) * hd;
      const bf16* v = row + (num_heads + num_kv_heads + g) * hd;
      store.k[at + j] = k[j];
      store.k[at + j + half] = k[j + half];
      store.v[at + j] = v[j];
      store.v[at + j + half] = v[j + half];
    }
  }
}

}  // namespace

void embedding_forward(bf16* out, const int32_t* ids, const bf16* wte, int N, int C,
                       cudaStream_t stream) {
  copy_rows(out, nullptr, wte, ids, N, C, stream, "embedding_forward");
}

void embedding_backward(float* dwte, const bf16* dout, const int32_t* ids, int N, int C,
                        cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  embedding_backward_kernel<<<N, kThreads, 0, stream>>>(dwte, dout, ids, C);
  check_launch("embedding_backward");
}

void swiglu_forward(bf16* out, const bf16* gu, int N, int I, cudaStream_t stream) {
  if (N == 0 || I == 0) return;
  swiglu_forward_kernel<<<N, kThreads, 0, stream>>>(out, gu, I);
  check_launch("swiglu_forward");
}

void swiglu_backward(bf16* dgu, const bf16* dout, const bf16* gu, int N, int I,
                     cudaStream_t stream) {
  if (N == 0 || I == 0) return;
  swiglu_backward_kernel<<<N, kThreads, 0, stream>>>(dgu, dout, gu, I);
  check_launch("swiglu_backward");
}

void add(bf16* out, const bf16* a, const bf16* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<flat_blocks(n), kThreads, 0, stream>>>(out, a, b, n);
  check_launch("add");
}

void scale(bf16* x, float s, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<flat_blocks(n), kThreads, 0, stream>>>(x, s, n);
  check_launch("scale");
}

void copy_columns(bf16* dst, int ld_dst, const bf16* src, int ld_src, int rows, int cols,
                  bool accumulate, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(rows) * cols;
  if (n == 0) return;
  copy_columns_kernel<<<flat_blocks(n), kThreads, 0, stream>>>(dst, ld_dst, src, ld_src, cols, n,
                                                               accumulate);
  check_launch("copy_columns");
}

void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_forward_kernel<<<flat_blocks(n), kThreads, 0, stream>>>(out, inp, n);
  check_launch("gelu_forward");
}

void gather_rows(bf16* out, const bf16* in, const int32_t* rows, int n, int C,
                 cudaStream_t stream) {
  copy_rows(out, nullptr, in, rows, n, C, stream, "gather_rows");
}

void scatter_rows(bf16* out, const bf16* in, const int32_t* rows, int n, int C,
                  cudaStream_t stream) {
  copy_rows(out, rows, in, nullptr, n, C, stream, "scatter_rows");
}

void f32_to_bf16(bf16* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<flat_blocks(n), kThreads, 0, stream>>>(dst, src, n);
  check_launch("f32_to_bf16");
}

void rope(bf16* qkv, const int32_t* pos, const AttentionShape& s, float theta, float sign,
          cudaStream_t stream, const KvStore* store) {
  const int N = s.B * s.T;
  const size_t items = static_cast<size_t>(N) * (s.head_dim / 2);
  if (items == 0) return;
  rope_kernel<<<flat_blocks(items), kThreads, 0, stream>>>(
      qkv, pos, N, s.head_dim, s.num_heads, s.num_kv_heads, theta, sign,
      store != nullptr ? *store : KvStore{});
  check_launch("rope");
}

}  // namespace sr1::cuda
