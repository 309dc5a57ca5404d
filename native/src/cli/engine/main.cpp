// searchr1-engine: the native inference engine behind `searchr1 serve-engine`. It reads
// commands from stdin and writes events to stdout, one JSON object per line; the protocol
// is in engine/PROTOCOL.md, its commands are handled by engine/server.h, and the KV cache is
// sized by engine/kv_budget.h. Here: the options and the loop that feeds stdin to the server.
#include <omp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/common.h"
#include "engine/engine.h"
#include "engine/kv_budget.h"
#include "engine/server.h"
#include "util/error.h"
#include "util/json.h"

namespace sr1 {
namespace {

// The defaults shown are EngineOptions', which run() reads too.
std::vector<OptionSpec> engine_options() {
  const EngineOptions d;
  return concat(
      {{"model", "DIR", "Hugging Face model folder (required)"},
       {"context-length", "N", "longest prompt + output (default: max_position_embeddings)"},
       {"kv-cache-mb", "MB", "KV cache memory (default: a quarter of free RAM, or 80% of "
                             "free GPU memory, at most what --max-running full contexts need)"},
       {"gpu-memory-utilization", "U",
        "on a GPU without --kv-cache-mb: the engine's share of the GPU's memory, weights and "
        "KV cache together (vLLM's meaning); no effect on the CPU"},
       {"max-running", "N",
        "most sequences in one step (default " + std::to_string(d.max_running) + ")"},
       {"chunk-tokens", "N",
        "most prompt tokens prefilled per step (default " +
            std::to_string(EngineOptions::kCpuChunkTokens) + " on the CPU, " +
            std::to_string(EngineOptions::kGpuChunkTokens) + " on a GPU)"},
       {"enforce-eager", "",
        "on a GPU, run every step op by op instead of replaying CUDA graphs of the decode "
        "steps (vLLM's enforce_eager)"},
       profile_option()},
      device_options());
}

// The EOS ids generation stops at: generation_config.json's eos_token_id (a number or a
// list) when the folder has one, else config.json's.
std::vector<int32_t> read_eos_ids(const std::string& dir) {
  for (const char* name : {"/generation_config.json", "/config.json"}) {
    const std::string path = dir + name;
    if (access(path.c_str(), R_OK) != 0) continue;
    const json::Value root = json::parse_file(path);
    const json::Value* eos = root.find("eos_token_id");
    if (eos == nullptr || eos->is_null()) continue;
    std::vector<int32_t> ids;
    if (eos->is_integer()) ids.push_back(static_cast<int32_t>(eos->as_int()));
    if (eos->is_array()) {
      for (const json::Value& v : eos->as_array()) {
        if (!v.is_integer()) throw Error(path + ": field 'eos_token_id' must hold integers");
        ids.push_back(static_cast<int32_t>(v.as_int()));
      }
    }
    if (ids.empty()) throw Error(path + ": field 'eos_token_id' must be an integer or a list");
    return ids;
  }
  return {};
}

void emit(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
}

// Lines from stdin; waits for one only when `block` is set. Returns false at end of input.
class LineReader {
 public:
  bool read(std::vector<std::string>& lines, bool block) {
    pollfd pfd{STDIN_FILENO, POLLIN, 0};
    int ready = poll(&pfd, 1, block ? -1 : 0);
    if (ready < 0) {
      if (errno == EINTR) return true;
      throw Error(std::string("reading stdin: ") + std::strerror(errno));
    }
    if (ready == 0) return true;
    char buf[1 << 16];
    const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) return true;
    if (n <= 0) return false;
    partial_.append(buf, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = partial_.find('\n', start)) != std::string::npos) {
      if (nl > start) lines.push_back(partial_.substr(start, nl - start));
      start = nl + 1;
    }
    partial_.erase(0, start);
    return true;
  }

 private:
  std::string partial_;
};

int run(const std::vector<std::string>& argv) {
  const Args args("searchr1-engine",
                  "serves generation over stdin/stdout (JSON lines; see engine/PROTOCOL.md)",
                  engine_options(), argv);
  if (print_help(args)) return 0;
  const std::string dir = args.required("model");
  install_interrupt_handler();
  std::unique_ptr<Backend> backend = open_backend(args);
  std::unique_ptr<Qwen2Model> model = Qwen2Model::load(dir, *backend);
  // The engine never trains: on a GPU it keeps the bf16 compute copy alone, not fp32 masters
  // beside it (weight updates are converted into the compute copy as they load).
  model->drop_masters();

  EngineOptions opt;
  opt.context_length = args.has("context-length")
                           ? static_cast<int>(args.integer("context-length", 0, 2))
                           : read_max_positions(dir);
  opt.max_running = static_cast<int>(args.integer("max-running", opt.max_running, 1));
  const int device_chunk = backend->name() == "cpu" ? EngineOptions::kCpuChunkTokens
                                                    : EngineOptions::kGpuChunkTokens;
  opt.chunk_tokens = static_cast<int>(args.integer("chunk-tokens", device_chunk, 1));
  opt.graphs = !args.flag("enforce-eager");
  constexpr int kBlockSize = Engine::kBlockSize;
  const size_t step_bytes =
      Engine::largest_step_bytes(model->config(), backend->x_elem(), opt, kBlockSize);
  KvBudget budget;
  if (args.has("kv-cache-mb")) budget.cache_mb = args.number("kv-cache-mb", 0);
  if (args.has("gpu-memory-utilization")) {
    budget.gpu_memory_utilization = args.number("gpu-memory-utilization", 0);
  }
  budget.context = opt.context_length;
  budget.max_running = opt.max_running;
  budget.block_size = kBlockSize;
  budget.step_bytes = step_bytes;
  const int blocks = kv_blocks_for(budget, *backend, model->config());
  const std::vector<int32_t> eos = read_eos_ids(dir);
  Engine engine(*model, blocks, kBlockSize, eos, opt);
  EngineServer server(*model, engine, emit);

  json::Value eos_json = json::Value::array();
  for (int32_t id : eos) eos_json.push(json::Value(static_cast<int64_t>(id)));
  emit(json::Value::object({{"ev", "ready"},
                            {"model_path", dir},
                            {"vocab_size", model->config().vocab_size},
                            {"context_length", opt.context_length},
                            {"block_size", kBlockSize},
                            {"kv_blocks", blocks},
                            {"eos_token_ids", eos_json},
                            {"device", backend->name()},
                            {"threads", omp_get_max_threads()},
                            {"max_running", opt.max_running},
                            {"chunk_tokens", opt.chunk_tokens},
                            {"graphs", opt.graphs && backend->can_capture()},
                            {"step_buffer_bytes", static_cast<int64_t>(step_bytes)},
                            {"weight_version", server.version()}})
           .dump());
  std::fflush(stdout);
  std::fprintf(stderr, "searchr1-engine: %s on %s, %d KV blocks of %d tokens, context %d\n",
               dir.c_str(), backend->name().c_str(), blocks, kBlockSize, opt.context_length);

  LineReader reader;
  std::vector<std::string> lines;
  bool idle = true;
  double step_ms = 0;  // the host's time in steps, for --profile
  restart_profile(*backend);
  const auto stop = [&](int code) {
    std::fflush(stdout);
    print_profile(*backend, step_ms);
    return code;
  };
  for (;;) {
    lines.clear();
    if (!reader.read(lines, idle) || interrupted()) {
      server.abort_all();
      return stop(interrupted() ? 130 : 0);
    }
    for (const std::string& line : lines) {
      if (!server.handle(line)) return stop(0);
    }
    // Wait for input only when a step cannot make progress (nothing runnable).
    const auto start = std::chrono::steady_clock::now();
    idle = !server.step();
    step_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                   .count();
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace sr1

int main(int argc, char** argv) {
  sr1::ensure_thread_policy(argv, /*blas_threads_sleep=*/false);
  try {
    return sr1::run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const sr1::UsageError& e) {
    std::fprintf(stderr, "searchr1-engine: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "searchr1-engine: error: %s\n", e.what());
    return 1;
  }
}
