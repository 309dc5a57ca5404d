#include "train/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu_adamw.h"
#include "io/safetensors.h"
#include "util/error.h"

namespace sr1 {

AdamW::AdamW(Backend& backend, size_t n, AdamWConfig config, bool on_host)
    : be_(backend), n_(n), config_(config) {
  if (on_host) {
    host_ = HostBuffer(backend, 2 * n * sizeof(float));
    m_ = host_.floats();
    v_ = m_ + n;
    std::memset(m_, 0, host_.bytes());
    return;
  }
  m_ = backend.alloc(n);
  v_ = backend.alloc(n);
  be_.zero(m_, n_);
  be_.zero(v_, n_);
}

AdamW::~AdamW() {
  if (on_host()) return;  // host_ goes by itself
  be_.release(m_);
  be_.release(v_);
}

void AdamW::save(const std::string& path) const {
  std::vector<float> m(n_), v(n_);
  read_floats(be_, m.data(), m_, n_, on_host());
  read_floats(be_, v.data(), v_, n_, on_host());
  write(path, m, v, steps_);
}

void AdamW::write(const std::string& path, const std::vector<float>& m,
                  const std::vector<float>& v, int steps) {
  const int64_t step = steps;
  const int64_t n = static_cast<int64_t>(m.size());
  write_safetensors(path, {{"adamw.m", DType::F32, {n}, m.data()},
                           {"adamw.v", DType::F32, {n}, v.data()},
                           {"adamw.step", DType::I64, {1}, &step}});
}

AdamW::State AdamW::read(const std::string& path) const { return read(path, 0, n_); }

AdamW::State AdamW::read(const std::string& path, size_t offset, size_t total) const {
  const std::unique_ptr<SafetensorsFile> file = SafetensorsFile::open(path);
  State state;
  for (const auto& [name, dst] :
       {std::pair<const char*, std::vector<float>*>{"adamw.m", &state.m}, {"adamw.v", &state.v}}) {
    const TensorView* t = file->find(name);
    if (t == nullptr || t->dtype != DType::F32) {
      throw Error(path + ": tensor '" + name + "' is missing or not F32");
    }
    check_f32(*t, {static_cast<int64_t>(total)});
    // Only this optimizer's range is read from the mapped file (a shard of a large model
    // never holds the whole moments).
    dst->assign(n_, 0.0f);
    if (offset < total) {
      const size_t k = std::min(n_, total - offset);
      std::memcpy(dst->data(), t->data + offset * sizeof(float), k * sizeof(float));
    }
  }
  const TensorView* step = file->find("adamw.step");
  if (step == nullptr) throw Error(path + ": tensor 'adamw.step' is missing");
  const std::vector<int64_t> s = read_i64(*step);
  if (s.size() != 1 || s[0] < 0) throw Error(path + ": tensor 'adamw.step' must hold one count");
  state.steps = static_cast<int>(s[0]);
  return state;
}

void AdamW::restore(const State& state) {
  write_floats(be_, m_, state.m.data(), n_, on_host());
  write_floats(be_, v_, state.v.data(), n_, on_host());
  steps_ = state.steps;
}

double AdamW::sum_squares(const float* grads) const {
  return on_host() ? cpu::sum_squares(grads, n_) : be_.sum_squares(grads, n_);
}

double AdamW::step(float* params, const float* grads, float lr) {
  const double norm = std::sqrt(sum_squares(grads));
  step(params, grads, lr, norm);
  return norm;
}

void AdamW::step(float* params, const float* grads, float lr, double norm,
                 const Updated& updated) {
  AdamWParams a;
  a.lr = lr;
  a.beta1 = config_.beta1;
  a.beta2 = config_.beta2;
  a.eps = config_.eps;
  a.weight_decay = config_.weight_decay;
  a.step = ++steps_;
  if (config_.max_grad_norm > 0) {
    const double clip = config_.max_grad_norm / (norm + 1e-6);
    if (clip < 1.0) a.grad_scale = static_cast<float>(clip);
  }
  if (!on_host()) {
    be_.adamw_update(params, grads, m_, v_, n_, a);
    if (updated) updated(0, n_);
    return;
  }
  for (size_t at = 0; at < n_; at += kHostPiece) {
    const size_t k = std::min(kHostPiece, n_ - at);
    cpu::adamw_update(params + at, grads + at, m_ + at, v_ + at, k, a);
    if (updated) updated(at, at + k);
  }
}

}  // namespace sr1
