#include "train/learner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "io/safetensors.h"
#include "model/device_buffers.h"
#include "model/params.h"
#include "util/error.h"

namespace sr1 {

size_t zero_pad_multiple(int zero_stage, int ranks) {
  return zero_stage > 0 ? static_cast<size_t>(ranks) * ParamLayout::kAlign : 1;
}

namespace {

// The values each rank's optimizer holds: all of them at stage 0, else one equal shard.
size_t shard_of(const Qwen2Model& model, const Comm& comm, int stage) {
  if (stage < 0 || stage > 2) {
    throw Error("'zero_stage' must be 0, 1 or 2, got " + std::to_string(stage));
  }
  const LoraAdapters* lora = model.lora();
  if (stage == 0) return lora != nullptr ? lora->size() : model.param_buffer_size();
  const size_t multiple = zero_pad_multiple(stage, comm.size());
  const size_t capacity = lora != nullptr ? lora->capacity() : model.buffer_capacity();
  if (capacity % multiple != 0) {
    throw Error("ZeRO stage " + std::to_string(stage) + ": the " +
                (lora != nullptr ? "adapters'" : "model's") + " buffers are not padded for " +
                std::to_string(comm.size()) + " ranks (load it with zero_pad_multiple)");
  }
  return capacity / comm.size();
}

}  // namespace

Learner::Learner(Qwen2Model& model, AdamWConfig adamw, LrSchedule schedule, uint64_t seed,
                 Comm& comm, int zero_stage, Offload offload)
    : model_(model),
      lora_(model.lora()),
      comm_(comm),
      stage_(zero_stage),
      offload_(offload),
      offset_(0),
      shard_(shard_of(model, comm, zero_stage)),
      buckets_(model.be(), model.gradient_regions()),
      optimizer_(model.be(), shard_, adamw, offload.optimizer),
      schedule_(schedule),
      rng_(seed) {
  schedule_.validate(OptionStyle::Field);
  if (stage_ > 0) offset_ = static_cast<size_t>(comm.rank()) * shard_;
  if (lora_ != nullptr) {
    if (offload_.grad || offload_.optimizer) {  // param offload moves the frozen base alone
      throw Error("LoRA: only param offload (the adapters' state stays on the device)");
    }
    // The adapters' fp32 buffer is the masters; the frozen base keeps its compute copy alone
    // (bf16 on CUDA; on the CPU its fp32 compute copy is all there is).
    model.drop_masters();
    return;
  }
  if (bucketed()) model.set_gradient_sink(this);
  if (model.params() == nullptr) {
    throw Error("Learner: the model's fp32 masters are gone (dropped before it took them)");
  }
  Backend& be = model.be();
  if (offload_.grad || offload_.optimizer) host_grad_ = HostBuffer(be, shard_ * sizeof(float));
  if (offload_.optimizer) {  // the masters of this rank's range to host memory
    host_masters_ = HostBuffer(be, shard_ * sizeof(float));
    be.download(host_masters_.floats(), model.params() + offset_, shard_);
    model.drop_masters();
    return;
  }
  // The model's masters serve: its whole fp32 copy (stage 0), or its fp32 compute copy (the
  // CPU), of which the shard is a range.
  if (stage_ == 0 || model.weights().p == model.params()) return;
  // A master shard of this rank's own, then the model's whole fp32 copy goes.
  std::vector<float> host(shard_);
  be.download(host.data(), model.params() + offset_, shard_);
  masters_ = be.alloc(shard_);
  be.upload(masters_, host.data(), shard_);
  model.drop_masters();
}

Learner::~Learner() {
  if (bucketed()) model_.set_gradient_sink(nullptr);
  for (float* p : {masters_, grad_shard_}) {
    if (p != nullptr) model_.be().release(p);
  }
}

size_t Learner::flat_capacity() const {
  return lora_ != nullptr ? lora_->capacity() : model_.buffer_capacity();
}

size_t Learner::trained_size() const {
  return lora_ != nullptr ? lora_->size() : model_.param_buffer_size();
}

void Learner::zero_grad(const std::string& what) {
  if (lora_ != nullptr) {
    lora_->zero_grad();
    return;
  }
  if (!bucketed()) {
    model_.zero_grad();
    return;
  }
  pass_what_ = what;
  Backend& be = model_.be();
  if (offload_.grad) {
    be.synchronize();  // the last step's kernels have read it
    std::memset(host_grad_.data(), 0, host_grad_.bytes());
    return;
  }
  if (grad_shard_ == nullptr) grad_shard_ = be.alloc(shard_);
  be.zero(grad_shard_, shard_);
}

float* Learner::open(size_t begin, size_t end) { return buckets_.open(begin, end); }

// Each part of the region that lies in rank r's shard is summed onto rank r, which adds it
// to its gradient shard (with grad offload in host memory, where the device's kernel writes
// it through the mapping). The ranks hand over the same regions in the same order.
void Learner::close(float* grad, size_t begin, size_t end) {
  Backend& be = model_.be();
  float* shard = offload_.grad ? host_grad_.floats() : grad_shard_;
  be.synchronize();  // the pass has written the region
  for (size_t r = begin / shard_; r < static_cast<size_t>(comm_.size()) && r * shard_ < end;
       r++) {
    const size_t lo = std::max(begin, r * shard_), hi = std::min(end, (r + 1) * shard_);
    comm_.reduce_sum(grad + (lo - begin), hi - lo, static_cast<int>(r),
                     pass_what_ + "'s gradients");
    if (r == static_cast<size_t>(comm_.rank())) {
      be.accumulate(shard + (lo - offset_), grad + (lo - begin), hi - lo);
    }
  }
}

void Learner::for_each_pass(int passes, const std::string& what,
                            const std::function<void(int)>& pass) {
  double most = passes;
  if (bucketed()) {
    std::vector<double> counts(static_cast<size_t>(comm_.size()), 0.0);
    counts[static_cast<size_t>(comm_.rank())] = passes;
    comm_.all_reduce_sum_host(counts.data(), counts.size(), what + "'s micro-batch counts");
    most = *std::max_element(counts.begin(), counts.end());
  }
  for (int i = 0; i < passes; i++) pass(i);
  for (int i = passes; i < most; i++) model_.empty_pass();
}

float* Learner::own_masters() const {
  return offload_.optimizer ? host_masters_.floats() : masters_;
}

float* Learner::masters() {
  if (lora_ != nullptr) return lora_->params() + offset_;
  float* own = own_masters();
  return own != nullptr ? own : model_.params() + offset_;
}

const float* Learner::reduced_gradient(const std::string& what) {
  Backend& be = model_.be();
  if (bucketed() && offload_.grad) {  // summed there during the passes
    be.synchronize();  // by the passes' kernels
    return host_grad_.floats();
  }
  float* mine = grad_shard_;  // bucketed: summed during the passes
  if (!bucketed()) {
    float* grads = lora_ != nullptr ? lora_->grads() : model_.grads();
    if (!comm_.local()) {
      be.synchronize();  // the backward passes have written the gradients
      if (lora_ != nullptr && stage_ == 2) {
        // Each rank's shard summed onto that rank alone (the adapters' whole gradient buffer
        // is small: ZeRO-2 here partitions the summed gradient, not the backward's buckets).
        for (int r = 0; r < comm_.size(); r++) {
          comm_.reduce_sum(grads + static_cast<size_t>(r) * shard_, shard_, r,
                           what + "'s gradients");
        }
      } else {
        comm_.all_reduce_sum(grads, stage_ == 0 ? trained_size() : flat_capacity(),
                             what + "'s gradients");
      }
    }
    mine = grads + offset_;
  }
  if (host_grad_.empty()) return mine;
  be.download(host_grad_.floats(), mine, shard_);
  // Stage 0 and 1: the device holds no gradient until the next mini-batch's passes.
  if (offload_.grad) model_.release_grads();
  return host_grad_.floats();
}

double Learner::step(float* lr, const std::string& what) {
  Backend& be = model_.be();
  const bool sharded = stage_ > 0 && !comm_.local();
  *lr = schedule_.at(optimizer_.steps());
  const float* grad = reduced_gradient(what);
  double squares = optimizer_.sum_squares(grad);
  if (sharded) squares = all_reduce_sum(comm_, squares, what + "'s squared gradient norm");
  const double norm = std::sqrt(squares);
  // Each updated piece goes into the compute copy (a no-op where that is the masters: the
  // CPU without optimizer offload), then the ranks' shards to every rank.
  float* values = masters();
  const XPtr weights = model_.weights();
  optimizer_.step(values, grad, *lr, norm, [&](size_t begin, size_t end) {
    if (lora_ != nullptr) return lora_->params_changed(offset_ + begin, offset_ + end);
    be.to_x(weights + (offset_ + begin), values + begin, end - begin);
  });
  if (lora_ != nullptr) {  // the base's host copy stays current; the adapters' fp32 values
    if (sharded) {         // are gathered (checkpoints and exports read them), then converted
      be.synchronize();
      comm_.all_gather(lora_->params(), shard_, sizeof(float), what + "'s updated adapters");
      lora_->params_changed(0, lora_->capacity());
    }
  } else {
    model_.weights_changed();
    if (sharded) {
      be.synchronize();
      comm_.all_gather(weights.p, shard_, weights.elem, what + "'s updated weights");
    }
  }
  if (offload_.optimizer) be.synchronize();  // the device has read the host masters
  return norm;
}

void Learner::end_update() {
  if (stage_ != 2) return;
  if (lora_ != nullptr) return lora_->release_grads();
  model_.release_grads();
  buckets_.release();
  if (grad_shard_ != nullptr) {
    model_.be().synchronize();
    model_.be().release(grad_shard_);
    grad_shard_ = nullptr;
  }
}

std::vector<float> Learner::gather(const float* shard, bool on_host, const std::string& what) {
  Backend& be = model_.be();
  const size_t total = trained_size();
  const bool root = comm_.rank() == 0;
  std::vector<float> out(root ? total : 0);
  if (comm_.local() || stage_ == 0) {  // rank 0's shard is the whole buffer
    if (root) read_floats(be, out.data(), shard, total, on_host);
    return out;
  }
  const size_t ranks = static_cast<size_t>(comm_.size());
  constexpr size_t kPiece = size_t{1} << 22;  // floats of each rank per round (16 MiB)
  const size_t piece = std::min(shard_, kPiece);
  std::vector<float> host(root ? piece * ranks : 0);
  DeviceBuffers buffers(be);
  float* staging = buffers.f(piece * ranks);
  // A shard in host memory reaches the collective, which takes device memory, piece by piece.
  float* mine = on_host ? buffers.f(piece) : nullptr;
  be.synchronize();
  for (size_t at = 0; at < shard_; at += piece) {
    const size_t k = std::min(piece, shard_ - at);
    if (on_host) be.upload(mine, shard + at, k);
    comm_.all_gather_into(on_host ? mine : shard + at, staging, k, sizeof(float), what);
    if (!root) continue;
    be.download(host.data(), staging, k * ranks);
    for (size_t r = 0; r < ranks; r++) {
      const size_t begin = r * shard_ + at;  // where rank r's piece sits in the flat buffer
      if (begin >= total) continue;          // the padding
      std::memcpy(out.data() + begin, host.data() + r * k,
                  std::min(k, total - begin) * sizeof(float));
    }
  }
  return out;
}

Learner::Snapshot Learner::snapshot(const std::string& what) {
  Snapshot s;
  s.steps = optimizer_.steps();
  s.rng = rng_;
  s.m = gather(optimizer_.m(), optimizer_.on_host(), what + " (AdamW's first moments)");
  s.v = gather(optimizer_.v(), optimizer_.on_host(), what + " (AdamW's second moments)");
  s.masters = gather_masters(what + " (the fp32 weights)");
  return s;
}

std::vector<float> Learner::gather_masters(const std::string& what) {
  float* own = own_masters();
  if (own == nullptr) return {};
  return gather(own, offload_.optimizer, what);
}

void Learner::save_state(const Snapshot& snapshot, const std::string& dir,
                         const std::string& name) {
  AdamW::write(dir + "/" + name + ".optimizer.safetensors", snapshot.m, snapshot.v,
               snapshot.steps);
  const std::string path = dir + "/" + name + ".rng.txt";
  std::ofstream rng(path);
  rng << snapshot.rng;
  if (!rng) throw Error(path + ": cannot write");
}

std::vector<float> Learner::read_masters(const std::string& weights_dir) const {
  std::vector<float> out(shard_, 0.0f);
  const SafetensorsSet set = SafetensorsSet::open_dir(weights_dir);
  const size_t lo = offset_, hi = offset_ + shard_;
  for (const ParamTensor& t : model_.layout().tensors()) {
    const size_t begin = std::max(lo, t.offset), end = std::min(hi, t.offset + t.numel);
    if (begin >= end) continue;
    const TensorView* view = set.find(t.name);
    if (view == nullptr) throw Error(set.source() + ": tensor '" + t.name + "' is missing");
    check_f32(*view, t.shape);
    const size_t from = begin - t.offset, k = end - begin;
    float* dst = out.data() + (begin - lo);
    if (view->dtype == DType::F32) {  // only this range of the mapped file is read
      std::memcpy(dst, view->data + from * sizeof(float), k * sizeof(float));
      continue;
    }
    std::vector<float> whole(t.numel);
    read_f32(*view, t.shape, whole.data());
    std::memcpy(dst, whole.data() + from, k * sizeof(float));
  }
  return out;
}

Learner::State Learner::read_state(const std::string& dir, const std::string& name,
                                   const std::string& weights_dir) const {
  const std::string optimizer = dir + "/" + name + ".optimizer.safetensors";
  State state{stage_ == 0 ? optimizer_.read(optimizer)
                          : optimizer_.read(optimizer, offset_, trained_size()),
              {},
              {}};
  if (own_masters() != nullptr) state.masters = read_masters(weights_dir);
  const std::string path = dir + "/" + name + ".rng.txt";
  std::ifstream in(path);
  if (!(in >> state.rng)) throw Error(path + ": missing or not a generator state");
  return state;
}

void Learner::restore_state(const State& state) {
  optimizer_.restore(state.optimizer);
  float* own = own_masters();
  if (own != nullptr) {
    write_floats(model_.be(), own, state.masters.data(), shard_, offload_.optimizer);
  }
  rng_ = state.rng;
}

Learner::Memory Learner::memory() const {
  const size_t shard = shard_ * sizeof(float);
  Memory m;
  m.weights = model_.weight_bytes();
  if (lora_ != nullptr) {  // the frozen base's compute copy; the adapters' state
    m.masters = model_.master_bytes() + lora_->weight_bytes();
    m.optimizer = 2 * shard;
    m.gradients = (stage_ == 0 ? lora_->size() : lora_->capacity()) * sizeof(float);
    m.gradients_between = stage_ == 2 ? 0 : m.gradients;
    m.host_weights = model_.host_bytes();
    return m;
  }
  m.masters = model_.master_bytes() + (masters_ != nullptr ? shard : 0);
  m.optimizer = offload_.optimizer ? 0 : 2 * shard;
  m.gradients = bucketed() ? (offload_.grad ? 0 : shard) + buckets_.bytes()
                          : model_.buffer_capacity() * sizeof(float);
  m.gradients_between = stage_ == 2 || offload_.grad ? 0 : m.gradients;
  m.host_weights = model_.host_bytes();
  m.host_masters = host_masters_.bytes();
  m.host_optimizer = offload_.optimizer ? 2 * shard : 0;
  m.host_gradients = host_grad_.bytes();
  return m;
}

json::Value Learner::Memory::json() const {
  const auto n = [](size_t b) { return json::Value(static_cast<int64_t>(b)); };
  return json::Value::object({{"weights", n(weights)},
                              {"master_weights", n(masters)},
                              {"optimizer_state", n(optimizer)},
                              {"gradients", n(gradients)},
                              {"gradients_between_updates", n(gradients_between)},
                              {"host_weights", n(host_weights)},
                              {"host_master_weights", n(host_masters)},
                              {"host_optimizer_state", n(host_optimizer)},
                              {"host_gradients", n(host_gradients)}});
}

Learner::Memory Learner::planned(const ParamLayout& layout, int ranks, int zero_stage,
                                 size_t x_elem, Offload offload, const LoraLayout* lora) {
  const size_t multiple = zero_pad_multiple(zero_stage, ranks);
  if (lora != nullptr) {  // memory()'s LoRA case: the base's compute copy, the adapters' state
    const size_t capacity = (lora->total + multiple - 1) / multiple * multiple;
    const size_t shard = zero_stage == 0 ? lora->total : capacity / ranks;
    Memory m;
    m.weights = layout.total() * x_elem;
    m.masters = capacity * (sizeof(float) + (x_elem != sizeof(float) ? x_elem : 0));
    m.optimizer = 2 * shard * sizeof(float);
    m.gradients = (zero_stage == 0 ? lora->total : capacity) * sizeof(float);
    m.gradients_between = zero_stage == 2 ? 0 : m.gradients;
    m.host_weights = offload.param ? m.weights : 0;
    return m;
  }
  const size_t capacity = (layout.total() + multiple - 1) / multiple * multiple;
  const size_t shard = (zero_stage == 0 ? layout.total() : capacity / ranks) * sizeof(float);
  const bool bucketed = zero_stage == 2 && ranks > 1;
  // fp32 compute: the model's params are its weights, and the masters are them (the
  // constructor keeps no copy apart).
  const bool apart = x_elem != sizeof(float);
  Memory m;
  m.weights = capacity * x_elem;
  m.masters = apart && !offload.optimizer ? shard : 0;
  m.optimizer = offload.optimizer ? 0 : 2 * shard;
  m.gradients = bucketed ? (offload.grad ? 0 : shard) +
                               GradientBuckets::bytes(Qwen2Model::gradient_regions(layout, capacity))
                         : capacity * sizeof(float);
  m.gradients_between = zero_stage == 2 || offload.grad ? 0 : m.gradients;
  m.host_weights = offload.param ? capacity * x_elem : 0;
  m.host_masters = offload.optimizer ? shard : 0;
  m.host_optimizer = offload.optimizer ? 2 * shard : 0;
  m.host_gradients = offload.grad || offload.optimizer ? shard : 0;
  return m;
}

}  // namespace sr1
