// The CPU backend: fp32 throughout (its XPtrs are floats), OpenMP over rows, sgemm (OpenBLAS,
// or the portable kernel where the build has none) for the linear layers. It is the
// readable reference the CUDA backend is tested against, so it favours plain loops.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "backend/rope_table.h"
#include "backend/sgemm.h"
#include "util/error.h"

namespace sr1 {
namespace {

constexpr float kNoKeys = -std::numeric_limits<float>::infinity();  // lse of an empty row

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

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  size_t x_elem() const override { return sizeof(float); }
  size_t free_bytes() const override {
    return static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
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
    column_sums(dw, N, C, [&](int n, float* local) {
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
    sgemm(Trans::No, Trans::Yes, N, OC, C, 1.0f, inp, C, w, C, bias != nullptr ? 1.0f : 0.0f,
          out, OC);
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

  void attention_forward(XPtr xout, float* lse, XPtr xqkv, const int32_t* key_mask,
                         const AttentionShape& s) override {
    float* out = F(xout);
    const float* qkv = F(xqkv);
    const int T = s.T, NH = s.num_heads, hd = s.head_dim;
    const int group = NH / s.num_kv_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
    {
      std::vector<float> p(T);
#pragma omp for collapse(3) schedule(dynamic, 4)
      for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < NH; h++) {
          for (int i = 0; i < T; i++) {
            const Heads x = heads(qkv, s, b, h / group);
            const float* q = x.row(i) + h * hd;
            float* o = out + (static_cast<size_t>(b) * T + i) * NH * hd + h * hd;
            const int* km = key_mask + static_cast<size_t>(b) * T;
            float mx = kNoKeys;
            for (int j = 0; j <= i; j++) {
              p[j] = km[j] ? dot(q, x.k(j), hd) * scale : kNoKeys;
              mx = std::max(mx, p[j]);
            }
            std::memset(o, 0, hd * sizeof(float));
            float& row_lse = lse[(static_cast<size_t>(b) * NH + h) * T + i];
            if (mx == kNoKeys) {
              row_lse = kNoKeys;
              continue;
            }
            float sum = 0;
            for (int j = 0; j <= i; j++) {
              p[j] = km[j] ? std::exp(p[j] - mx) : 0.0f;
              sum += p[j];
            }
            const float inv = 1.0f / sum;
            for (int j = 0; j <= i; j++) {
              if (p[j] != 0.0f) axpy(o, p[j] * inv, x.v(j), hd);
            }
            row_lse = mx + std::log(sum);
          }
        }
      }
    }
  }

  // One task per (sequence, kv head): it owns the dk/dv rows of that head and the dq rows
  // of the query heads in its group, so one pass computes all three without races and
  // each probability is recomputed (from the saved lse) only once.
  void attention_backward(XPtr xdqkv, XPtr xdout, XPtr xqkv, XPtr xout, const float* lse,
                          const int32_t* key_mask, const AttentionShape& s) override {
    float* dqkv = F(xdqkv);
    const float *dout = F(xdout), *qkv = F(xqkv), *out = F(xout);
    const int B = s.B, T = s.T, NH = s.num_heads, NKV = s.num_kv_heads, hd = s.head_dim;
    const int group = NH / NKV, QKV = s.qkv_dim(), OD = NH * hd;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
      for (int g = 0; g < NKV; g++) {
        const Heads x = heads(qkv, s, b, g);
        const int* km = key_mask + static_cast<size_t>(b) * T;
        float* rows = dqkv + static_cast<size_t>(b) * T * QKV;
        for (int j = 0; j < T; j++) {
          std::memset(rows + static_cast<size_t>(j) * QKV + (NH + g) * hd, 0, hd * sizeof(float));
          std::memset(rows + static_cast<size_t>(j) * QKV + (NH + NKV + g) * hd, 0,
                      hd * sizeof(float));
        }
        for (int h = g * group; h < (g + 1) * group; h++) {
          for (int i = 0; i < T; i++) {
            float* dq = rows + static_cast<size_t>(i) * QKV + h * hd;
            std::memset(dq, 0, hd * sizeof(float));
            const float row_lse = lse[(static_cast<size_t>(b) * NH + h) * T + i];
            if (row_lse == kNoKeys) continue;
            const size_t r = (static_cast<size_t>(b) * T + i) * OD + h * hd;
            const float* q = x.row(i) + h * hd;
            const float* d = dout + r;
            const float delta = dot(d, out + r, hd);  // the softmax-backward row term
            for (int j = 0; j <= i; j++) {
              if (!km[j]) continue;
              const float p = std::exp(dot(q, x.k(j), hd) * scale - row_lse);
              const float ds = p * (dot(d, x.v(j), hd) - delta) * scale;
              float* dk = rows + static_cast<size_t>(j) * QKV + (NH + g) * hd;
              axpy(dq, ds, x.k(j), hd);
              axpy(dk, ds, q, hd);
              axpy(dk + NKV * hd, p, d, hd);
            }
          }
        }
      }
    }
  }

  void kv_store(XPtr xk, XPtr xv, XPtr xqkv, const int32_t* slots,
                const PagedShape& s) override {
    float *k = F(xk), *v = F(xv);
    const float* qkv = F(xqkv);
    const int NKV = s.num_kv_heads, hd = s.head_dim, BS = s.block_size, QKV = s.qkv_dim();
#pragma omp parallel for collapse(2) schedule(static)
    for (int r = 0; r < s.rows; r++) {
      for (int g = 0; g < NKV; g++) {
        const float* row = qkv + static_cast<size_t>(r) * QKV;
        const size_t at = cache_offset(slots[r] / BS, g, slots[r] % BS, s);
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
            const float* k = kc + cache_offset(table[j / BS], g, j % BS, s);
            for (int h = 0; h < group; h++) {
              p[static_cast<size_t>(h) * keys + j] = dot(q + h * hd, k, hd) * scale;
            }
          }
          float* o = out + (static_cast<size_t>(r) * NH + g * group) * hd;
          std::memset(o, 0, static_cast<size_t>(group) * hd * sizeof(float));
          for (int h = 0; h < group; h++) {
            float* ph = p.data() + static_cast<size_t>(h) * keys;
            float mx = kNoKeys;
            for (int j = 0; j < keys; j++) mx = std::max(mx, ph[j]);
            float sum = 0;
            for (int j = 0; j < keys; j++) {
              ph[j] = std::exp(ph[j] - mx);
              sum += ph[j];
            }
            const float inv = 1.0f / sum;
            for (int j = 0; j < keys; j++) ph[j] *= inv;
          }
          for (int j = 0; j < keys; j++) {
            const float* v = vc + cache_offset(table[j / BS], g, j % BS, s);
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
      for (int i = 0; i < I; i++) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
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
      for (int i = 0; i < I; i++) {
        const float sig = 1.0f / (1.0f + std::exp(-g[i]));
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

  void logprob_forward(float* logprob, float* entropy, XPtr xlogits, const int32_t* targets,
                       int n, int V) override {
    const float* logits = F(xlogits);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
      const float* z = logits + static_cast<size_t>(r) * V;
      float mx = z[0];
      for (int v = 1; v < V; v++) mx = std::max(mx, z[v]);
      double sum = 0, ez = 0;  // sums of e^(z - max) and of e^(z - max) * z
      for (int v = 0; v < V; v++) {
        const double e = std::exp(static_cast<double>(z[v] - mx));
        sum += e;
        ez += e * z[v];
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
        for (int v = 0; v < V; v++) z[v] = c * std::exp(z[v] - lse);
      } else {
        // dH/dz_v = -p_v * (log p_v + H), H = -sum p log p
        double h = 0;
        for (int v = 0; v < V; v++) {
          const double logp = static_cast<double>(z[v]) - lse;
          h -= std::exp(logp) * logp;
        }
        for (int v = 0; v < V; v++) {
          const float logp = z[v] - lse, p = std::exp(logp);
          z[v] = c * p - e * p * (logp + static_cast<float>(h));
        }
      }
      z[targets[r]] -= c;
    }
  }

  // Partials added in thread order, as column_sums, so the norm is reproducible.
  double sum_squares(const float* x, size_t n) override {
    std::vector<double> partial(omp_get_max_threads(), 0.0);
#pragma omp parallel
    {
      double s = 0;
#pragma omp for schedule(static)
      for (size_t i = 0; i < n; i++) s += static_cast<double>(x[i]) * x[i];
      partial[omp_get_thread_num()] = s;
    }
    double s = 0;
    for (double p : partial) s += p;
    return s;
  }

  void adamw_update(float* p, const float* g, float* m, float* v, size_t n,
                    const AdamWParams& a) override {
    const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), a.step);
    const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), a.step);
    const float step_size = static_cast<float>(a.lr / bc1);
    const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    const float decay = 1.0f - a.lr * a.weight_decay;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
      const float grad = g[i] * a.grad_scale;
      m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * grad;
      v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * grad * grad;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + a.eps;
      p[i] = p[i] * decay - step_size * m[i] / denom;
    }
  }

 private:
  // XPtrs of this backend hold floats.
  static float* F(XPtr x) { return static_cast<float*>(x.p); }

  // Element offset of (block, kv head, position in block) in a layer's paged cache.
  static size_t cache_offset(int block, int g, int off, const PagedShape& s) {
    return ((static_cast<size_t>(block) * s.num_kv_heads + g) * s.block_size + off) *
           s.head_dim;
  }

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

  static float row_lse(const float* z, int V) {
    float mx = z[0];
    for (int v = 1; v < V; v++) mx = std::max(mx, z[v]);
    double sum = 0;
    for (int v = 0; v < V; v++) sum += std::exp(static_cast<double>(z[v]) - mx);
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
