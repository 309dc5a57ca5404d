// The CPU backend: fp32 throughout (its XPtrs are floats), OpenMP over rows, sgemm (OpenBLAS,
// or the portable kernel where the build has none) for the linear layers and, per sequence
// and head, for attention. It is the readable reference the CUDA backend is tested against,
// so it favours plain loops.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu_adamw.h"
#include "backend/sample_row.h"
#include "backend/dots.h"
#include "backend/rope_table.h"
#include "backend/sgemm.h"
#include "util/error.h"

namespace sr1 {
namespace {

constexpr float kNoKeys = -std::numeric_limits<float>::infinity();  // lse of an empty row

// Up to this many input rows a forward matmul runs on `dots` rather than sgemm: 1.2-2.5x
// OpenBLAS's sgemm from 2 to 32 rows, behind it from about 48 (searchr1-gemm-check --bench,
// 2-core AVX-512 Xeon, Qwen2 shapes).
constexpr int kDotsMaxRows = 32;

// Per-thread partial sums of a [C] vector, added into `dst` at the end: used for the
// column sums of bias and norm-weight gradients, which every row contributes to. The
// partials are added in thread order (not in the order threads finish), so a run is
// reproducible bit for bit: a resumed RL run must equal an uninterrupted one.
template <typename RowFn>
void column_sums(float* dst, int N, int C, RowFn row_fn) {
  std::vector<std::vector<float>> partial(omp_get_max_threads());
#pragma omp parallel
  {
    std::vector<float>& local = partial[omp_get_thread_num()];
    local.assign(C, 0.0f);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) row_fn(n, local.data());
  }
  for (const std::vector<float>& local : partial) {
    for (size_t c = 0; c < local.size(); c++) dst[c] += local[c];
  }
}

inline float dot(const float* a, const float* b, int n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

inline void axpy(float* y, float a, const float* x, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

// Queries per attention task: the scores of a task are kQueryTile x (keys up to its last
// query), so memory stays bounded for long sequences.
constexpr int kQueryTile = 64;

// e^x for x <= 0 (a softmax's shifted scores, a log-prob, -|x| in a sigmoid), in a form the
// compiler vectorises (libm's expf is a call per element, and was half of the attention's
// time, and most of SwiGLU's): x = n ln2 + r with |r| <= ln2 / 2, e^r by
// Cephes' expf polynomial, times 2^n built in the exponent bits; within 1.02 ulp of e^x on
// [-87, 0] (checked on every float there), and 0 below -87.3, where e^x leaves the normal
// floats, -inf included. No floor or float-to-int conversion: GCC vectorises neither here.
inline float exp_nonpositive(float x) {
  const float xc = std::max(x, -100.0f);
  const float t = xc * 1.44269504088896341f + 12582912.0f;  // + 1.5 * 2^23 rounds to n
  const float n = t - 12582912.0f;
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e;
  std::memcpy(&e, &t, sizeof e);
  e = e - 0x4B400000 + 127;  // t's low mantissa bits hold n: this is 2^n's biased exponent
  const int32_t bits = e > 0 ? e << 23 : 0;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

// The logistic sigmoid 1 / (1 + e^-x), from e^-|x| so the exponential never overflows.
inline float sigmoid(float x) {
  const float e = exp_nonpositive(-std::fabs(x));
  return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

// The exact (erf) GELU, x * Phi(x), Phi(x) = 1 - erfc(x / sqrt 2) / 2, in a form the compiler
// vectorises (libm's erff is a call per element: 7x slower, and a fifth of an encoder's time).
// erfc(z) for z >= 0 is Abramowitz & Stegun 7.1.26, t P(t) e^(-z^2) with t = 1 / (1 + p z),
// |error| <= 1.5e-7; negative x use Phi(x) = erfc(|x| / sqrt 2) / 2, so there is no
// cancellation. Checked against erf in double on [-20, 20]: |error| <= 4.3e-7, as small as
// 0.5 x (1 + erff(x / sqrt 2)) in float gets (4.5e-7) and below PyTorch's own CPU GELU (1.2e-6).
inline float gelu(float x) {
  const float z = std::fabs(x) * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  const float poly =
      t * (0.254829592f +
           t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float half_erfc = 0.5f * poly * exp_nonpositive(-z * z);
  return x * (x >= 0.0f ? 1.0f - half_erfc : half_erfc);
}

// Sets the scores of the keys that key_mask hides to -inf, whose exp is 0.
void mask_keys(float* row, const int32_t* key_mask, int n) {
#pragma omp simd
  for (int j = 0; j < n; j++) row[j] = key_mask[j] ? row[j] : kNoKeys;
}

// In place: row[0..n) becomes its softmax, and the result is its log-sum-exp; a row of
// -inf only (no key visible) becomes zeros, with kNoKeys.
float softmax(float* row, int n) {
  float mx = kNoKeys;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
  if (mx == kNoKeys) {
    std::memset(row, 0, n * sizeof(float));
    return kNoKeys;
  }
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; j++) {
    row[j] = exp_nonpositive(row[j] - mx);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int j = 0; j < n; j++) row[j] *= inv;
  return mx + std::log(sum);
}

// In place on the scores p[rows, keys] of queries i0..i0+rows-1 (keys 0..keys-1): row r
// becomes the softmax over the keys with key_mask[j] != 0 among j <= i0 + r (causal) or all
// `keys` (bidirectional), zeros elsewhere, and lse[r] its log-sum-exp (kNoKeys, and a row of
// zeros, when no key is visible); lse may be null.
void attention_softmax(float* p, float* lse, const int32_t* key_mask, int i0, int rows,
                       int keys, bool causal) {
  for (int r = 0; r < rows; r++) {
    float* row = p + static_cast<size_t>(r) * keys;
    const int n = causal ? i0 + r + 1 : keys;  // the visible keys
    mask_keys(row, key_mask, n);
    const float row_lse = softmax(row, n);
    if (lse != nullptr) lse[r] = row_lse;
    std::memset(row + n, 0, (keys - n) * sizeof(float));
  }
}

// In place on the scores p[rows, keys] of queries i0..: the probabilities again from the
// saved log-sum-exps, exp(s - lse), with zeros where attention_softmax put them (causal).
void causal_probs(float* p, const float* lse, const int32_t* key_mask, int i0, int rows,
                  int keys) {
  for (int r = 0; r < rows; r++) {
    float* row = p + static_cast<size_t>(r) * keys;
    const int n = lse[r] == kNoKeys ? 0 : i0 + r + 1;
    mask_keys(row, key_mask, n);
    const float row_lse = lse[r];
#pragma omp simd
    for (int j = 0; j < n; j++) row[j] = exp_nonpositive(row[j] - row_lse);
    std::memset(row + n, 0, (keys - n) * sizeof(float));
  }
}

// In place on dp[rows, keys] = dO V^T: the scores' gradient times scale,
// dS = P * (dP - dot(dO, O)) * scale, where dO and O rows are ld apart.
void softmax_backward(float* dp, const float* p, const float* dout, const float* out, int ld,
                      int rows, int keys, int hd, float scale) {
  for (int r = 0; r < rows; r++) {
    const size_t at = static_cast<size_t>(r) * ld;
    const float delta = dot(dout + at, out + at, hd);
    float* d = dp + static_cast<size_t>(r) * keys;
    const float* pr = p + static_cast<size_t>(r) * keys;
#pragma omp simd
    for (int j = 0; j < keys; j++) d[j] = pr[j] * (d[j] - delta) * scale;
  }
}

// A range [begin, end) of row b's positions that attention never crosses (the contract
// above Backend::attention_forward): the whole row for a 0/1 mask, one per sequence of a
// packed row.
struct Span {
  int b, begin, end;
};

// The spans of every row of key_mask[B, T], in order: a span starts at each token whose
// sequence id differs from the last nonzero id before it.
std::vector<Span> attention_spans(const int32_t* key_mask, int B, int T) {
  std::vector<Span> spans;
  for (int b = 0; b < B; b++) {
    const int32_t* m = key_mask + static_cast<size_t>(b) * T;
    int begin = 0, id = 0;
    for (int j = 0; j < T; j++) {
      if (m[j] == 0) continue;
      if (id != 0 && m[j] != id) {
        spans.push_back({b, begin, j});
        begin = j;
      }
      id = m[j];
    }
    spans.push_back({b, begin, T});
  }
  return spans;
}

// Queries i0 .. i0 + rows - 1 of a span: spans are tiled from their first position.
struct QueryTile {
  Span span;
  int i0, rows;
};

std::vector<QueryTile> query_tiles(const std::vector<Span>& spans) {
  std::vector<QueryTile> tiles;
  for (const Span& span : spans) {
    for (int i0 = span.begin; i0 < span.end; i0 += kQueryTile) {
      tiles.push_back({span, i0, std::min(kQueryTile, span.end - i0)});
    }
  }
  return tiles;
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  size_t x_elem() const override { return sizeof(float); }
  size_t free_bytes() const override {
    return static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  }
  size_t total_bytes() const override {
    return static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  }
  float* alloc(size_t n) override { return static_cast<float*>(aligned(n * sizeof(float))); }
  int32_t* alloc_i32(size_t n) override {
    return static_cast<int32_t*>(aligned(n * sizeof(int32_t)));
  }
  XPtr alloc_x(size_t n) override { return XPtr{alloc(n), sizeof(float)}; }
  void release(void* p) override {
    track_release(p);
    std::free(p);
  }
  void upload(float* dst, const float* src, size_t n) override { copy(dst, src, n); }
  void upload_i32(int32_t* dst, const int32_t* src, size_t n) override {
    std::memcpy(dst, src, n * sizeof(int32_t));
  }
  void download(float* dst, const float* src, size_t n) override { copy(dst, src, n); }
  void upload_bytes(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void download_bytes(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void zero(float* p, size_t n) override {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) p[i] = 0.0f;
  }
  void zero_x(XPtr p, size_t n) override { zero(F(p), n); }
  void to_x(XPtr dst, const float* src, size_t n) override {
    if (F(dst) != src) copy(F(dst), src, n);
  }
  void download_x(float* dst, XPtr src, size_t n) override {
    if (F(src) != dst) copy(dst, F(src), n);
  }

  void embedding_forward(XPtr xout, const int32_t* ids, XPtr xwte, int N, int C) override {
    float* out = F(xout);
    const float* wte = F(xwte);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
      std::memcpy(out + static_cast<size_t>(n) * C, wte + static_cast<size_t>(ids[n]) * C,
                  C * sizeof(float));
    }
  }

  void embedding_backward(float* dwte, XPtr xdout, const int32_t* ids, int N, int C) override {
    const float* dout = F(xdout);
    // Rows may share a token id, so threads split the columns instead of the rows.
#pragma omp parallel
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int c0 = static_cast<int>(static_cast<int64_t>(C) * t / nt);
      const int c1 = static_cast<int>(static_cast<int64_t>(C) * (t + 1) / nt);
      for (int n = 0; n < N; n++) {
        float* d = dwte + static_cast<size_t>(ids[n]) * C;
        const float* g = dout + static_cast<size_t>(n) * C;
        for (int c = c0; c < c1; c++) d[c] += g[c];
      }
    }
  }

  void rmsnorm_forward(XPtr xout, float* rstd, XPtr xinp, XPtr xw, int N, int C,
                       float eps) override {
    float* out = F(xout);
    const float *inp = F(xinp), *w = F(xw);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
      const float* x = inp + static_cast<size_t>(n) * C;
      float* y = out + static_cast<size_t>(n) * C;
      double ss = 0;
      for (int c = 0; c < C; c++) ss += static_cast<double>(x[c]) * x[c];
      const float r = static_cast<float>(1.0 / std::sqrt(ss / C + eps));
      rstd[n] = r;
      for (int c = 0; c < C; c++) y[c] = w[c] * (x[c] * r);
    }
  }

  void rmsnorm_backward(XPtr xdinp, float* dw, XPtr xdout, XPtr xinp, XPtr xw,
                        const float* rstd, int N, int C) override {
    float* dinp = F(xdinp);
    const float *dout = F(xdout), *inp = F(xinp), *w = F(xw);
    std::vector<float> frozen(dw == nullptr ? C : 0, 0.0f);  // summed, then dropped
    column_sums(dw != nullptr ? dw : frozen.data(), N, C, [&](int n, float* local) {
      const float* x = inp + static_cast<size_t>(n) * C;
      const float* g = dout + static_cast<size_t>(n) * C;
      float* dx = dinp + static_cast<size_t>(n) * C;
      const float r = rstd[n];
      double dot_sum = 0;  // sum over c of (g*w) * xhat
      for (int c = 0; c < C; c++) dot_sum += static_cast<double>(g[c] * w[c]) * (x[c] * r);
      const float mean = static_cast<float>(dot_sum / C);
      for (int c = 0; c < C; c++) {
        const float xhat = x[c] * r;
        dx[c] += r * (g[c] * w[c] - xhat * mean);
        local[c] += g[c] * xhat;
      }
    });
  }

  void matmul_forward(XPtr xout, XPtr xinp, XPtr xw, XPtr xbias, int N, int C,
                      int OC) override {
    float* out = F(xout);
    const float *inp = F(xinp), *w = F(xw), *bias = F(xbias);
    if (bias != nullptr) {
#pragma omp parallel for schedule(static)
      for (int n = 0; n < N; n++) std::memcpy(out + static_cast<size_t>(n) * OC, bias,
                                              OC * sizeof(float));
    }
    const float beta = bias != nullptr ? 1.0f : 0.0f;
    // A decode step (a row per running sequence) reads w once, as it is: sgemm would first
    // copy all of w into its blocked layout and reuse little of the copy.
    if (N == 1) {
      sgemv(OC, C, 1.0f, w, C, inp, beta, out);
    } else if (N <= kDotsMaxRows) {
      dots(N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
    } else {
      sgemm(Trans::No, Trans::Yes, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
    }
  }

  void matmul_backward(XPtr xdinp, float* dw, float* dbias, XPtr xdout, XPtr xinp, XPtr xw,
                       int N, int C, int OC, bool accumulate_dinp) override {
    float* dinp = F(xdinp);
    const float *dout = F(xdout), *inp = F(xinp), *w = F(xw);
    if (dinp != nullptr) {
      sgemm(Trans::No, Trans::No, N, C, OC, 1.0f, dout, OC, w, C, accumulate_dinp ? 1.0f : 0.0f,
            dinp, C);
    }
    if (dw != nullptr) {
      sgemm(Trans::Yes, Trans::No, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    }
    if (dbias != nullptr) {
      column_sums(dbias, N, OC, [&](int n, float* local) {
        const float* g = dout + static_cast<size_t>(n) * OC;
        for (int o = 0; o < OC; o++) local[o] += g[o];
      });
    }
  }

  void rope_forward(XPtr qkv, const int32_t* pos, const AttentionShape& s,
                    float theta) override {
    rotate(F(qkv), pos, s, theta, 1.0f);
  }
  void rope_backward(XPtr dqkv, const int32_t* pos, const AttentionShape& s,
                     float theta) override {
    rotate(F(dqkv), pos, s, theta, -1.0f);  // the transpose of a rotation is its inverse
  }

  // One task per (span, head, tile of kQueryTile queries of the span), each on one thread with
  // single-threaded sgemm, so the result does not depend on the thread count:
  // S = Q K^T * scale over the span's keys up to the tile's last query (causal) or all of
  // them, the causal and key masks and the softmax row by row (attention_softmax), then
  // out = P V. A row of one span (a 0/1 mask) is tiled from its first position as before
  // packing existed, so its results are the same bits.
  void attention_forward(XPtr xout, float* lse, XPtr xqkv, const int32_t* key_mask,
                         const AttentionShape& s) override {
    float* out = F(xout);
    const float* qkv = F(xqkv);
    const int T = s.T, NH = s.num_heads, hd = s.head_dim, QKV = s.qkv_dim(), OD = NH * hd;
    const int group = NH / s.num_kv_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const std::vector<QueryTile> tiles = query_tiles(attention_spans(key_mask, s.B, T));
    const int n_tiles = static_cast<int>(tiles.size());
    const SerialSgemm serial;
#pragma omp parallel
    {
      std::vector<float> p(static_cast<size_t>(std::min(T, kQueryTile)) * T);
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (int t = 0; t < n_tiles; t++) {
        for (int h = 0; h < NH; h++) {
          const QueryTile& q = tiles[t];
          const int b = q.span.b, k0 = q.span.begin;
          const int keys = (s.causal ? q.i0 + q.rows : q.span.end) - k0;
          const Heads x = heads(qkv, s, b, h / group);
          sgemm(Trans::No, Trans::Yes, q.rows, keys, hd, scale, x.row(q.i0) + h * hd, QKV,
                x.k(k0), QKV, 0.0f, p.data(), keys);
          float* tile_lse =
              lse != nullptr ? lse + (static_cast<size_t>(b) * NH + h) * T + q.i0 : nullptr;
          attention_softmax(p.data(), tile_lse, key_mask + static_cast<size_t>(b) * T + k0,
                            q.i0 - k0, q.rows, keys, s.causal);
          sgemm(Trans::No, Trans::No, q.rows, hd, keys, 1.0f, p.data(), keys, x.v(k0), QKV,
                0.0f, out + (static_cast<size_t>(b) * T + q.i0) * OD + h * hd, OD);
        }
      }
    }
  }

  // One task per (span, kv head): it owns the span's dk/dv rows of that head and the dq rows
  // of the query heads in its group, and adds the heads' and query tiles' shares of dk and
  // dv in a fixed order, on one thread with single-threaded sgemm. Per tile: P again from
  // the scores and the saved lse (causal_probs), dV += P^T dO, dP = dO V^T, dS (softmax_
  // backward, scale included), dQ = dS K, dK += dS^T Q.
  void attention_backward(XPtr xdqkv, XPtr xdout, XPtr xqkv, XPtr xout, const float* lse,
                          const int32_t* key_mask, const AttentionShape& s) override {
    if (!s.causal) throw Error("attention_backward: bidirectional attention is forward only");
    float* dqkv = F(xdqkv);
    const float *dout = F(xdout), *qkv = F(xqkv), *out = F(xout);
    const int T = s.T, NH = s.num_heads, NKV = s.num_kv_heads, hd = s.head_dim;
    const int group = NH / NKV, QKV = s.qkv_dim(), OD = NH * hd;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const std::vector<Span> spans = attention_spans(key_mask, s.B, T);
    const int n_spans = static_cast<int>(spans.size());
    const SerialSgemm serial;
#pragma omp parallel
    {
      const size_t tile_size = static_cast<size_t>(std::min(T, kQueryTile)) * T;
      std::vector<float> p(tile_size), dp(tile_size);
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (int sp = 0; sp < n_spans; sp++) {
        for (int g = 0; g < NKV; g++) {
          const Span& span = spans[sp];
          const int b = span.b, k0 = span.begin;
          const Heads x = heads(qkv, s, b, g);
          const int* km = key_mask + static_cast<size_t>(b) * T + k0;
          float* rows = dqkv + static_cast<size_t>(b) * T * QKV;
          float* dk = rows + static_cast<size_t>(k0) * QKV + (NH + g) * hd;
          float* dv = rows + static_cast<size_t>(k0) * QKV + (NH + NKV + g) * hd;
          for (int j = 0; j < span.end - k0; j++) {
            std::memset(dk + static_cast<size_t>(j) * QKV, 0, hd * sizeof(float));
            std::memset(dv + static_cast<size_t>(j) * QKV, 0, hd * sizeof(float));
          }
          for (int h = g * group; h < (g + 1) * group; h++) {
            for (int i0 = k0; i0 < span.end; i0 += kQueryTile) {
              const int n = std::min(kQueryTile, span.end - i0), keys = i0 + n - k0;
              const float* q = x.row(i0) + h * hd;
              const size_t r = (static_cast<size_t>(b) * T + i0) * OD + h * hd;
              sgemm(Trans::No, Trans::Yes, n, keys, hd, scale, q, QKV, x.k(k0), QKV, 0.0f,
                    p.data(), keys);
              causal_probs(p.data(), lse + (static_cast<size_t>(b) * NH + h) * T + i0, km,
                           i0 - k0, n, keys);
              sgemm(Trans::Yes, Trans::No, keys, hd, n, 1.0f, p.data(), keys, dout + r, OD, 1.0f,
                    dv, QKV);
              sgemm(Trans::No, Trans::Yes, n, keys, hd, 1.0f, dout + r, OD, x.v(k0), QKV, 0.0f,
                    dp.data(), keys);
              softmax_backward(dp.data(), p.data(), dout + r, out + r, OD, n, keys, hd, scale);
              sgemm(Trans::No, Trans::No, n, hd, keys, 1.0f, dp.data(), keys, x.k(k0), QKV, 0.0f,
                    rows + static_cast<size_t>(i0) * QKV + h * hd, QKV);
              sgemm(Trans::Yes, Trans::No, keys, hd, n, 1.0f, dp.data(), keys, q, QKV, 1.0f, dk,
                    QKV);
            }
          }
        }
      }
    }
  }

  void rope_kv_store(XPtr xqkv, const int32_t* pos, XPtr xk, XPtr xv, const int32_t* slots,
                     const PagedShape& s, float theta) override {
    rope_forward(xqkv, pos, AttentionShape{1, s.rows, s.num_heads, s.num_kv_heads, s.head_dim},
                 theta);
    float *k = F(xk), *v = F(xv);
    const float* qkv = F(xqkv);
    const int NKV = s.num_kv_heads, hd = s.head_dim, BS = s.block_size, QKV = s.qkv_dim();
#pragma omp parallel for collapse(2) schedule(static)
    for (int r = 0; r < s.rows; r++) {
      for (int g = 0; g < NKV; g++) {
        const float* row = qkv + static_cast<size_t>(r) * QKV;
        const size_t at = s.cache_offset(slots[r] / BS, g, slots[r] % BS);
        std::memcpy(k + at, row + (s.num_heads + g) * hd, hd * sizeof(float));
        std::memcpy(v + at, row + (s.num_heads + NKV + g) * hd, hd * sizeof(float));
      }
    }
  }

  // One task per (row, kv head): the query heads of the group share each cached key and
  // value as it is read, block by block; then each head's softmax-weighted sum of the values
  // (as attention_forward).
  void paged_attention(XPtr xout, XPtr xqkv, XPtr xk, XPtr xv, const int32_t* block_tables,
                       const int32_t* seq, const int32_t* pos, const PagedShape& s) override {
    float* out = F(xout);
    const float *qkv = F(xqkv), *kc = F(xk), *vc = F(xv);
    const int NH = s.num_heads, NKV = s.num_kv_heads, hd = s.head_dim, BS = s.block_size;
    const int group = NH / NKV;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
    {
      std::vector<float> p;  // [group, keys] scores, then probabilities
#pragma omp for collapse(2) schedule(dynamic, 2)
      for (int r = 0; r < s.rows; r++) {
        for (int g = 0; g < NKV; g++) {
          const float* q = qkv + static_cast<size_t>(r) * s.qkv_dim() + g * group * hd;
          const int32_t* table = block_tables + static_cast<size_t>(seq[r]) * s.max_blocks;
          const int keys = pos[r] + 1;
          p.resize(static_cast<size_t>(group) * keys);
          for (int j = 0; j < keys; j++) {
            const float* k = kc + s.cache_offset(table[j / BS], g, j % BS);
            for (int h = 0; h < group; h++) {
              p[static_cast<size_t>(h) * keys + j] = dot(q + h * hd, k, hd) * scale;
            }
          }
          float* o = out + (static_cast<size_t>(r) * NH + g * group) * hd;
          std::memset(o, 0, static_cast<size_t>(group) * hd * sizeof(float));
          for (int h = 0; h < group; h++) softmax(p.data() + static_cast<size_t>(h) * keys, keys);
          for (int j = 0; j < keys; j++) {
            const float* v = vc + s.cache_offset(table[j / BS], g, j % BS);
            for (int h = 0; h < group; h++) {
              axpy(o + h * hd, p[static_cast<size_t>(h) * keys + j], v, hd);
            }
          }
        }
      }
    }
  }

  void swiglu_forward(XPtr xout, XPtr xgu, int N, int I) override {
    float* out = F(xout);
    const float* gu = F(xgu);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
      const float* g = gu + static_cast<size_t>(n) * 2 * I;
      const float* u = g + I;
      float* o = out + static_cast<size_t>(n) * I;
#pragma omp simd
      for (int i = 0; i < I; i++) o[i] = g[i] * sigmoid(g[i]) * u[i];
    }
  }

  void swiglu_backward(XPtr xdgu, XPtr xdout, XPtr xgu, int N, int I) override {
    float* dgu = F(xdgu);
    const float *dout = F(xdout), *gu = F(xgu);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
      const float* g = gu + static_cast<size_t>(n) * 2 * I;
      const float* u = g + I;
      const float* d = dout + static_cast<size_t>(n) * I;
      float* dg = dgu + static_cast<size_t>(n) * 2 * I;
      float* du = dg + I;
#pragma omp simd
      for (int i = 0; i < I; i++) {
        const float sig = sigmoid(g[i]);
        du[i] = d[i] * g[i] * sig;
        dg[i] = d[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
      }
    }
  }

  void add(XPtr xout, XPtr xa, XPtr xb, size_t n) override {
    float* out = F(xout);
    const float *a = F(xa), *b = F(xb);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
  }

  void scale(XPtr xx, float s, size_t n) override {
    float* x = F(xx);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
  }

  void copy_columns(XPtr xdst, int ld_dst, XPtr xsrc, int ld_src, int rows, int cols,
                    bool accumulate) override {
    float* dst = F(xdst);
    const float* src = F(xsrc);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
      float* d = dst + static_cast<size_t>(r) * ld_dst;
      const float* s = src + static_cast<size_t>(r) * ld_src;
      if (accumulate) {
        for (int c = 0; c < cols; c++) d[c] += s[c];
      } else {
        std::memcpy(d, s, static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }

  // Two passes over the row (mean, then the mean square of x - mean) in double: the
  // one-pass E[x^2] - mean^2 loses digits when |mean| is large against the spread.
  void layernorm_forward(XPtr xout, XPtr xinp, XPtr xw, XPtr xbias, int N, int C,
                         float eps) override {
    float* out = F(xout);
    const float *inp = F(xinp), *w = F(xw), *bias = F(xbias);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
      const float* x = inp + static_cast<size_t>(n) * C;
      float* y = out + static_cast<size_t>(n) * C;
      double sum = 0;
      for (int c = 0; c < C; c++) sum += x[c];
      const float mean = static_cast<float>(sum / C);
      double ss = 0;
      for (int c = 0; c < C; c++) {
        const double d = static_cast<double>(x[c]) - mean;
        ss += d * d;
      }
      const float rstd = static_cast<float>(1.0 / std::sqrt(ss / C + eps));
      for (int c = 0; c < C; c++) y[c] = (x[c] - mean) * rstd * w[c] + bias[c];
    }
  }

  void gelu_forward(XPtr xout, XPtr xinp, size_t n) override {
    float* out = F(xout);
    const float* inp = F(xinp);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = gelu(inp[i]);
  }

  void gather_rows(XPtr xout, XPtr xin, const int32_t* rows, int n, int C) override {
    float* out = F(xout);
    const float* in = F(xin);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
      std::memcpy(out + static_cast<size_t>(r) * C, in + static_cast<size_t>(rows[r]) * C,
                  C * sizeof(float));
    }
  }

  void scatter_rows(XPtr xout, XPtr xin, const int32_t* rows, int n, int C) override {
    float* out = F(xout);
    const float* in = F(xin);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
      std::memcpy(out + static_cast<size_t>(rows[r]) * C, in + static_cast<size_t>(r) * C,
                  C * sizeof(float));
    }
  }

  void sample_tokens(TokenDraw* out, XPtr logits, const SampleRow* rows, int n,
                     int V) override {
#pragma omp parallel for schedule(dynamic, 1)
    for (int r = 0; r < n; r++) out[r] = sample_row(F(logits) + static_cast<size_t>(r) * V, V, rows[r]);
  }
  void logprob_forward(float* logprob, float* entropy, XPtr xlogits, const int32_t* targets,
                       int n, int V) override {
    const float* logits = F(xlogits);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
      const float* z = logits + static_cast<size_t>(r) * V;
      const float mx = row_max(z, V);
      double sum = 0, ez = 0;  // sums of e^(z - max) and of e^(z - max) * z
#pragma omp simd reduction(+ : sum, ez)
      for (int v = 0; v < V; v++) {
        const float e = exp_nonpositive(z[v] - mx);
        sum += e;
        ez += static_cast<double>(e) * z[v];
      }
      const double lse = mx + std::log(sum);
      logprob[r] = static_cast<float>(z[targets[r]] - lse);
      entropy[r] = static_cast<float>(lse - ez / sum);
    }
  }

  void logprob_backward(XPtr xlogits, const int32_t* targets, const float* coef,
                        const float* ent_coef, int n, int V) override {
    float* logits = F(xlogits);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
      float* z = logits + static_cast<size_t>(r) * V;
      const float lse = row_lse(z, V);
      const float c = coef[r];
      const float e = ent_coef != nullptr ? ent_coef[r] : 0.0f;
      if (e == 0.0f) {
#pragma omp simd
        for (int v = 0; v < V; v++) z[v] = c * exp_nonpositive(z[v] - lse);
      } else {
        // dH/dz_v = -p_v * (log p_v + H), H = -sum p log p
        double h = 0;
#pragma omp simd reduction(- : h)
        for (int v = 0; v < V; v++) {
          const float logp = z[v] - lse;
          h -= static_cast<double>(exp_nonpositive(logp)) * logp;
        }
#pragma omp simd
        for (int v = 0; v < V; v++) {
          const float logp = z[v] - lse, p = exp_nonpositive(logp);
          z[v] = c * p - e * p * (logp + static_cast<float>(h));
        }
      }
      z[targets[r]] -= c;
    }
  }

  // The optimizer's arithmetic is cpu_adamw.h's, which an offloaded learner runs too.
  double sum_squares(const float* x, size_t n) override { return cpu::sum_squares(x, n); }
  void accumulate(float* dst, const float* src, size_t n) override {
    cpu::accumulate(dst, src, n);
  }
  void adamw_update(float* p, const float* g, float* m, float* v, size_t n,
                    const AdamWParams& a) override {
    cpu::adamw_update(p, g, m, v, n, a);
  }

 private:
  // XPtrs of this backend hold floats.
  static float* F(XPtr x) { return static_cast<float*>(x.p); }

  // Pointers into the fused qkv rows of sequence b for kv head g.
  struct Heads {
    const float* base;  // row 0 of the sequence
    int QKV, k_off, v_off;
    const float* row(int t) const { return base + static_cast<size_t>(t) * QKV; }
    const float* k(int t) const { return row(t) + k_off; }
    const float* v(int t) const { return row(t) + v_off; }
  };
  static Heads heads(const float* qkv, const AttentionShape& s, int b, int g) {
    const int QKV = s.qkv_dim(), hd = s.head_dim;
    return Heads{qkv + static_cast<size_t>(b) * s.T * QKV, QKV, (s.num_heads + g) * hd,
                 (s.num_heads + s.num_kv_heads + g) * hd};
  }

  static float row_max(const float* z, int V) {
    float mx = z[0];
#pragma omp simd reduction(max : mx)
    for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
    return mx;
  }

  // log sum_v e^z_v, summed in double: a vocabulary of 150k terms.
  static float row_lse(const float* z, int V) {
    const float mx = row_max(z, V);
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; v++) sum += exp_nonpositive(z[v] - mx);
    return mx + static_cast<float>(std::log(sum));
  }

  // Rotates the q and k heads of every row by +angle (sign 1) or -angle (sign -1).
  void rotate(float* qkv, const int32_t* pos, const AttentionShape& s, float theta,
                     float sign) {
    const int N = s.B * s.T, hd = s.head_dim, half = hd / 2, QKV = s.qkv_dim();
    const int rotated_heads = s.num_heads + s.num_kv_heads;
    rope_.ensure(pos, N, hd, theta);
    const RopeTable& table = rope_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
      const float* cs = table.cos(pos[n]);
      const float* sn = table.sin(pos[n]);
      for (int h = 0; h < rotated_heads; h++) {
        float* x = qkv + static_cast<size_t>(n) * QKV + h * hd;
        for (int j = 0; j < half; j++) {
          const float x1 = x[j], x2 = x[j + half], sj = sign * sn[j];
          x[j] = x1 * cs[j] - x2 * sj;
          x[j + half] = x2 * cs[j] + x1 * sj;
        }
      }
    }
  }

  RopeTable rope_;

  static void copy(float* dst, const float* src, size_t n) {
    std::memcpy(dst, src, n * sizeof(float));
  }
  void* aligned(size_t bytes) {
    void* p = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
    if (p == nullptr) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes");
    track_alloc(p, bytes);
    return p;
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace sr1
