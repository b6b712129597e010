#pragma once

// The body of a rank process: the worker daemon starts one per assigned slot (a child process,
// so a crashing or hung rank cannot take the daemon down) with the assignment in a file.

#include <string>
#include <vector>

#include "common/client_channel.h"

namespace mptrain {

struct RankProcessOptions {
  std::string assignment_file;  // A serialized v1::Assignment.
  std::string coordinator;      // HOST:PORT
  std::string host;             // Address the rank's collective listens on.
  // Resolved roots of the worker: every path of the spec is checked against them before any
  // I/O (see worker/path_policy.h).
  std::vector<std::string> data_roots;
  std::vector<std::string> output_roots;
  ClientSecurity security;
};

// Trains the assigned rank and reports the result. Returns the process exit code: 0 when the
// rank finished and its result was delivered, 1 otherwise (the error was reported if possible).
int RunRankProcess(const RankProcessOptions& options);

}  // namespace mptrain
