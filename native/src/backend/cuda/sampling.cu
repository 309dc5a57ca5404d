// Next-token sampling on the GPU (Backend::sample_tokens): only each row's token and log-prob
// cross to the host, not its vocabulary of logits. Three kernels, the first two so that a row
// is read by many SMs (one block reading all 151,936 logits of a row took 0.2 ms on an H200):
//   slices  a block per (row, slice of the vocabulary): its arg max (lowest id among ties),
//           its max and the fp64 sum of exp(logit / T - its max);
//   draw    a block per row: combines the slices into the row's max and log-sum-exp (the
//           log-prob of any token follows), finds the slice where the running sum of the
//           probabilities in id order first passes the draw, and walks that slice: each
//           thread sums the probabilities of its run of ids, an exclusive scan gives each run
//           the mass before it, and the run where the sum passes the draw picks the token.
//   filtered a block per row with top-k, top-p or min-p (which draw skips): the CPU's rule
//           over the row's kCandidates most probable tokens. It finds the kCandidates-th
//           largest logit by radix selection on the logits' order-keeping 32-bit keys (at
//           most 4 passes of 8 bits: topk.cuh), gathers every token at or above it into
//           shared memory, sorts them by logit then id (topk.cuh's bitonic sort of 64-bit
//           keys), and walks them as the CPU does: the mass before each against top_p,
//           min_p times the first, top_k. Where the cut is not reached among them and top_k
//           would allow more (a flat distribution), or too many tokens tie at the selected
//           logit, the row is left to the host (token -1), which samples it from the whole
//           row.
// The same arithmetic in fp64 as the CPU reference (backend/sample_row.cpp); only the order
// of the sums differs.
#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"
#include "backend/cuda/topk.cuh"

namespace sr1::cuda {
namespace {

constexpr int kSlices = 32;           // blocks that read a row
constexpr int kSliceThreads = 256;
constexpr int kDrawThreads = 256;
constexpr int kFilterThreads = 1024;
constexpr int kCandidates = 1024;    // the sorted head a filtered row's cut must fall in
constexpr int kCandidateCap = 2048;  // tokens gathered at or above the selected logit

struct ArgMax {
  float value;
  int index;
};

// The larger logit; the lower id between equals (the CPU's first maximum).
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

__device__ ArgMax block_argmax(ArgMax v, float* values, int* indices) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1) {
    v = better(v, ArgMax{__shfl_xor_sync(kFullMask, v.value, o),
                         __shfl_xor_sync(kFullMask, v.index, o)});
  }
  __syncthreads();
  if (lane == 0) {
    values[warp] = v.value;
    indices[warp] = v.index;
  }
  __syncthreads();
  v = lane < warps ? ArgMax{values[lane], indices[lane]} : ArgMax{-INFINITY, INT_MAX};
  for (int o = 16; o > 0; o >>= 1) {
    v = better(v, ArgMax{__shfl_xor_sync(kFullMask, v.value, o),
                         __shfl_xor_sync(kFullMask, v.index, o)});
  }
  return v;
}

// Σ of v over the threads before this one (thread order); `shared` holds 32 values.
__device__ double block_exclusive_sum(double v, double* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  double inclusive = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double t = __shfl_up_sync(kFullMask, inclusive, o);
    if (lane >= o) inclusive += t;
  }
  __syncthreads();
  if (lane == 31) shared[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    double w = lane < warps ? shared[lane] : 0.0;
    for (int o = 1; o < 32; o <<= 1) {
      const double t = __shfl_up_sync(kFullMask, w, o);
      if (lane >= o) w += t;
    }
    if (lane < warps) shared[lane] = w;  // the warps' inclusive totals
  }
  __syncthreads();
  return (warp > 0 ? shared[warp - 1] : 0.0) + inclusive - v;
}

// One slice's statistics: of logit / T, the max (as a logit) and its lowest id, and the sum
// of exp(logit / T - max / T). An empty slice has max -inf and sum 0.
struct Slice {
  float max;
  int argmax;
  double sum;
};

__device__ __forceinline__ float inverse_temperature(const SampleRow& row) {
  return row.temperature == 0 ? 1.0f : 1.0f / row.temperature;
}

__device__ __forceinline__ double scaled(const bf16* z, int v, float inv_t) {
  return static_cast<double>(__bfloat162float(z[v])) * inv_t;
}

// The ids [lo, hi) of slice `s` of a vocabulary of V cut into kSlices.
__device__ __forceinline__ void slice_bounds(int s, int V, int* lo, int* hi) {
  const int per = (V + kSlices - 1) / kSlices;
  *lo = min(V, s * per);
  *hi = min(V, *lo + per);
}

__global__ __launch_bounds__(kSliceThreads) void slices_kernel(Slice* slices,
                                                                const bf16* logits,
                                                                const SampleRow* rows, int V) {
  __shared__ float max_values[32];
  __shared__ int max_indices[32];
  __shared__ double sums[32];
  const int r = blockIdx.y, s = blockIdx.x;
  const SampleRow row = rows[r];
  const bf16* z = logits + static_cast<size_t>(r) * V;
  const float inv_t = inverse_temperature(row);
  int lo, hi;
  slice_bounds(s, V, &lo, &hi);
  ArgMax best{-INFINITY, INT_MAX};
  for (int v = lo + threadIdx.x; v < hi; v += blockDim.x) {
    best = better(best, ArgMax{__bfloat162float(z[v]), v});
  }
  best = block_argmax(best, max_values, max_indices);
  const double mx = static_cast<double>(best.value) * inv_t;
  double sum = 0;
  if (best.index != INT_MAX) {
    for (int v = lo + threadIdx.x; v < hi; v += blockDim.x) {
      sum += exp(scaled(z, v, inv_t) - mx);
    }
  }
  sum = block_sum(sum, sums);
  if (threadIdx.x == 0) {
    slices[static_cast<size_t>(r) * kSlices + s] = Slice{best.value, best.index, sum};
  }
}

// A row's statistics from its kSlices slices, combined by one warp (lane l reads slice l;
// every lane gets the same result): the arg max, the max of logit / T, the log-sum-exp, and
// `part`, this lane's slice's share of the sum before the log.
struct RowStats {
  ArgMax best;
  double mx, log_sum, part;
};

__device__ RowStats combine_slices(const Slice* slices, int r, float inv_t) {
  static_assert(kSlices == 32, "a warp holds one slice per lane");
  const Slice mine = slices[static_cast<size_t>(r) * kSlices + threadIdx.x % 32];
  ArgMax best{mine.max, mine.argmax};
  for (int o = 16; o > 0; o >>= 1) {
    best = better(best, ArgMax{__shfl_xor_sync(kFullMask, best.value, o),
                               __shfl_xor_sync(kFullMask, best.index, o)});
  }
  const double mx = static_cast<double>(best.value) * inv_t;
  const double part =
      mine.sum > 0 ? mine.sum * exp(static_cast<double>(mine.max) * inv_t - mx) : 0.0;
  return RowStats{best, mx, log(warp_sum(part)), part};
}

__global__ __launch_bounds__(kDrawThreads) void draw_kernel(TokenDraw* out, const Slice* slices,
                                                             const bf16* logits,
                                                             const SampleRow* rows, int V) {
  __shared__ double sums[32];
  __shared__ int chosen, last_positive, slice_at;
  __shared__ double mass_before;
  const int r = blockIdx.x;
  const SampleRow row = rows[r];
  if (row.filtered(V)) return;  // filtered_kernel's
  const bf16* z = logits + static_cast<size_t>(r) * V;
  const float inv_t = inverse_temperature(row);
  static_assert(kSlices == 32, "the first warp holds one slice per lane");

  // Every thread combines the slices (32 values; cheaper than sharing them).
  const int lane = threadIdx.x % 32;
  const RowStats stats = combine_slices(slices, r, inv_t);
  const ArgMax best = stats.best;
  const double mx = stats.mx, part = stats.part, log_sum = stats.log_sum;
  const auto logprob = [&](int v) {
    return static_cast<float>(scaled(z, v, inv_t) - mx - log_sum);
  };
  if (row.temperature == 0) {
    if (threadIdx.x == 0) out[r] = TokenDraw{best.index, logprob(best.index)};
    return;
  }

  // The slice where the running sum passes the draw (the last with any mass if rounding
  // leaves the whole sum below it), and the mass before it.
  if (threadIdx.x < 32) {
    const double mass = part / exp(log_sum);
    double inclusive = mass;
    for (int o = 1; o < 32; o <<= 1) {
      const double t = __shfl_up_sync(kFullMask, inclusive, o);
      if (lane >= o) inclusive += t;
    }
    const unsigned passes = __ballot_sync(kFullMask, row.uniform < inclusive && mass > 0);
    const unsigned any = __ballot_sync(kFullMask, mass > 0);
    const int at = passes != 0 ? __ffs(static_cast<int>(passes)) - 1
                               : 31 - __clz(static_cast<int>(any));
    if (lane == at) {
      slice_at = at;
      mass_before = inclusive - mass;
    }
    if (lane == 0) {
      chosen = INT_MAX;
      last_positive = -1;
    }
  }
  __syncthreads();

  // Thread t's run [a, b) of the slice's ids.
  int lo, hi;
  slice_bounds(slice_at, V, &lo, &hi);
  const int per = (hi - lo + blockDim.x - 1) / blockDim.x;
  const int a = min(hi, lo + static_cast<int>(threadIdx.x) * per), b = min(hi, a + per);
  double mass = 0;
  int last = -1;
  for (int v = a; v < b; v++) {
    const double p = exp(scaled(z, v, inv_t) - mx - log_sum);
    if (p > 0) {
      mass += p;
      last = v;
    }
  }
  const double before = mass_before + block_exclusive_sum(mass, sums);
  if (last >= 0) atomicMax(&last_positive, last);
  // Every run whose running sum passes the draw offers its first id that does; the lowest
  // wins (runs past the true one offer later ids).
  if (before + mass > row.uniform) {
    double acc = before;
    for (int v = a; v < b; v++) {
      const double p = exp(scaled(z, v, inv_t) - mx - log_sum);
      if (p <= 0) continue;
      acc += p;
      if (row.uniform < acc) {
        atomicMin(&chosen, v);
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // No run passed it (rounding between the slices' sums and these): the slice's last token.
    const int token = chosen != INT_MAX ? chosen : max(last_positive, 0);
    out[r] = TokenDraw{token, logprob(token)};
  }
}

__global__ __launch_bounds__(kFilterThreads) void filtered_kernel(TokenDraw* out,
                                                                   const Slice* slices,
                                                                   const bf16* logits,
                                                                   const SampleRow* rows, int V) {
  __shared__ RadixSelect<unsigned> select;
  __shared__ uint64_t sorted[kCandidateCap];  // id_key(logit's key, id), descending
  __shared__ double q[kCandidates];           // their probabilities, in that order
  __shared__ int gathered_s;
  __shared__ double mx_s, log_sum_s;
  const int r = blockIdx.x;
  const SampleRow row = rows[r];
  if (!row.filtered(V)) return;
  const bf16* z = logits + static_cast<size_t>(r) * V;
  const float inv_t = 1.0f / row.temperature;

  // The row's max and log-sum-exp, from its slices.
  if (threadIdx.x < 32) {
    const RowStats stats = combine_slices(slices, r, inv_t);
    if (threadIdx.x == 0) {
      mx_s = stats.mx;
      log_sum_s = stats.log_sum;
    }
  }
  const int k_cap = row.top_k > 0 ? min(row.top_k, V) : V;
  const int K = min(k_cap, kCandidates);

  // Select the K-th largest logit.
  const auto logit_key = [&](int v) { return ordered_bits(__bfloat162float(z[v])); };
  radix_select(logit_key, V, K, select);

  // Gather every token at or above it: those whose key reaches the selected bits.
  const unsigned prefix = select.prefix, mask = select.mask;
  for (int i = threadIdx.x; i < kCandidateCap; i += blockDim.x) sorted[i] = 0;
  if (threadIdx.x == 0) gathered_s = 0;
  __syncthreads();
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const unsigned key = logit_key(v);
    if ((key & mask) < prefix) continue;
    const int at = atomicAdd(&gathered_s, 1);
    if (at < kCandidateCap) sorted[at] = id_key(key, static_cast<uint32_t>(v));
  }
  __syncthreads();
  if (gathered_s > kCandidateCap) {  // ties at the selected logit beyond the buffer
    if (threadIdx.x == 0) out[r] = TokenDraw{-1, 0.0f};
    return;
  }

  // Sort: by logit, largest first, then by id (the empty places, key 0, last).
  sort_descending(sorted, kCandidateCap);
  const double mx = mx_s, log_sum = log_sum_s;
  const auto id_at = [&](int i) { return static_cast<int>(key_id(sorted[i])); };
  if (static_cast<int>(threadIdx.x) < K) {
    q[threadIdx.x] = exp(scaled(z, id_at(threadIdx.x), inv_t) - mx - log_sum);
  }
  __syncthreads();

  // Cut and draw, as backend/sample_row.cpp's filtered_row walks its sorted head.
  if (threadIdx.x != 0) return;
  const double floor = row.min_p * q[0];
  double before = 0;
  int keep = 0;
  bool cut = false;
  for (int i = 0; i < K; i++) {
    if (before > row.top_p || q[i] < floor) {
      cut = true;
      break;
    }
    before += q[i];
    keep = i + 1;
  }
  if (!cut && K < k_cap) {  // the cut lies past the candidates
    out[r] = TokenDraw{-1, 0.0f};
    return;
  }
  double kept = 0;
  for (int i = 0; i < keep; i++) kept += q[i];
  const double u = row.uniform * kept;
  double acc = 0;
  int token = id_at(keep - 1);
  for (int i = 0; i < keep; i++) {
    acc += q[i];
    if (u < acc) {
      token = id_at(i);
      break;
    }
  }
  out[r] = TokenDraw{token, static_cast<float>(scaled(z, token, inv_t) - mx - log_sum)};
}

}  // namespace

size_t sample_tokens_scratch(int n) { return static_cast<size_t>(n) * kSlices * sizeof(Slice); }

void sample_tokens(TokenDraw* out, const bf16* logits, const SampleRow* rows, int n, int V,
                   void* scratch, cudaStream_t stream) {
  if (n == 0) return;
  Slice* slices = static_cast<Slice*>(scratch);
  slices_kernel<<<dim3(kSlices, n), kSliceThreads, 0, stream>>>(slices, logits, rows, V);
  check_launch("sample_tokens (slices)");
  draw_kernel<<<n, kDrawThreads, 0, stream>>>(out, slices, logits, rows, V);
  check_launch("sample_tokens (draw)");
  filtered_kernel<<<n, kFilterThreads, 0, stream>>>(out, slices, logits, rows, V);
  check_launch("sample_tokens (filtered)");
}

}  // namespace sr1::cuda
