// Pieces the trainer's subcommands share: device/thread options, run options, and the
// output folder that only appears once complete.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/args.h"
#include "io/safetensors.h"
#include "model/batch.h"
#include "model/qwen2.h"
#include "util/json_fields.h"

namespace sr1 {

// OpenMP threads that spin after each parallel region steal the cores OpenBLAS's own
// threads need for the next matmul (measured: a training step 2-4x slower on 2 cores).
// OpenBLAS's threads spin too (sched_yield, for up to 2^28 cycles after each call) and take
// cores from the OpenMP regions between matmuls: with `blas_threads_sleep` they sleep right
// after a call (OPENBLAS_THREAD_TIMEOUT=4: 2^4 cycles), which made an RL update 10 % faster;
// the engine leaves them spinning, as its decode makes hundreds of small calls a token and
// waking a sleeping thread for each halved its batch-1 speed. Both libraries read their
// variables when they load, before main, so this sets the missing ones and re-executes the
// program; call it first thing in main. Variables the user set are left as they are.
void ensure_thread_policy(char** argv, bool blas_threads_sleep);

// --device, --threads
std::vector<OptionSpec> device_options();
// Sets the thread count (OpenMP and OpenBLAS) and creates the backend.
std::unique_ptr<Backend> open_backend(const Args& args);

// --logits-chunk, --recompute (the latter only where a backward pass runs)
std::vector<OptionSpec> run_options(bool backward);
RunOptions read_run_options(const Args& args);

// What score and grad share: --model, --batch, --out, the run and device options, and the
// model and batch they load.
std::vector<OptionSpec> batch_command_options(const std::string& batch_help, bool backward);
struct BatchCommand {
  std::unique_ptr<Backend> backend;  // declared first: the model releases into it
  std::unique_ptr<Qwen2Model> model;
  std::unique_ptr<SafetensorsFile> file;
  Batch batch;
  RunOptions run;
  std::string out;
};
BatchCommand open_batch_command(const Args& args);

// Prints the usage and returns true when --help was given.
bool print_help(const Args& args);

// Appends specs to a list (for building option tables from shared parts).
std::vector<OptionSpec> concat(std::vector<OptionSpec> a, const std::vector<OptionSpec>& b);

// The loop of a `serve` command (searchr1-trainer serve, searchr1-index serve): one JSON
// command per line on stdin, one reply per line on stdout, `{..., "ok": true, "id"}` or
// `{"ok": false, "error", "id"}` (id echoed as sent, null when missing or unreadable). A
// refused command never stops the loop; out of memory does. `shutdown` or the end of stdin
// returns 0.
using CommandHandler = std::function<json::Value(const std::string& op, const JsonFields& f)>;
int serve_json_lines(const CommandHandler& handle);

// Set by SIGINT/SIGTERM; long loops check it and stop with Interrupted.
bool interrupted();
void install_interrupt_handler();
struct Interrupted {};

// A Hugging Face output folder built at `<path>.partial-<pid>` and renamed to `path` by
// commit(); removed if destroyed before. An existing `path` (other than an empty folder) is
// a UsageError unless overwrite is set; it is then replaced only by commit().
class OutputFolder {
 public:
  OutputFolder(std::string path, bool overwrite);
  ~OutputFolder();
  const std::string& dir() const { return partial_; }
  // Copies config.json, tokenizer and generation files (not weights) from `model_dir`.
  void copy_model_files(const std::string& model_dir);
  void commit();

 private:
  std::string path_, partial_;
  bool overwrite_, done_ = false;
};

// Fills `out` with a Hugging Face folder of the model: config.json (its dtype field set to
// `dtype`), the tokenizer and generation files of `source_dir`, and the weights in `dtype`.
void write_hf_model(OutputFolder& out, Qwen2Model& model, const std::string& source_dir,
                    DType dtype, uint64_t max_shard_bytes);

}  // namespace sr1
