// GlooComm: the CPU ranks' collectives, Gloo's (Debian's libgloo-dev): TCP pairs between
// every two ranks (on the loopback, or on each node's --host address across nodes), which
// find each other through a gloo::rendezvous::FileStore in the rendezvous folder (each rank
// writes its addresses there and reads the others'). The context's timeout bounds the rendezvous and every collective, so a rank that
// died or is stuck gives an error instead of a hang (the pairs that reduce_scatter's
// algorithm uses take it from the context too).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstring>
#include <memory>
#include <vector>

#include "dist/comm_impl.h"

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

  // Gloo's ReduceScatterHalvingDoubling (recursive halving, then each block sent to its
  // rank), which leaves this rank's sum at the front of the buffer; it counts in int, so a
  // buffer past INT_MAX values goes through in pieces (each rank's block cut alike).
  void reduce_scatter_sum(float* x, size_t n, const std::string& what) override {
    if (n == 0) return;
    const int size = this->size(), rank = this->rank();
    c_.run("reduce_scatter", what, n * size, [&] {
      const size_t piece = std::min(n, static_cast<size_t>(INT_MAX) / size);
      if (piece == n) {
        scatter_sum(x, n);
        if (rank != 0) std::memcpy(x + rank * n, x, n * sizeof(float));
        return;
      }
      std::vector<float> buf(piece * size);
      for (size_t at = 0; at < n; at += piece) {
        const size_t k = std::min(piece, n - at);
        for (int r = 0; r < size; r++) {
          std::memcpy(buf.data() + r * k, x + r * n + at, k * sizeof(float));
        }
        scatter_sum(buf.data(), k);
        std::memcpy(x + rank * n + at, buf.data(), k * sizeof(float));
      }
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

  // Sums x[0, size*k) block-wise; this rank's block's sum lands in x[0, k).
  void scatter_sum(float* x, size_t k) {
    const std::vector<int> counts(size(), static_cast<int>(k));
    gloo::ReduceScatterHalvingDoubling<float> algorithm(context_, {x}, static_cast<int>(k * size()),
                                                        counts);
    algorithm.run();
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
