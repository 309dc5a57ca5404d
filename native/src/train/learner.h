// A model being trained by an RL run (the actor, or the critic): its AdamW state, learning
// rate schedule and the generator that shuffles its mini-batches, which a checkpoint saves
// and restores so that a resumed run continues bit-exactly; and the communicator of its
// data-parallel ranks (collective/comm.h), over which each step first sums the ranks'
// gradients, so that every rank takes the same step (the generator, seeded alike, shuffles
// alike).
//
// ZeRO (DeepSpeed's stages; `zero_stage` of SERVE.md's load): from stage 1 on, the fp32
// master weights and both AdamW moments are cut into one shard per rank. The model's flat
// buffers are padded (Qwen2Model::load's pad_multiple = ranks × ParamLayout::kAlign) so that
// rank r owns the contiguous range [r·S, (r+1)·S) of S = buffer_capacity() / ranks values,
// every shard the same size (the last one's tail is zero padding that stays zero). A step:
//  - stage 1: the whole gradient is summed over the ranks (all-reduce), as at stage 0;
//  - stage 2 (DeepSpeed's, with its reduction during the backward): no rank holds the whole
//    gradient. Each backward pass computes its gradient one region at a time (the head,
//    each layer, the embeddings: Qwen2Model::GradientSink) into the learner's buckets
//    (train/gradient_buckets.h), and each part of a region goes to the rank whose shard
//    holds it (reduce), which adds it to its fp32 gradient shard. So a rank holds its shard
//    and the buckets during an update, and nothing between updates. The ranks meet once per
//    pass, so every rank makes as many passes as the one with the most micro-batches
//    (for_each_pass); the sums come in another order than stage 0's (each micro-batch over
//    the ranks, then over the micro-batches), equal up to float rounding.
//    With one rank and no library (LocalComm) the whole gradient accumulates, freed when the
//    update ends;
// then the global gradient norm is the square root of the ranks' summed squared shard norms,
// the clip and AdamW run on the rank's shard alone, and the updated shard goes into every
// rank's compute copy of the whole model (all-gather, in the compute type: bf16 on CUDA,
// where the model's own fp32 masters are dropped; on the CPU the compute copy is fp32 and is
// the masters, so the shard is updated in place and gathered).
//
// Offload (verl's fsdp_config.{param,grad,optimizer}_offload, which Search-R1's scripts set;
// `actor_offload`, `critic_offload` of SERVE.md's load): what the device holds moves to host
// memory (Backend::alloc_host: page-locked on CUDA, plain memory on the CPU). Only where the
// values live and the copies change, never the arithmetic, so on the CPU backend an offloaded
// run is the plain one bit for bit.
//  - optimizer: the fp32 masters (this rank's shard from stage 1 on, else the whole) and both
//    AdamW moments live in host memory, and the step runs there (backend/cpu_adamw.h: the CPU
//    backend's AdamW, OpenMP over the shard), each updated piece then converted into the
//    device's compute copy (bf16 on CUDA) while the host steps the next, and all-gathered as
//    without offload: DeepSpeed's ZeRO-Offload (deepspeed/runtime/zero/stage_1_and_2.py,
//    cpu_offload; deepspeed/ops/adam/cpu_adam.py) and FSDP's CPUOffload
//    (torch/distributed/fsdp/api.py), whose optimizer steps on the CPU too. The gradient the
//    host step reads is copied to host memory first (unless grad offload keeps it there).
//  - grad: the fp32 gradient the step reads lives in host memory. At stage 2 over several
//    ranks the shard does: each reduced part of a region a pass hands over is added to it as
//    the backward goes (close(); on CUDA by the device's kernel writing the mapped host memory,
//    so the device holds the buckets alone). At stage 0 and 1 (and on one rank) the backward
//    still adds into the device's whole gradient buffer over the micro-batches; before the
//    step it is summed over the ranks there, this rank's range copied to host memory and the
//    device buffer freed, so the device holds it during the passes only, not during the step
//    or between updates. Without optimizer offload, the device's step reads the host gradient
//    over the bus.
//  - param: the compute copy waits in host memory between the trainer's phases, the session
//    moving it as it does the reference's (Qwen2Model::to_host, session.cpp); not the
//    learner's business.
//
// LoRA (model/lora.h): a model with adapters attached is trained through them alone: the
// learner's AdamW, the gradient all-reduce, the clip and checkpoints' moments cover the
// adapters' flat fp32 buffer, and the base weights stay as loaded. ZeRO shards that buffer
// (LoraAdapters padded by zero_pad_multiple): from stage 1 on each rank keeps AdamW's moments
// of its shard, updates it and all-gathers the fp32 adapters; at stage 2 each shard of the
// summed gradient is reduced onto its rank alone after the passes (the adapters' whole
// gradient buffer is small: no buckets) and the buffer is freed between updates. Offload:
// param alone (the frozen base waits in host memory; the adapters' state stays).
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/host_buffer.h"
#include "collective/comm.h"
#include "model/qwen2.h"
#include "train/adamw.h"
#include "train/gradient_buckets.h"
#include "train/schedule.h"
#include "util/json.h"

namespace sr1 {

// What a learner keeps in host memory (above).
struct Offload {
  bool param = false;
  bool grad = false;
  bool optimizer = false;
};

class Learner : private Qwen2Model::GradientSink {
 public:
  // `zero_stage` 1 or 2 needs the model loaded with pad_multiple = ranks × kAlign
  // (zero_pad_multiple); it, or `offload.optimizer`, takes over the model's fp32 masters
  // (Qwen2Model::drop_masters). A model with LoRA adapters (Qwen2Model::lora) trains them.
  Learner(Qwen2Model& model, AdamWConfig adamw, LrSchedule schedule, uint64_t seed, Comm& comm,
          int zero_stage = 0, Offload offload = {});
  ~Learner() override;
  Learner(const Learner&) = delete;
  Learner& operator=(const Learner&) = delete;

  Qwen2Model& model() { return model_; }
  Comm& comm() { return comm_; }
  std::mt19937_64& rng() { return rng_; }
  int steps() const { return optimizer_.steps(); }
  int zero_stage() const { return stage_; }
  const Offload& offload() const { return offload_; }
  // Before a mini-batch's passes: its gradients start from zero (`what` names the update in
  // a failed collective's message).
  void zero_grad(const std::string& what);
  // Runs pass(i) for each of this rank's `passes` micro-batches of a mini-batch. At stage 2
  // over several ranks each pass is a series of collectives, so the ranks first agree on the
  // most passes any of them makes, and a rank with fewer adds empty passes after its own.
  void for_each_pass(int passes, const std::string& what, const std::function<void(int)>& pass);
  // One optimizer step on the accumulated gradients, summed over the ranks, at the
  // schedule's rate; returns the gradient norm before clipping and sets *lr. `what` names the
  // update in a failed collective's message ("update_actor").
  double step(float* lr, const std::string& what);
  // After an update's last step: at stage 2 the gradient buffer (or shard and buckets) goes.
  void end_update();

  // Checkpoints have one layout at every stage and number of ranks, one rank's: the whole
  // moments (`<dir>/<name>.optimizer.safetensors`), the generator (`<dir>/<name>.rng.txt`)
  // and the fp32 weights (the caller's Hugging Face folder). So they resume on any number
  // of ranks: each rank reads its own range.
  // snapshot() gathers the state to rank 0's host memory: every rank must call it (from
  // stage 1 on it is a collective; at stage 0 rank 0 reads its own copy). On rank 0 it holds
  // m and v, and `masters` where the learner keeps them apart from the model (CUDA from stage
  // 1 on, and optimizer offload; then write the weights from it); elsewhere it is empty.
  struct Snapshot {
    std::vector<float> m, v, masters;
    int steps = 0;
    std::mt19937_64 rng;
  };
  Snapshot snapshot(const std::string& what);
  // Rank 0's whole fp32 weights where the learner keeps them apart from the model (empty
  // elsewhere); every rank must call it.
  std::vector<float> gather_masters(const std::string& what);
  static void save_state(const Snapshot& snapshot, const std::string& dir, const std::string& name);
  // Loading reads and checks everything first (read_state: this rank's range of the moments,
  // and of the fp32 weights in `weights_dir` where the learner keeps a master shard), so
  // that a checkpoint can be restored all or nothing; restore_state then cannot fail. The
  // caller reloads the model's weights from `weights_dir` itself.
  struct State {
    AdamW::State optimizer;
    std::vector<float> masters;
    std::mt19937_64 rng;
  };
  State read_state(const std::string& dir, const std::string& name,
                   const std::string& weights_dir) const;
  void restore_state(const State& state);

  // Bytes this rank holds for the model being trained (the load reply's `memory`): on the
  // device, then in host memory (the offloads).
  struct Memory {
    size_t weights = 0;    // the compute copy of the whole model (fp32 on the CPU: the masters;
                           // none while param offload keeps it in host memory)
    size_t masters = 0;    // fp32 masters apart from it: the model's whole, or this shard
    size_t optimizer = 0;  // AdamW's two moments: whole, or this shard
    size_t gradients = 0;  // fp32 gradients during an update (stage 2: shard and buckets)
    size_t gradients_between = 0;  // ... and between updates (stage 2, grad offload: none)
    size_t host_weights = 0;    // param offload: the compute copy between phases
    size_t host_masters = 0;    // optimizer offload: the fp32 masters (whole, or this shard)
    size_t host_optimizer = 0;  // optimizer offload: AdamW's two moments
    size_t host_gradients = 0;  // grad or optimizer offload: the gradient the step reads
    // As the load reply and searchr1-trainer plan print it.
    json::Value json() const;
  };
  Memory memory() const;
  // What memory() says of a learner of a model laid out as `layout` over `ranks` ranks at
  // `zero_stage`, with compute-type elements of `x_elem` bytes (4: fp32, the CPU's, where
  // the compute copy is the masters) and `offload`, the model not loaded: the memory plan's
  // source (searchr1-trainer plan), checked against live learners' by the tests. `weights` is
  // the compute copy while it is on the device (with param offload, during its commands).
  // With `lora` (stage 0, no offload, as the constructor requires): the base's compute copy
  // and the adapters' fp32 masters (with their compute copy where apart), moments and gradients.
  static Memory planned(const ParamLayout& layout, int ranks, int zero_stage, size_t x_elem,
                        Offload offload, const LoraLayout* lora = nullptr);

 private:
  // Rank 0's host copy of the first param_buffer_size() values of the ranks' shards
  // (`shard` on the device, or in host memory `on_host`; shard_ values on each rank, of which
  // at stage 0 rank 0's own is the whole), gathered through a bounded buffer.
  std::vector<float> gather(const float* shard, bool on_host, const std::string& what);
  std::vector<float> read_masters(const std::string& weights_dir) const;
  // The fp32 masters the learner keeps apart from the model (host_masters_, masters_), else
  // null; and the values the step updates: those, or the model's own (this rank's range).
  float* own_masters() const;
  float* masters();
  // This rank's range of the gradient summed over the ranks, where the step reads it.
  const float* reduced_gradient(const std::string& what);
  // The values the learner trains: the adapters' buffer with LoRA, else the model's.
  size_t trained_size() const;
  // Stage 2 over several ranks: the passes' gradients go to the ranks region by region.
  // The backward hands its gradient regions over as it goes (stage 2 of a full model).
  bool bucketed() const { return stage_ == 2 && !comm_.local() && lora_ == nullptr; }
  // The trained flat buffer with its ZeRO padding: the adapters', or the model's.
  size_t flat_capacity() const;
  float* open(size_t begin, size_t end) override;
  void close(float* grad, size_t begin, size_t end) override;

  Qwen2Model& model_;
  LoraAdapters* lora_;  // the model's adapters, which alone are trained; else null
  Comm& comm_;
  int stage_;
  Offload offload_;
  size_t offset_, shard_;  // this rank's range of the flat buffers (stage 0: all of them)
  float* masters_ = nullptr;  // this shard's fp32 masters on the device, where the model has none
  HostBuffer host_masters_;   // optimizer offload: this shard's fp32 masters
  HostBuffer host_grad_;      // grad or optimizer offload: this shard's gradient for the step
  float* grad_shard_ = nullptr;  // bucketed without grad offload: this shard's summed gradient
                                 // during an update
  GradientBuckets buckets_;      // bucketed: what the passes compute their regions into
  std::string pass_what_;        // bucketed: the update the passes belong to
  AdamW optimizer_;
  LrSchedule schedule_;
  std::mt19937_64 rng_;
};

// Qwen2Model::load's pad_multiple for a learner of `zero_stage` over `ranks` ranks.
size_t zero_pad_multiple(int zero_stage, int ranks);

}  // namespace sr1
