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
  // it as its process title, worker/process_title.h), and with "" when it is kept for the next
  // job after one. Optional.
  std::function<void(const std::string& assignment_file)> on_assignment;
};

// Trains the assigned rank and reports the result. Returns the process exit code: 0 when the
// rank finished and its result was delivered, 1 otherwise (the error was reported if possible).
int RunRankProcess(const RankProcessOptions& options);

// The jobs one warm rank process runs at most before it exits (a fresh one takes its slot):
// bounds what slow leaks (fragmentation, a library's caches) can add up to.
inline constexpr int kMaxJobsPerRankProcess = 100;

// A warm rank process (worker/standby_ranks.h): sets up `device_index` of `device` (the
// backend's warm_up), then reads the path of an assignment file from `input_fd` (one line, at
// most PATH_MAX bytes, with the job's output pipe attached) and runs it as RunRankProcess
// would, its output on that pipe. End of file with no path: the daemon has no job for it;
// exits 0. With `reuse`, a job that ended cleanly (exit code 0, not stopped) is followed by
// "done 0\n" on `input_fd` once its memory is released, and the process waits for the next
// path (at most kMaxJobsPerRankProcess jobs); otherwise it exits with the job's exit code.
int RunStandbyRankProcess(RankProcessOptions options, v1::DeviceKind device, int device_index,
                          int input_fd, bool reuse);

}  // namespace mptrain
