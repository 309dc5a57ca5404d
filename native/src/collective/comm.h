// Collectives across the trainer ranks of one data-parallel run (`searchr1-trainer serve
// --rank R --world-size N --rendezvous DIR`): every rank holds the whole model and computes
// the gradient of its share of each mini-batch; the ranks sum their gradients (and the loss
// sums behind the metrics) with these calls before each takes the same optimizer step, or,
// with ZeRO (train/learner.h), reduce-scatter them, update their own shard and all-gather
// the weights. One
// interface, in the style of backend/backend.h, and one implementation per library, never
// home-made collectives:
//  - LocalComm: one rank; every call returns at once and changes nothing.
//  - GlooComm (gloo_comm.cpp, built when CMake finds Gloo): CPU ranks, Gloo over TCP (the
//    loopback, or --host on several nodes), meeting through a gloo::rendezvous::FileStore in
//    the rendezvous folder (PyTorch's file:// init does the same across nodes).
//  - NcclComm (nccl_comm.cpp, built with the CUDA backend): CUDA ranks, NCCL loaded at run
//    time like cuBLASLt; rank 0's unique id reaches the others through the rendezvous folder.
// A collective that fails (a peer died) or waits longer than the timeout (a peer is stuck)
// throws sr1::Error naming the collective, what it carried and the timeout, never hangs; from
// then on the communicator refuses every call, as the ranks are out of step.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace sr1 {

struct CommOptions {
  int rank = 0, size = 1;
  // "auto": LocalComm for one rank, else NCCL on CUDA and Gloo on the CPU; "gloo" or "nccl":
  // that library even for one rank (a check that its calls run where only one device is).
  std::string library = "auto";
  std::string rendezvous;   // a folder every rank can read and write, fresh per run (on
                            // several nodes, on a filesystem they all mount)
  std::string host = "127.0.0.1";  // the address this rank's Gloo pairs listen on: the
                                   // loopback on one node, the node's own address on several
  double timeout_s = 1800;  // longest wait of one collective (and of the rendezvous)
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual std::string name() const = 0;  // "local", "gloo", "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // LocalComm's true: one rank and no library, so the trainer skips the collectives and runs
  // as it does without ranks. A library communicator of one rank (--collectives) runs them.
  virtual bool local() const { return false; }
  // In place, x[i] = the sum over the ranks of x[i], the same bits on every rank. `what`
  // names the values in messages ("update_actor's gradients"). This one takes memory of the
  // backend the communicator serves (device memory for NCCL, host memory for Gloo); the _host
  // ones take host memory on every backend.
  virtual void all_reduce_sum(float* x, size_t n, const std::string& what) = 0;
  virtual void all_reduce_sum_host(float* x, size_t n, const std::string& what) = 0;
  virtual void all_reduce_sum_host(double* x, size_t n, const std::string& what) = 0;
  // ZeRO's two (train/learner.h), on the backend's memory, in place:
  // - reduce_sum: afterwards rank `root`'s x holds the sum over the ranks of x (the other
  //   ranks' x is undefined): stage 2 sends each part of a gradient bucket to the rank whose
  //   shard holds it.
  // - all_gather: x holds size() blocks of n elements of `elem` bytes each; afterwards every
  //   block holds what its rank had there (a copy: any element type).
  // The non-in-place all_gather_into takes this rank's block from `in` (n elements, not inside
  // `out`) and fills all of `out` (size() * n elements).
  virtual void reduce_sum(float* x, size_t n, int root, const std::string& what) = 0;
  virtual void all_gather(void* x, size_t n, size_t elem, const std::string& what) = 0;
  virtual void all_gather_into(const void* in, void* out, size_t n, size_t elem,
                               const std::string& what) = 0;
  // Returns once every rank has called it.
  virtual void barrier(const std::string& what) = 0;
};

class LocalComm final : public Comm {
 public:
  std::string name() const override { return "local"; }
  bool local() const override { return true; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, size_t, const std::string&) override {}
  void all_reduce_sum_host(float*, size_t, const std::string&) override {}
  void all_reduce_sum_host(double*, size_t, const std::string&) override {}
  // One rank, the root: in place there is nothing to do. (The trainer skips the collectives
  // of a local communicator; all_gather_into is not one it calls.)
  void reduce_sum(float*, size_t, int, const std::string&) override {}
  void all_gather(void*, size_t, size_t, const std::string&) override {}
  void all_gather_into(const void*, void*, size_t, size_t, const std::string& what) override;
  void barrier(const std::string&) override {}
};

// The communicator of rank `o.rank` of `o.size` for ranks on `be`'s device, by `o.library`.
// Throws UsageError for bad options or a library this build lacks (gloo_missing_message) or
// that does not serve the device, sr1::Error when the ranks cannot meet.
std::unique_ptr<Comm> open_comm(const CommOptions& o, Backend& be);

// Whether this build has Gloo (CPU ranks) and NCCL (CUDA ranks; the library itself is loaded
// at run time).
bool gloo_built();
bool nccl_built();

// Why `size` CPU ranks cannot run in a build without Gloo, with the line that installs it.
std::string gloo_missing_message(int size);

// The sum over the ranks of one host value.
double all_reduce_sum(Comm& comm, double x, const std::string& what);

}  // namespace sr1
