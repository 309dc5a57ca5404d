#include "backend/profiled_backend.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace sr1 {
namespace {

// Brackets read at a time: bounds the timer's events while a long run is profiled.
constexpr size_t kReadEvery = 4096;

std::string shape(int C, int OC) { return " " + std::to_string(C) + "x" + std::to_string(OC); }

}  // namespace

ProfiledBackend::ProfiledBackend(std::unique_ptr<Backend> inner)
    : inner_(std::move(inner)), timer_(inner_->timer()) {}

ProfiledBackend::~ProfiledBackend() = default;

template <typename Op>
void ProfiledBackend::timed(std::string key, Op&& op) {
  timer_->begin();
  op();
  timer_->end();
  pending_.push_back(std::move(key));
  if (pending_.size() >= kReadEvery) collect();
}

void ProfiledBackend::collect() const {
  const std::vector<double> ms = timer_->read();
  for (size_t i = 0; i < ms.size() && i < pending_.size(); i++) {
    OpTime& t = totals_[pending_[i]];
    t.op = pending_[i];
    t.calls++;
    t.ms += ms[i];
  }
  pending_.clear();
}

void ProfiledBackend::restart() {
  collect();
  totals_.clear();
}

std::vector<ProfiledBackend::OpTime> ProfiledBackend::times() const {
  collect();
  std::vector<OpTime> rows;
  for (const auto& entry : totals_) rows.push_back(entry.second);
  std::sort(rows.begin(), rows.end(),
            [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return rows;
}

json::Value ProfiledBackend::take_times() {
  json::Value ops = json::Value::array();
  double device_ms = 0;
  for (const OpTime& t : times()) {
    ops.push(json::Value::object({{"op", t.op}, {"calls", static_cast<int64_t>(t.calls)},
                                  {"ms", t.ms}}));
    device_ms += t.ms;
  }
  restart();
  return json::Value::object({{"ops", ops}, {"device_ms", device_ms}});
}

std::string ProfiledBackend::report(double wall_ms) const {
  const std::vector<OpTime> rows = times();
  double device_ms = 0;
  for (const OpTime& r : rows) device_ms += r.ms;
  std::string out = "profile (" + inner_->name() + ", device time per operation):\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-34s %9s %11s %10s %6s\n", "operation", "calls",
                "total ms", "mean us", "share");
  out += line;
  for (const OpTime& t : rows) {
    std::snprintf(line, sizeof line, "  %-34s %9ld %11.2f %10.1f %5.1f%%\n", t.op.c_str(),
                  t.calls, t.ms, 1000 * t.ms / std::max(1L, t.calls),
                  device_ms > 0 ? 100 * t.ms / device_ms : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-34s %9s %11.2f\n", "all operations", "", device_ms);
  out += line;
  if (wall_ms > 0) {
    std::snprintf(line, sizeof line,
                  "  wall time %.2f ms: the device was busy with these operations %.1f%% of it\n",
                  wall_ms, 100 * device_ms / wall_ms);
    out += line;
  }
  return out;
}

void ProfiledBackend::upload(float* dst, const float* src, size_t n) {
  timed("upload", [&] { inner_->upload(dst, src, n); });
}
void ProfiledBackend::upload_i32(int32_t* dst, const int32_t* src, size_t n) {
  timed("upload", [&] { inner_->upload_i32(dst, src, n); });
}
void ProfiledBackend::download(float* dst, const float* src, size_t n) {
  timed("download", [&] { inner_->download(dst, src, n); });
}
void ProfiledBackend::upload_bytes(void* dst, const void* src, size_t bytes) {
  timed("upload", [&] { inner_->upload_bytes(dst, src, bytes); });
}
void ProfiledBackend::download_bytes(void* dst, const void* src, size_t bytes) {
  timed("download", [&] { inner_->download_bytes(dst, src, bytes); });
}
void ProfiledBackend::zero(float* p, size_t n) {
  timed("zero", [&] { inner_->zero(p, n); });
}
void ProfiledBackend::zero_x(XPtr p, size_t n) {
  timed("zero", [&] { inner_->zero_x(p, n); });
}
void ProfiledBackend::to_x(XPtr dst, const float* src, size_t n) {
  timed("to_x", [&] { inner_->to_x(dst, src, n); });
}
void ProfiledBackend::download_x(float* dst, XPtr src, size_t n) {
  timed("download", [&] { inner_->download_x(dst, src, n); });
}
void ProfiledBackend::embedding_forward(XPtr out, const int32_t* ids, XPtr wte, int N, int C) {
  timed("embedding_forward", [&] { inner_->embedding_forward(out, ids, wte, N, C); });
}
void ProfiledBackend::embedding_backward(float* dwte, XPtr dout, const int32_t* ids, int N,
                                         int C) {
  timed("embedding_backward", [&] { inner_->embedding_backward(dwte, dout, ids, N, C); });
}
void ProfiledBackend::rmsnorm_forward(XPtr out, float* rstd, XPtr inp, XPtr w, int N, int C,
                                      float eps) {
  timed("rmsnorm_forward", [&] { inner_->rmsnorm_forward(out, rstd, inp, w, N, C, eps); });
}
void ProfiledBackend::rmsnorm_backward(XPtr dinp, float* dw, XPtr dout, XPtr inp, XPtr w,
                                       const float* rstd, int N, int C) {
  timed("rmsnorm_backward",
        [&] { inner_->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); });
}
void ProfiledBackend::matmul_forward(XPtr out, XPtr inp, XPtr w, XPtr bias, int N, int C,
                                     int OC) {
  timed("matmul_forward" + shape(C, OC),
        [&] { inner_->matmul_forward(out, inp, w, bias, N, C, OC); });
}
void ProfiledBackend::matmul_backward(XPtr dinp, float* dw, float* dbias, XPtr dout, XPtr inp,
                                      XPtr w, int N, int C, int OC, bool accumulate_dinp) {
  timed("matmul_backward" + shape(C, OC), [&] {
    inner_->matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC, accumulate_dinp);
  });
}
void ProfiledBackend::rope_forward(XPtr qkv, const int32_t* pos, const AttentionShape& s,
                                   float theta) {
  timed("rope_forward", [&] { inner_->rope_forward(qkv, pos, s, theta); });
}
void ProfiledBackend::rope_backward(XPtr dqkv, const int32_t* pos, const AttentionShape& s,
                                    float theta) {
  timed("rope_backward", [&] { inner_->rope_backward(dqkv, pos, s, theta); });
}
void ProfiledBackend::attention_forward(XPtr out, float* lse, XPtr qkv, const int32_t* key_mask,
                                        const AttentionShape& s) {
  timed("attention_forward", [&] { inner_->attention_forward(out, lse, qkv, key_mask, s); });
}
void ProfiledBackend::attention_backward(XPtr dqkv, XPtr dout, XPtr qkv, XPtr out,
                                         const float* lse, const int32_t* key_mask,
                                         const AttentionShape& s) {
  timed("attention_backward",
        [&] { inner_->attention_backward(dqkv, dout, qkv, out, lse, key_mask, s); });
}
void ProfiledBackend::swiglu_forward(XPtr out, XPtr gu, int N, int I) {
  timed("swiglu_forward", [&] { inner_->swiglu_forward(out, gu, N, I); });
}
void ProfiledBackend::swiglu_backward(XPtr dgu, XPtr dout, XPtr gu, int N, int I) {
  timed("swiglu_backward", [&] { inner_->swiglu_backward(dgu, dout, gu, N, I); });
}
void ProfiledBackend::matmul_swiglu_forward(XPtr act, XPtr gu, XPtr inp, XPtr w, int N, int C,
                                            int I) {
  timed("matmul_swiglu_forward" + shape(C, 2 * I),
        [&] { inner_->matmul_swiglu_forward(act, gu, inp, w, N, C, I); });
}
void ProfiledBackend::add(XPtr out, XPtr a, XPtr b, size_t n) {
  timed("add", [&] { inner_->add(out, a, b, n); });
}
void ProfiledBackend::copy_columns(XPtr dst, int ld_dst, XPtr src, int ld_src, int rows,
                                   int cols, bool accumulate) {
  timed("copy_columns",
        [&] { inner_->copy_columns(dst, ld_dst, src, ld_src, rows, cols, accumulate); });
}
void ProfiledBackend::add_rmsnorm_forward(XPtr sum, XPtr out, float* rstd, XPtr a, XPtr b,
                                          XPtr w, int N, int C, float eps) {
  timed("add_rmsnorm_forward",
        [&] { inner_->add_rmsnorm_forward(sum, out, rstd, a, b, w, N, C, eps); });
}
void ProfiledBackend::rope_kv_store(XPtr qkv, const int32_t* pos, XPtr k_cache, XPtr v_cache,
                                    const int32_t* slots, const PagedShape& s, float theta) {
  timed("rope_kv_store", [&] { inner_->rope_kv_store(qkv, pos, k_cache, v_cache, slots, s, theta); });
}
void ProfiledBackend::scale(XPtr x, float s, size_t n) {
  timed("scale", [&] { inner_->scale(x, s, n); });
}
void ProfiledBackend::layernorm_forward(XPtr out, XPtr inp, XPtr w, XPtr bias, int N, int C,
                                        float eps) {
  timed("layernorm_forward", [&] { inner_->layernorm_forward(out, inp, w, bias, N, C, eps); });
}
void ProfiledBackend::gelu_forward(XPtr out, XPtr inp, size_t n) {
  timed("gelu_forward", [&] { inner_->gelu_forward(out, inp, n); });
}
void ProfiledBackend::paged_attention(XPtr out, XPtr qkv, XPtr k_cache, XPtr v_cache,
                                      const int32_t* block_tables, const int32_t* seq,
                                      const int32_t* pos, const PagedShape& s) {
  timed("paged_attention", [&] {
    inner_->paged_attention(out, qkv, k_cache, v_cache, block_tables, seq, pos, s);
  });
}
void ProfiledBackend::gather_rows(XPtr out, XPtr in, const int32_t* rows, int n, int C) {
  timed("gather_rows", [&] { inner_->gather_rows(out, in, rows, n, C); });
}
void ProfiledBackend::scatter_rows(XPtr out, XPtr in, const int32_t* rows, int n, int C) {
  timed("scatter_rows", [&] { inner_->scatter_rows(out, in, rows, n, C); });
}
void ProfiledBackend::logprob_forward(float* logprob, float* entropy, XPtr logits,
                                      const int32_t* targets, int n, int V) {
  timed("logprob_forward",
        [&] { inner_->logprob_forward(logprob, entropy, logits, targets, n, V); });
}
void ProfiledBackend::logprob_backward(XPtr logits, const int32_t* targets, const float* coef,
                                       const float* ent_coef, int n, int V) {
  timed("logprob_backward",
        [&] { inner_->logprob_backward(logits, targets, coef, ent_coef, n, V); });
}
void ProfiledBackend::sample_tokens(TokenDraw* out, XPtr logits, const SampleRow* rows, int n,
                                    int V) {
  timed("sample_tokens", [&] { inner_->sample_tokens(out, logits, rows, n, V); });
}
double ProfiledBackend::sum_squares(const float* x, size_t n) {
  double out = 0;
  timed("sum_squares", [&] { out = inner_->sum_squares(x, n); });
  return out;
}
void ProfiledBackend::accumulate(float* dst, const float* src, size_t n) {
  timed("accumulate", [&] { inner_->accumulate(dst, src, n); });
}
void ProfiledBackend::adamw_update(float* p, const float* g, float* m, float* v, size_t n,
                                   const AdamWParams& a) {
  timed("adamw_update", [&] { inner_->adamw_update(p, g, m, v, n, a); });
}

}  // namespace sr1
