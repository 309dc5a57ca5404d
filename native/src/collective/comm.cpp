#include "collective/comm.h"

#include <cmath>
#include <sstream>

#include "collective/comm_impl.h"
#include "util/error.h"

namespace sr1 {

bool gloo_built() {
#ifdef SR1_HAVE_GLOO
  return true;
#else
  return false;
#endif
}

bool nccl_built() {
#ifdef SR1_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::string gloo_missing_message(int size) {
  return "--world-size " + std::to_string(size) +
         ": CPU ranks need Gloo, which this build of the native core lacks; install it "
         "(Debian/Ubuntu: apt-get install libgloo-dev) and rebuild (npm run build:native)";
}

std::string collective_error(const CommOptions& o, const std::string& op, const std::string& what,
                             size_t n, const std::string& cause) {
  std::ostringstream s;
  s << op << " of " << what << " (" << n << " values) failed on rank " << o.rank << " of "
    << o.size << ": " << cause << " (collective timeout " << o.timeout_s
    << " s; another rank died, or stopped before this collective)";
  return s.str();
}

void LocalComm::all_gather_into(const void*, void*, size_t, size_t, const std::string& what) {
  throw Error("all_gather_into of " + what + ": one local rank has nothing to gather from, and "
              "its memory kind (host or device) is the backend's, unknown here");
}

double all_reduce_sum(Comm& comm, double x, const std::string& what) {
  comm.all_reduce_sum_host(&x, 1, what);
  return x;
}

std::unique_ptr<Comm> open_comm(const CommOptions& o, Backend& be) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    throw UsageError("--rank " + std::to_string(o.rank) + " --world-size " +
                     std::to_string(o.size) + ": the rank must be in [0, world size)");
  }
  if (!(o.timeout_s > 0) || !std::isfinite(o.timeout_s)) {
    throw UsageError("--collective-timeout must be a positive number of seconds");
  }
  if (o.library != "auto" && o.library != "gloo" && o.library != "nccl") {
    throw UsageError("--collectives: '" + o.library + "' is not one of auto, gloo, nccl");
  }
  if (o.size == 1 && o.library == "auto") return std::make_unique<LocalComm>();
  if (o.rendezvous.empty()) {
    throw UsageError("--world-size " + std::to_string(o.size) + " --collectives " + o.library +
                     " needs --rendezvous DIR, a folder every rank can write (fresh per run)");
  }
  const bool cuda = be.name() == "cuda";
  const std::string library = o.library != "auto" ? o.library : cuda ? "nccl" : "gloo";
  if ((library == "nccl") != cuda) {
    throw UsageError("--collectives " + library + " does not serve the " + be.name() +
                     " backend (NCCL: cuda, Gloo: cpu)");
  }
  if (library == "nccl") {
#ifdef SR1_HAVE_CUDA
    return open_nccl_comm(o);
#endif
  }
#ifdef SR1_HAVE_GLOO
  return open_gloo_comm(o);
#else
  throw UsageError(gloo_missing_message(o.size));
#endif
}

}  // namespace sr1
