// Binary heaps over parallel (value, id) arrays, exactly as faiss keeps them
// (faiss/utils/Heap.h, ordered_key_value.h), so that our top-k lists are faiss's,
// tie-breaking included. A heap is ordered by C: Max keeps the largest value on top (the
// worst of k smallest distances, L2), Min the smallest (the worst of k largest inner
// products). Equal values are ordered by id (cmp2), so a heap's shape, and which of two
// equal-valued entries leaves first, depend only on what was pushed and in what order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace sr1 {
namespace topk {

template <class TI>
struct Max {  // faiss CMax: top = largest value (ties: largest id)
  static bool cmp(float a, float b) { return a > b; }
  static bool cmp2(float a1, float b1, TI a2, TI b2) { return a1 > b1 || (a1 == b1 && a2 > b2); }
  static float neutral() { return std::numeric_limits<float>::max(); }
};

template <class TI>
struct Min {  // faiss CMin: top = smallest value (ties: smallest id)
  static bool cmp(float a, float b) { return a < b; }
  static bool cmp2(float a1, float b1, TI a2, TI b2) { return a1 < b1 || (a1 == b1 && a2 < b2); }
  static float neutral() { return std::numeric_limits<float>::lowest(); }
};

// Adds (v, id) to a heap of k-1 entries, making it k.
template <class C, class TI>
void push(size_t k, float* val, TI* ids, float v, TI id) {
  val--, ids--;
  size_t i = k;
  while (i > 1) {
    const size_t father = i / 2;
    if (!C::cmp2(v, val[father], id, ids[father])) break;
    val[i] = val[father], ids[i] = ids[father];
    i = father;
  }
  val[i] = v, ids[i] = id;
}

// Replaces the top of a heap of k entries with (v, id).
template <class C, class TI>
void replace_top(size_t k, float* val, TI* ids, float v, TI id) {
  val--, ids--;
  size_t i = 1;
  for (;;) {
    const size_t i1 = 2 * i, i2 = i1 + 1;
    if (i1 > k) break;
    const size_t child = (i2 == k + 1 || C::cmp2(val[i1], val[i2], ids[i1], ids[i2])) ? i1 : i2;
    if (C::cmp2(v, val[child], id, ids[child])) break;
    val[i] = val[child], ids[i] = ids[child];
    i = child;
  }
  val[i] = v, ids[i] = id;
}

// Removes the top of the heap of k entries; entry k-1 is then undefined. The last entry
// takes the top's place and sinks, which is replace_top with it.
template <class C, class TI>
void pop(size_t k, float* val, TI* ids) {
  replace_top<C>(k, val, ids, val[k - 1], ids[k - 1]);
}

// k empty slots: the neutral value (never better than a real one) and id -1.
template <class C, class TI>
void heapify(size_t k, float* val, TI* ids) {
  for (size_t i = 0; i < k; i++) val[i] = C::neutral(), ids[i] = -1;
}

// Sorts the heap best first in place (faiss heap_reorder): the top, the worst, is popped
// to the back repeatedly; empty slots (id -1) end up last with the neutral value.
template <class C, class TI>
size_t reorder(size_t k, float* val, TI* ids) {
  size_t kept = 0;
  for (size_t i = 0; i < k; i++) {
    const float v = val[0];
    const TI id = ids[0];
    pop<C>(k - i, val, ids);
    val[k - kept - 1] = v, ids[k - kept - 1] = id;
    if (id != -1) kept++;
  }
  std::memmove(val, val + k - kept, kept * sizeof(*val));
  std::memmove(ids, ids + k - kept, kept * sizeof(*ids));
  for (size_t i = kept; i < k; i++) val[i] = C::neutral(), ids[i] = -1;
  return kept;
}

}  // namespace topk
}  // namespace sr1
