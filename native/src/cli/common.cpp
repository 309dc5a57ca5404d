#include "cli/common.h"

#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "backend/profiled_backend.h"
#include "backend/sgemm.h"
#include "util/error.h"
#include "util/json.h"

namespace sr1 {

void ensure_thread_policy(char** argv, bool blas_threads_sleep) {
  bool changed = false;
  const auto set_default = [&changed](const char* name, const char* value) {
    if (std::getenv(name) != nullptr) return;
    setenv(name, value, 1);
    changed = true;
  };
  set_default("OMP_WAIT_POLICY", "PASSIVE");
  if (blas_threads_sleep) set_default("OPENBLAS_THREAD_TIMEOUT", "4");
  if (changed) execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
}

std::vector<OptionSpec> device_options() {
  return {{"device", "auto|cpu|cuda", "where to run (default auto: cuda when usable, else cpu)"},
          {"threads", "N", "CPU threads (default: all cores)"}};
}

void set_threads(const Args& args) {
  if (!args.has("threads")) return;
  const int n = static_cast<int>(args.integer("threads", 0, 1));
  omp_set_num_threads(n);
  set_sgemm_threads(n);
}

std::unique_ptr<Backend> open_backend(const Args& args) {
  set_threads(args);
  std::unique_ptr<Backend> backend = make_backend(args.text("device", "auto"));
  if (args.flag("profile")) return std::make_unique<ProfiledBackend>(std::move(backend));
  return backend;
}

OptionSpec profile_option() {
  return {"profile", "",
          "time every backend operation on the device (CUDA events on a GPU) and print the "
          "table to stderr at the end"};
}

void restart_profile(Backend& backend) {
  if (auto* profiled = dynamic_cast<ProfiledBackend*>(&backend)) profiled->restart();
}

void print_profile(const Backend& backend, double wall_ms) {
  const auto* profiled = dynamic_cast<const ProfiledBackend*>(&backend);
  if (profiled == nullptr) return;
  std::fputs(profiled->report(wall_ms).c_str(), stderr);
  std::fflush(stderr);
}

bool print_help(const Args& args) {
  if (args.help_requested()) std::fputs(args.usage().c_str(), stdout);
  return args.help_requested();
}

std::vector<OptionSpec> concat(std::vector<OptionSpec> a, const std::vector<OptionSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

namespace {
std::atomic<bool> g_interrupted{false};
extern "C" void on_signal(int) { g_interrupted = true; }
}  // namespace

bool interrupted() { return g_interrupted; }

void install_interrupt_handler() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
}

int serve_json_lines(const CommandHandler& handle) {
  // A request can be a 1 MB line (64 query vectors): read it in blocks, not a character at
  // a time through C stdio (the default sync costs more than a search on a small index).
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    json::Value id;
    json::Value r;
    try {
      const json::Value cmd = json::parse(line);
      if (!cmd.is_object()) throw Error("a command must be a JSON object");
      if (const json::Value* v = cmd.find("id")) id = *v;
      const JsonFields f(cmd);
      const std::string op = f.text("op");
      if (op == "shutdown") {
        std::cout << json::Value::object({{"id", id}, {"ok", true}}).dump() << std::endl;
        return 0;
      }
      r = handle(op, f);
      r.set("ok", true);
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      r = json::Value::object({{"ok", false}, {"error", e.what()}});
    }
    r.set("id", id);
    std::cout << r.dump() << std::endl;
  }
  return 0;
}

}  // namespace sr1
