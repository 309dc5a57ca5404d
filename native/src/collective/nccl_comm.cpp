// NcclComm: the CUDA ranks' collectives, NCCL's, with libnccl.so.2 opened at run time so that
// one build runs with whichever NCCL 2 the machine has (a pip wheel, conda, the toolkit's
// folder or the system's) and a machine without one still runs everything but CUDA ranks.
// Where it is looked for, in order (the first file that loads and has every function wins):
//  1. $SEARCHR1_NCCL_PATH: the library file itself, or a folder that holds it;
//  2. the pip wheels (nvidia-nccl-cu12, nvidia-nccl-cu13) under $VIRTUAL_ENV and then
//     $CONDA_PREFIX: lib/python3*/site-packages/nvidia/nccl/lib; then $CONDA_PREFIX/lib;
//  3. $CUDA_HOME/lib64, $CUDA_PATH/lib64, /usr/local/cuda/lib64 and the library folder of the
//     toolkit this build was compiled with;
//  4. the system's search (LD_LIBRARY_PATH, the ldconfig cache).
// Rendezvous: rank 0 makes the unique id and writes it to <rendezvous>/nccl-unique-id
// (written to a temporary name and renamed, so a reader sees all of it or nothing); the other
// ranks wait for that file. A collective runs on the communicator's own stream after the
// caller has synchronized the backend's; this thread then polls the stream, and past the
// timeout (or on an asynchronous NCCL error: a peer gone) aborts the communicator and throws,
// as PyTorch's NCCL watchdog does. ncclCommInitRank itself waits for every rank without a
// timeout: a rank that dies before it is caught by the controller, which stops the others.
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <type_traits>

#include "backend/cuda/library_search.h"
#include "collective/comm_impl.h"
#include "collective/nccl_api.h"

namespace sr1 {
namespace nccl {
namespace {

// Fills `api` from `lib`; returns the first function it lacks, or null.
const char* resolve_all(void* lib, Api* api) {
  const char* missing = nullptr;
  const auto get = [&](const char* name, auto* fn) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, name));
    if (*fn == nullptr && missing == nullptr) missing = name;
  };
  get("ncclGetVersion", &api->ncclGetVersion);
  get("ncclGetUniqueId", &api->ncclGetUniqueId);
  get("ncclCommInitRank", &api->ncclCommInitRank);
  get("ncclCommDestroy", &api->ncclCommDestroy);
  get("ncclCommAbort", &api->ncclCommAbort);
  get("ncclCommGetAsyncError", &api->ncclCommGetAsyncError);
  get("ncclGetErrorString", &api->ncclGetErrorString);
  get("ncclAllReduce", &api->ncclAllReduce);
  get("ncclReduce", &api->ncclReduce);
  get("ncclAllGather", &api->ncclAllGather);
  return missing;
}

Library search(Api* table) {
  cuda::LibrarySearch what;
  what.names = {"libnccl.so.2", "libnccl.so"};
  what.env = "SEARCHR1_NCCL_PATH";
  what.wheels = {"nccl"};  // nvidia-nccl-cu12 and nvidia-nccl-cu13 alike
  what.none_there = "no libnccl there";
  what.lacking = "(not NCCL 2?)";
  what.resolve = [table](void* lib) {
    Api api{};  // into the table only when complete
    const char* missing = resolve_all(lib, &api);
    if (missing == nullptr) *table = api;
    return missing;
  };
  const cuda::FoundLibrary found = cuda::find_library(what);
  Library loaded;
  if (!found.path.empty()) {
    loaded.api = table;
    loaded.path = found.path;
    return loaded;
  }
  loaded.error = "NCCL could not be loaded (tried libnccl.so.2 and libnccl.so): " + found.notes +
                 ". CUDA ranks need it: install it (pip install nvidia-nccl-cu12, or "
                 "nvidia-nccl-cu13 with CUDA 13, or the system's libnccl2) or set "
                 "SEARCHR1_NCCL_PATH to libnccl.so.2 or its folder";
  return loaded;
}

}  // namespace

const Library& load_nccl() {
  static Api table{};
  static const Library loaded = search(&table);
  return loaded;
}

}  // namespace nccl

namespace {

using Clock = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

class NcclComm final : public Comm {
 public:
  explicit NcclComm(const CommOptions& o) : c_(o) {
    const nccl::Library& lib = nccl::load_nccl();
    if (lib.api == nullptr) throw Error(lib.error);
    api_ = lib.api;
    c_.run("rendezvous", "NCCL's unique id in " + o.rendezvous, 0, [&] {
      const nccl::ncclUniqueId id = unique_id(o);
      cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      check(api_->ncclCommInitRank(&comm_, o.size, id, o.rank), "ncclCommInitRank");
    });
  }

  ~NcclComm() override {
    if (comm_ != nullptr) (aborted_ ? api_->ncclCommAbort : api_->ncclCommDestroy)(comm_);
    if (staging_ != nullptr) cudaFree(staging_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return c_.options().rank; }
  int size() const override { return c_.options().size; }

  void all_reduce_sum(float* x, size_t n, const std::string& what) override {
    if (n == 0) return;
    c_.run("all_reduce", what, n, [&] { reduce(x, n, nccl::ncclFloat32); });
  }

  void all_reduce_sum_host(float* x, size_t n, const std::string& what) override {
    host_sum(x, n, nccl::ncclFloat32, what);
  }
  void all_reduce_sum_host(double* x, size_t n, const std::string& what) override {
    host_sum(x, n, nccl::ncclFloat64, what);
  }

  // In place on the root, as NCCL allows (sendbuff == recvbuff).
  void reduce_sum(float* x, size_t n, int root, const std::string& what) override {
    if (n == 0) return;
    c_.run("reduce", what, n, [&] {
      check(api_->ncclReduce(x, x, n, nccl::ncclFloat32, nccl::ncclSum, root, comm_, stream_),
            "ncclReduce");
      wait();
    });
  }

  // Bytes: an all-gather copies, so any element type travels as ncclUint8.
  void all_gather(void* x, size_t n, size_t elem, const std::string& what) override {
    const size_t bytes = n * elem;
    all_gather_into(static_cast<char*>(x) + static_cast<size_t>(rank()) * bytes, x, n, elem, what);
  }
  void all_gather_into(const void* in, void* out, size_t n, size_t elem,
                       const std::string& what) override {
    if (n == 0) return;
    c_.run("all_gather", what, n * size(), [&] {
      check(api_->ncclAllGather(in, out, n * elem, nccl::ncclUint8, comm_, stream_),
            "ncclAllGather");
      wait();
    });
  }

  // NCCL has no barrier: a one-value all-reduce is one (as torch.distributed does it).
  void barrier(const std::string& what) override {
    float one = 1;
    c_.run("barrier", what, 0, [&] {
      void* d = staging(sizeof(float));
      cuda_check(cudaMemcpyAsync(d, &one, sizeof(float), cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync");
      reduce(d, 1, nccl::ncclFloat32);
    });
  }

 private:
  // Rank 0's id, from the file rank 0 writes in the rendezvous folder.
  nccl::ncclUniqueId unique_id(const CommOptions& o) {
    nccl::ncclUniqueId id{};
    const std::string path = o.rendezvous + "/nccl-unique-id";
    if (o.rank == 0) {
      check(api_->ncclGetUniqueId(&id), "ncclGetUniqueId");
      const std::string tmp = path + ".partial";
      {
        std::ofstream out(tmp, std::ios::binary);
        out.write(id.internal, sizeof(id.internal));
        if (!out) throw Error(tmp + ": cannot write");
      }
      if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error(path + ": cannot rename into place");
      return id;
    }
    const auto deadline = Clock::now() + timeout();
    while (true) {
      std::ifstream in(path, std::ios::binary);
      if (in && in.read(id.internal, sizeof(id.internal))) return id;
      if (Clock::now() > deadline) {
        throw Error("rank 0 wrote no NCCL unique id to " + path + " in time");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(static_cast<long>(c_.options().timeout_s * 1000));
  }

  void check(nccl::ncclResult_t r, const char* what) const {
    if (r != nccl::ncclSuccess && r != nccl::ncclInProgress) {
      throw Error(std::string(what) + ": " + api_->ncclGetErrorString(r));
    }
  }

  // In place on device memory x; waits for it with the timeout.
  void reduce(void* x, size_t n, nccl::ncclDataType_t type) {
    check(api_->ncclAllReduce(x, x, n, type, nccl::ncclSum, comm_, stream_), "ncclAllReduce");
    wait();
  }

  // Waits for the collective just queued on the stream, within the timeout.
  void wait() {
    const auto deadline = Clock::now() + timeout();
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda_check(q, "the NCCL stream");
      nccl::ncclResult_t async = nccl::ncclSuccess;
      check(api_->ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      if (async != nccl::ncclSuccess && async != nccl::ncclInProgress) {
        aborted_ = true;
        throw Error(std::string("NCCL reported ") + api_->ncclGetErrorString(async));
      }
      if (Clock::now() > deadline) {
        aborted_ = true;  // the destructor aborts: the kernel waits for a peer that is not there
        throw Error("timed out after " + std::to_string(c_.options().timeout_s) + " s");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  template <typename T>
  void host_sum(T* x, size_t n, nccl::ncclDataType_t type, const std::string& what) {
    if (n == 0) return;
    c_.run("all_reduce", what, n, [&] {
      void* d = staging(n * sizeof(T));
      cuda_check(cudaMemcpyAsync(d, x, n * sizeof(T), cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync");
      reduce(d, n, type);
      cuda_check(cudaMemcpy(x, d, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    });
  }

  void* staging(size_t bytes) {
    if (bytes > staging_bytes_) {
      if (staging_ != nullptr) cuda_check(cudaFree(staging_), "cudaFree");
      staging_ = nullptr;
      cuda_check(cudaMalloc(&staging_, bytes), "cudaMalloc (NCCL staging)");
      staging_bytes_ = bytes;
    }
    return staging_;
  }

  Collectives c_;
  const nccl::Api* api_ = nullptr;
  nccl::ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<Comm> open_nccl_comm(const CommOptions& o) { return std::make_unique<NcclComm>(o); }

}  // namespace sr1
