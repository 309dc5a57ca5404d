// Top-k on the GPU, within one block: the flat search's selection of each query's k best
// rows (index/flat_search_cuda.cu) and filtered sampling's most probable tokens
// (sampling.cu). Keys are unsigned integers that order as the values they stand for:
// ordered_bits turns a float into one, id_key packs it with an id into a 64-bit key that
// orders by the value, then by the lower id (distinct ids: distinct keys, and never 0, which
// the callers keep for an empty place).
//   radix_select narrows to the k largest of n keys of 32 or 64 bits by radix selection, a
//     byte per pass from the top: a pass counts, in a 256-bin shared histogram, the next byte
//     of the keys that match the prefix chosen so far, and the byte at which the count of
//     larger keys reaches the number still needed joins the prefix. It stops as soon as the
//     keys with the prefix are exactly those still needed (so bytes that every candidate
//     shares, or that tie, cost no pass beyond the first where they decide nothing), else
//     after the last byte. It keeps no memory per key: each pass calls key(i) again.
//   sort_descending sorts a power of two of 64-bit keys in shared memory (a bitonic network).
// Limits: every thread of the block calls them, blockDim.x a multiple of 32; n below 2^31.
#pragma once
#include <cstdint>

#include "backend/cuda/reduce.cuh"

namespace sr1::cuda {

// A float's bits as an unsigned integer of the same order: negative floats order backwards.
// -0 orders just below +0; a caller that wants them equal maps -0 to +0 first.
__device__ __forceinline__ unsigned ordered_bits(float x) {
  const unsigned u = __float_as_uint(x);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// A key ordered by `bits`, then by the lower id; key_id reads the id back.
__host__ __device__ __forceinline__ uint64_t id_key(unsigned bits, uint32_t id) {
  return (static_cast<uint64_t>(bits) << 32) | (0xFFFFFFFFu - id);
}
__host__ __device__ __forceinline__ uint32_t key_id(uint64_t key) {
  return 0xFFFFFFFFu - static_cast<uint32_t>(key);
}

// radix_select's state, in shared memory. Once it returns, want - need keys have
// (key & mask) > prefix, and the `want` largest are those and `need` of the keys with
// (key & mask) == prefix: exactly `need` keys match it, or more that are equal (mask then
// covers every bit).
template <typename Key>
struct RadixSelect {
  unsigned hist[256];
  Key prefix, mask;  // the key bits chosen so far, and which bits they are (the top ones)
  int need;          // keys still to take among those that match the prefix
  int done;
};

// Warp 0's part of a pass: the byte b, from 255 down, at which the keys with larger bytes
// stop being enough, joins the prefix. Lane l holds bins 255-8l down to 248-8l; a scan over
// the lanes finds the one lane whose bins reach `need`.
template <typename Key>
__device__ void choose_byte(RadixSelect<Key>& s, int shift) {
  const int lane = threadIdx.x;
  unsigned count[8], sum = 0;
  for (int j = 0; j < 8; j++) {
    count[j] = s.hist[255 - 8 * lane - j];
    sum += count[j];
  }
  unsigned upto = sum;  // keys in this lane's bins and the lanes before
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned t = __shfl_up_sync(kFullMask, upto, o);
    if (lane >= o) upto += t;
  }
  const unsigned need = static_cast<unsigned>(s.need), before = upto - sum;
  __syncwarp();  // every lane has read s.need before one lane writes it
  if (before < need && need <= upto) {  // exactly one lane: the bins hold at least `need`
    unsigned above = before;
    int j = 0;
    while (above + count[j] < need) above += count[j++];
    s.prefix |= static_cast<Key>(255 - 8 * lane - j) << shift;
    s.mask |= static_cast<Key>(0xff) << shift;
    s.need = static_cast<int>(need - above);
    s.done = count[j] == need - above || shift == 0;
  }
}

// Narrows `s` to the `want` (at most n) largest of the keys key(0 .. n-1) (RadixSelect).
template <typename Key, typename KeyFn>
__device__ void radix_select(const KeyFn& key, int n, int want, RadixSelect<Key>& s) {
  if (threadIdx.x == 0) {
    s.prefix = 0;
    s.mask = 0;
    s.need = want;
    s.done = want == 0;
  }
  __syncthreads();
  for (int shift = 8 * static_cast<int>(sizeof(Key)) - 8; shift >= 0; shift -= 8) {
    if (s.done) break;  // the same for every thread: written before the last barrier
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s.hist[i] = 0;
    __syncthreads();
    const Key prefix = s.prefix, mask = s.mask;
    for (int at = 0; at < n; at += blockDim.x) {  // the same trip count for every thread
      const int i = at + threadIdx.x;
      const Key v = i < n ? static_cast<Key>(key(i)) : Key{0};
      const bool match = i < n && (v & mask) == prefix;
      const unsigned byte = static_cast<unsigned>(v >> shift) & 0xffu;
      // Lanes with the same byte add their count once: near keys share their leading
      // bytes, and one shared counter hit by 32 lanes would serialise.
      const unsigned active = __ballot_sync(kFullMask, match);
      if (match) {
        const unsigned peers = __match_any_sync(active, byte);
        if (static_cast<int>(threadIdx.x % 32) == __ffs(peers) - 1) {
          atomicAdd(&s.hist[byte], static_cast<unsigned>(__popc(peers)));
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) choose_byte(s, shift);
    __syncthreads();
  }
}

// Sorts v[0, p) into descending order, p a power of two; call after a barrier that follows
// the writes to v. Ends with a barrier.
__device__ inline void sort_descending(uint64_t* v, int p) {
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < p; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {  // each pair once; the halves of `size` runs go opposite ways
          const bool descending = (i & size) == 0;
          const uint64_t a = v[i], b = v[j];
          if (descending ? a < b : a > b) {
            v[i] = b;
            v[j] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace sr1::cuda
