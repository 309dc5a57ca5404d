// The trainer's subcommands; each takes the arguments after its name and returns the
// process exit code.
#pragma once
#include <string>
#include <vector>

namespace sr1 {

int cmd_score(const std::vector<std::string>& argv);
int cmd_grad(const std::vector<std::string>& argv);
int cmd_sft(const std::vector<std::string>& argv);
int cmd_info(const std::vector<std::string>& argv);
int cmd_serve(const std::vector<std::string>& argv);
int cmd_plan(const std::vector<std::string>& argv);

}  // namespace sr1
