// GlooComm: the CPU ranks' collectives, Gloo's (Debian's libgloo-dev): TCP pairs between
// every two ranks (on the loopback, or on each node's --host address across nodes), which
// find each other through a gloo::rendezvous::FileStore in the rendezvous folder (each rank
// writes its addresses there and reads the others'). The context's timeout bounds the
// rendezvous and every collective, so a rank that died or is stuck gives an error instead of
// a hang.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <csignal>
#include <memory>

#include "collective/comm_impl.h"

namespace sr1 {
namespace {

class GlooComm final : public Comm {
 public:
  explicit GlooComm(const CommOptions& o) : c_(o) {
    // A peer that has gone must be an error of the collective, not a SIGPIPE that kills
    // this rank before it can say so.
    std::signal(SIGPIPE, SIG_IGN);
    c_.run("rendezvous", "the ranks' addresses in " + o.rendezvous, 0, [&] {
      gloo::transport::tcp::attr attr;
      attr.hostname = o.host;
      auto device = gloo::transport::tcp::CreateDevice(attr);
      gloo::rendezvous::FileStore files(o.rendezvous);
      gloo::rendezvous::PrefixStore store("searchr1-gloo", files);
      auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
      context->setTimeout(std::chrono::milliseconds(static_cast<long>(o.timeout_s * 1000)));
      context->connectFullMesh(store, device);
      context_ = context;
    });
  }

  std::string name() const override { return "gloo"; }
  int rank() const override { return c_.options().rank; }
  int size() const override { return c_.options().size; }

  void all_reduce_sum(float* x, size_t n, const std::string& what) override {
    sum(x, n, what);
  }
  void all_reduce_sum_host(float* x, size_t n, const std::string& what) override {
    sum(x, n, what);
  }
  void all_reduce_sum_host(double* x, size_t n, const std::string& what) override {
    sum(x, n, what);
  }

  // Gloo's reduce, in place (only an output buffer given, as PyTorch's ProcessGroupGloo does).
  void reduce_sum(float* x, size_t n, int root, const std::string& what) override {
    if (n == 0) return;
    c_.run("reduce", what, n, [&] {
      gloo::ReduceOptions opts(context_);
      opts.setOutput(x, n);
      opts.setRoot(root);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(next_tag());
      gloo::reduce(opts);
    });
  }

  void all_gather(void* x, size_t n, size_t elem, const std::string& what) override {
    gather(nullptr, x, n, elem, what);
  }
  void all_gather_into(const void* in, void* out, size_t n, size_t elem,
                       const std::string& what) override {
    gather(in, out, n, elem, what);
  }

  void barrier(const std::string& what) override {
    c_.run("barrier", what, 0, [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    });
  }

 private:
  template <typename T>
  void sum(T* x, size_t n, const std::string& what) {
    if (n == 0) return;
    c_.run("all_reduce", what, n, [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(x, n);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
      opts.setTag(next_tag());
      gloo::allreduce(opts);
    });
  }

  // in == nullptr: in place (this rank's block already in out).
  void gather(const void* in, void* out, size_t n, size_t elem, const std::string& what) {
    if (n == 0) return;
    c_.run("all_gather", what, n * size(), [&] {
      gloo::AllgatherOptions opts(context_);
      if (in != nullptr) {
        opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), n * elem);
      }
      opts.setOutput(static_cast<uint8_t*>(out), n * elem * size());
      opts.setTag(next_tag());
      gloo::allgather(opts);
    });
  }

  // Every rank makes the same calls in the same order, so the same tags.
  uint32_t next_tag() { return tag_++; }

  Collectives c_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t tag_ = 0;
};

}  // namespace

std::unique_ptr<Comm> open_gloo_comm(const CommOptions& o) { return std::make_unique<GlooComm>(o); }

}  // namespace sr1
