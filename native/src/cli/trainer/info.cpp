// searchr1-trainer info: what `--device auto` would pick and why, for people and for the
// test suite (which runs its GPU tests only when CUDA is usable).
#include <cstdio>

#include "backend/backend.h"
#include "cli/common.h"
#include "cli/trainer/commands.h"
#include "collective/comm.h"
#include "util/json.h"

namespace sr1 {

int cmd_info(const std::vector<std::string>& argv) {
  const Args args("searchr1-trainer info",
                  "Prints one JSON line: {\"cuda\": {\"built\", \"available\", \"reason\", \"gpu\",\n"
                  "\"cublaslt\"}, \"ranks\": {\"gloo\", \"nccl\"}}. built: compiled with nvcc;\n"
                  "available: a GPU is visible and cuBLASLt loaded; reason: why not. ranks: whether\n"
                  "serve --world-size > 1 is built for CPU ranks (Gloo) and CUDA ranks (NCCL,\n"
                  "loaded when they start).",
                  {}, argv, {"searchr1-trainer info"});
  if (print_help(args)) return 0;
  const CudaStatus s = cuda_status();
  const json::Value cuda = json::Value::object({{"built", s.built},
                                                {"available", s.available},
                                                {"reason", s.reason},
                                                {"gpu", s.gpu},
                                                {"cublaslt", s.cublaslt}});
  const json::Value ranks = json::Value::object({{"gloo", gloo_built()}, {"nccl", nccl_built()}});
  std::printf("%s\n", json::Value::object({{"cuda", cuda}, {"ranks", ranks}}).dump().c_str());
  return 0;
}

}  // namespace sr1
