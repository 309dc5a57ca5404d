// The trainer of a `train` run as `searchr1-trainer serve` keeps it between commands: the
// policy, the frozen reference policy and the critic, and the learners that train them.
// Each command of the protocol (SERVE.md beside this file) is one call of handle_command(). A field
// left out takes the default of the struct it fills (AdamWConfig, LrSchedule, MiniBatching,
// PpoConfig, CriticUpdateOptions, RunOptions), but for the peak learning rates below.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"
#include "collective/comm.h"
#include "model/qwen2.h"
#include "train/learner.h"
#include "util/json_fields.h"

namespace sr1 {

// `lr` of load's actor_optim and critic_optim when absent: verl's, the actor's ten times
// below the critic's.
constexpr float kActorLr = 1e-6f, kCriticLr = 1e-5f;

struct TrainerSession {
  Backend& be;
  // The data-parallel ranks (LocalComm for one): each command reaches every rank, which
  // works on its share of the batch's rows (train/data_parallel.h); SERVE.md says how.
  Comm& comm;
  RunOptions run;  // the command line's; log_probs and update_actor set their temperature
  std::string policy_dir, critic_dir;
  std::unique_ptr<Qwen2Model> policy, reference, critic;
  std::unique_ptr<Learner> actor, critic_learner;
  // The reference waits in host memory between its log_probs (load's reference_offload).
  bool reference_offload = false;
  // Where this rank runs on several nodes (serve's --node, --local-rank): export's
  // node_outs has each node's first rank write that node's copy.
  int node = 0, local_rank = 0;

  void reset();  // learners first: they release into the backend before the models go
  Qwen2Model& model(const std::string& which);  // "policy" or "reference"
  Learner& actor_learner();
  Learner& critic_of();
};

// One command (`shutdown` is the caller's loop's): checks its fields, runs it and returns
// the reply's fields. Throws sr1::Error naming the field or file.
json::Value handle_command(TrainerSession& s, const std::string& op, const JsonFields& f);

}  // namespace sr1
