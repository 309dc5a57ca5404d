#include "cli/common.h"

#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "backend/sgemm.h"
#include "util/error.h"
#include "util/json.h"

namespace fs = std::filesystem;

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

std::unique_ptr<Backend> open_backend(const Args& args) {
  if (args.has("threads")) {
    const int n = static_cast<int>(args.integer("threads", 0, 1));
    omp_set_num_threads(n);
    set_sgemm_threads(n);
  }
  return make_backend(args.text("device", "auto"));
}

std::vector<OptionSpec> run_options(bool backward) {
  std::vector<OptionSpec> specs = {
      {"logits-chunk", "N", "token rows per vocabulary-sized logits block (default 256)"},
      {"temperature", "T", "divide the logits by T before the softmax, as verl does (default 1)"}};
  if (backward) {
    specs.push_back({"recompute", "", "recompute layer activations in backward (less memory)"});
  }
  return specs;
}

RunOptions read_run_options(const Args& args) {
  RunOptions opt;
  opt.logits_chunk = static_cast<int>(args.integer("logits-chunk", opt.logits_chunk, 1));
  opt.recompute = args.flag("recompute");
  opt.temperature = static_cast<float>(args.number("temperature", 1.0));
  if (!(opt.temperature > 0)) throw UsageError("--temperature must be > 0");
  return opt;
}

std::vector<OptionSpec> batch_command_options(const std::string& batch_help, bool backward) {
  return concat(concat({{"model", "DIR", "Hugging Face model folder (required)"},
                        {"batch", "IN", batch_help + " (required)"},
                        {"out", "OUT", "output safetensors file (required)"}},
                       run_options(backward)),
                device_options());
}

BatchCommand open_batch_command(const Args& args) {
  BatchCommand c;
  const std::string model_dir = args.required("model"), in = args.required("batch");
  c.out = args.required("out");
  c.run = read_run_options(args);
  c.backend = open_backend(args);
  c.model = Qwen2Model::load(model_dir, *c.backend);
  c.file = SafetensorsFile::open(in);
  c.batch = read_batch(*c.file, c.model->config().vocab_size);
  return c;
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

OutputFolder::OutputFolder(std::string path, bool overwrite)
    : path_(std::move(path)), overwrite_(overwrite) {
  while (!path_.empty() && path_.size() > 1 && path_.back() == '/') path_.pop_back();
  // The rule every searchr1 command follows: an existing output (anything but an empty
  // folder) is a usage error naming it and --overwrite.
  std::error_code probe;
  const bool empty_dir = fs::is_directory(path_, probe) && fs::is_empty(path_, probe) && !probe;
  if (fs::exists(path_) && !empty_dir && !overwrite_) {
    throw UsageError(path_ + ": already exists; pass --overwrite to replace it");
  }
  partial_ = path_ + ".partial-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(partial_, ec);
  if (!fs::create_directories(partial_, ec) || ec) {
    throw Error(partial_ + ": cannot create folder: " + ec.message());
  }
}

OutputFolder::~OutputFolder() {
  if (done_) return;
  std::error_code ec;
  fs::remove_all(partial_, ec);
}

void OutputFolder::copy_model_files(const std::string& model_dir) {
  for (const fs::directory_entry& e : fs::directory_iterator(model_dir)) {
    const std::string name = e.path().filename().string();
    const bool weights = name.find(".safetensors") != std::string::npos ||
                         name.find(".bin") != std::string::npos ||
                         name.find(".pt") != std::string::npos;
    if (!e.is_regular_file() || weights) continue;
    std::error_code ec;
    fs::copy_file(e.path(), fs::path(partial_) / name, ec);
    if (ec) throw Error(e.path().string() + ": cannot copy: " + ec.message());
  }
}

static const char* torch_dtype_name(DType d) {
  return d == DType::F32 ? "float32" : d == DType::BF16 ? "bfloat16" : "float16";
}

// The copied config.json names the dtype the weights were saved in, under the key(s) it
// already has: `dtype` (transformers 5), `torch_dtype` (4.x), or torch_dtype when neither.
// A critic's says what transformers needs to load it: a token-classification model with one
// label (AutoModelForTokenClassification, as verl's critic).
static void write_config(const std::string& dir, DType dtype, const ModelConfig& c, Head head) {
  const std::string path = dir + "/config.json";
  json::Value config = json::parse_file(path);
  const bool has_dtype = config.find("dtype") != nullptr;
  if (has_dtype) config.set("dtype", json::Value(torch_dtype_name(dtype)));
  if (!has_dtype || config.find("torch_dtype") != nullptr) {
    config.set("torch_dtype", json::Value(torch_dtype_name(dtype)));
  }
  if (head == Head::Value) {
    const std::string arch = c.model_type == "llama" ? "LlamaForTokenClassification"
                                                     : "Qwen2ForTokenClassification";
    config.set("architectures", json::Value::array({json::Value(arch)}));
    config.set("id2label", json::Value::object({{"0", "LABEL_0"}}));
    config.set("label2id", json::Value::object({{"LABEL_0", 0}}));
    config.set("classifier_dropout", 0.0);
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw Error(path + ": cannot write");
  const std::string text = config.dump_pretty() + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw Error(path + ": cannot write");
}

void write_hf_model(OutputFolder& out, Qwen2Model& model, const std::string& source_dir,
                    DType dtype, uint64_t max_shard_bytes) {
  out.copy_model_files(source_dir);
  write_config(out.dir(), dtype, model.config(), model.head_kind());
  model.save_weights(out.dir(), dtype, max_shard_bytes);
}

void OutputFolder::commit() {
  std::error_code ec;
  if (fs::exists(path_)) {
    const std::string old = path_ + ".old-" + std::to_string(::getpid());
    fs::rename(path_, old, ec);
    if (!ec) fs::rename(partial_, path_, ec);
    if (!ec) fs::remove_all(old, ec);
  } else {
    fs::rename(partial_, path_, ec);
  }
  if (ec) throw Error(path_ + ": cannot move the finished folder into place: " + ec.message());
  done_ = true;
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
