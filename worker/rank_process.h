#pragma once

// The body of a rank process: the worker daemon starts one per assigned slot (a child process,
// so a crashing or hung rank cannot take the daemon down) with the assignment in a file.

#include <functional>
#include <string>
#include <vector>

#include "common/client_channel.h"
#include "proto/mptrain.pb.h"

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
  // A warm rank process calls this with its assignment file's path when it gets one (to show
  // it as its process title, worker/process_title.h). Optional.
  std::function<void(const std::string& assignment_file)> on_assignment;
};

// Trains the assigned rank and reports the result. Returns the process exit code: 0 when the
// rank finished and its result was delivered, 1 otherwise (the error was reported if possible).
int RunRankProcess(const RankProcessOptions& options);

// A warm rank process (worker/standby_ranks.h): sets up `device_index` of `device` (the
// backend's warm_up), then reads the path of its assignment
// file from `input_fd` (one line, at most PATH_MAX bytes, until end of file) and runs it as
// RunRankProcess would. End of file with no path: the daemon has no job for it; exits 0.
int RunStandbyRankProcess(RankProcessOptions options, v1::DeviceKind device, int device_index,
                          int input_fd);

}  // namespace mptrain
