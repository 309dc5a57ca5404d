// searchr1-trainer serve: the long-lived trainer that `train` drives. Commands arrive as
// JSON lines on stdin, one reply per command on stdout; tensors travel in safetensors
// files. The session and its commands are train/session.h; the protocol is train/SERVE.md.
#include <memory>

#include "cli/common.h"
#include "cli/trainer/commands.h"
#include "cli/trainer/options.h"
#include "collective/comm.h"
#include "train/session.h"

namespace sr1 {

namespace {

// --rank, --world-size, --rendezvous, --host, --node, --local-rank, --collectives,
// --collective-timeout: the data-parallel ranks.
std::vector<OptionSpec> rank_options() {
  const CommOptions d;
  return {{"rank", "R", "this process's rank, 0 to world size - 1 (default 0)"},
          {"world-size", "N",
           "trainer ranks of the run, data-parallel: every command goes to every rank, each "
           "takes its share of the rows (default 1)"},
          {"rendezvous", "DIR",
           "a fresh folder the ranks meet in (on several nodes, one they all mount); required "
           "with --world-size > 1"},
          {"host", "ADDR",
           "the address this rank's Gloo connections listen on, one the other nodes reach "
           "(default " + d.host + ": one node)"},
          {"node", "N",
           "the node this rank runs on, 0 to nodes - 1 (default 0): with --local-rank, which "
           "rank writes the node's copy of an export given node_outs"},
          {"local-rank", "L", "this rank's place among its node's ranks (default 0)"},
          {"collectives", "LIB",
           "auto (one rank: none; more: NCCL on cuda, Gloo on cpu), gloo or nccl (that "
           "library even for one rank, as a check of its calls)"},
          {"collective-timeout", "S",
           "seconds a collective waits for the other ranks before it fails (default " +
               number_text(d.timeout_s) + ")"}};
}

CommOptions read_rank_options(const Args& args) {
  CommOptions o;
  o.size = static_cast<int>(args.integer("world-size", o.size, 1));
  o.rank = static_cast<int>(args.integer("rank", o.rank, 0));
  o.rendezvous = args.text("rendezvous", o.rendezvous);
  o.host = args.text("host", o.host);
  o.library = args.text("collectives", o.library);
  o.timeout_s = args.number("collective-timeout", o.timeout_s);
  return o;
}

}  // namespace

int cmd_serve(const std::vector<std::string>& argv) {
  const Args args("searchr1-trainer serve",
                  "Runs as the trainer of a `train` run: JSON commands on stdin, one JSON reply\n"
                  "per command on stdout (protocol: native/src/train/SERVE.md). With\n"
                  "--world-size N it is one of N data-parallel ranks that get the same commands.",
                  concat(concat(run_options(true), device_options()),
                         concat(rank_options(),
                                {{"profile", "",
                                  "time every backend operation on the device (CUDA events on "
                                  "a GPU); the `profile` command returns the times"}})),
                  argv,
                  {"echo '{\"op\":\"shutdown\",\"id\":1}' | searchr1-trainer serve --threads 2"});
  if (print_help(args)) return 0;
  const CommOptions ranks = read_rank_options(args);
  const std::unique_ptr<Backend> backend = open_backend(args);
  // Before the first command: the ranks meet here (or fail, naming the rendezvous folder).
  const std::unique_ptr<Comm> comm = open_comm(ranks, *backend);
  TrainerSession s{*backend, *comm, read_run_options(args), "", "", nullptr, nullptr,
                   nullptr, nullptr, nullptr};
  s.node = static_cast<int>(args.integer("node", 0, 0));
  s.local_rank = static_cast<int>(args.integer("local-rank", 0, 0));
  return serve_json_lines([&s](const std::string& op, const JsonFields& f) {
    return handle_command(s, op, f);
  });
}

}  // namespace sr1
