// searchr1-trainer: the native trainer executable. Subcommands are in cli/trainer/<name>.cpp.

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/common.h"
#include "cli/trainer/commands.h"
#include "util/error.h"

namespace {

const char* kUsage =
    "Usage: searchr1-trainer <command> [options]\n"
    "\n"
    "Commands:\n"
    "  score   per-token log-probs and entropies of a batch of sequences\n"
    "  grad    loss and parameter gradients of a token-weighted objective\n"
    "  sft     supervised next-token training with AdamW; saves a Hugging Face folder\n"
    "  info    whether the CUDA backend is built and usable here, as JSON\n"
    "  serve   the long-lived trainer a `train` run drives (JSON lines on stdin/stdout)\n"
    "  plan    the device bytes the trainer and engine would allocate for a model, as JSON\n"
    "\n"
    "Run 'searchr1-trainer <command> --help' for a command's options.\n"
    "\n"
    "Examples:\n"
    "  $ searchr1-trainer info\n"
    "  $ searchr1-trainer score --model models/Qwen2.5-0.5B-Instruct --batch batch.safetensors "
    "--out scores.safetensors\n"
    "  $ searchr1-trainer sft --model models/Qwen2.5-0.5B-Instruct --data sft.safetensors --out "
    "runs/sft/model --steps 20\n";

}  // namespace

int main(int argc, char** argv) {
  sr1::ensure_thread_policy(argv, /*blas_threads_sleep=*/true);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  try {
    if (command == "score") return sr1::cmd_score(rest);
    if (command == "grad") return sr1::cmd_grad(rest);
    if (command == "sft") return sr1::cmd_sft(rest);
    if (command == "info") return sr1::cmd_info(rest);
    if (command == "serve") return sr1::cmd_serve(rest);
    if (command == "plan") return sr1::cmd_plan(rest);
    throw sr1::UsageError("unknown command '" + command +
                          "' (score, grad, sft, info, serve, plan)");
  } catch (const sr1::Interrupted&) {
    std::fputs("searchr1-trainer: interrupted; nothing was saved\n", stderr);
    return 130;
  } catch (const sr1::UsageError& e) {
    std::fprintf(stderr, "searchr1-trainer: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "searchr1-trainer: error: %s\n", e.what());
    return 1;
  }
}
