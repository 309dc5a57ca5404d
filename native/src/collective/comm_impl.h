// What the library communicators (gloo_comm.cpp, nccl_comm.cpp) share with comm.cpp: their
// constructors, and the rule that the first failed collective breaks the communicator.
#pragma once
#include <string>

#include "collective/comm.h"
#include "util/error.h"

namespace sr1 {

// Defined only in builds that have the library (gloo_built(), nccl_built()).
std::unique_ptr<Comm> open_gloo_comm(const CommOptions& o);
std::unique_ptr<Comm> open_nccl_comm(const CommOptions& o);

// "<op> of <what> (<n> values) failed on rank R of N: <cause> (collective timeout T s; ...)"
std::string collective_error(const CommOptions& o, const std::string& op, const std::string& what,
                             size_t n, const std::string& cause);

// Runs one collective after another; the first that throws breaks the communicator: its
// error (collective_error) is thrown, and every later call is refused naming it, since the
// ranks no longer agree on which collective comes next.
class Collectives {
 public:
  explicit Collectives(const CommOptions& o) : o_(o) {}

  template <typename F>
  void run(const char* op, const std::string& what, size_t n, F&& f) {
    if (!failed_.empty()) {
      throw Error(std::string(op) + " of " + what + " refused on rank " + std::to_string(o_.rank) +
                  ": an earlier collective failed (" + failed_ +
                  "), so the ranks are out of step; restart the trainer ranks");
    }
    try {
      f();
    } catch (const std::exception& e) {
      failed_ = collective_error(o_, op, what, n, e.what());
      throw Error(failed_);
    }
  }

  const CommOptions& options() const { return o_; }

 private:
  CommOptions o_;
  std::string failed_;
};

}  // namespace sr1
