// What the three executables' command lines share (searchr1-trainer, searchr1-engine,
// searchr1-index): the thread policy set before main runs, --device and --threads, help,
// Ctrl-C, and the JSON-lines loop of a `serve` command.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/args.h"
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
// Sets the thread count (OpenMP and OpenBLAS) when --threads is given.
void set_threads(const Args& args);
// set_threads, then creates the backend --device names (profiled with --profile).
std::unique_ptr<Backend> open_backend(const Args& args);
// --profile, for the commands that print the table (print_profile) when they end.
OptionSpec profile_option();
// With --profile, starts the table afresh: call it when loading is done.
void restart_profile(Backend& backend);
// With --profile, prints the device time of each backend operation to stderr; `wall_ms` is
// the host's time over the same work (0 when the caller has none).
void print_profile(const Backend& backend, double wall_ms);

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

}  // namespace sr1
