#pragma once

// Starts, stops and reaps rank processes. Each rank is a child process in its own process
// group that dies with the daemon (PR_SET_PDEATHSIG), so no rank outlives its worker.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mptrain {

struct ExitedChild {
  pid_t pid = 0;
  int exit_code = 0;    // When it exited normally.
  int term_signal = 0;  // When a signal ended it.
};

class RankLauncher {
 public:
  // Runs `argv` (argv[0] is the executable) with extra environment entries "KEY=VALUE", its
  // stdout and stderr on `output_fd` and its stdin on `input_fd` when >= 0 (the caller closes
  // its copies after). INTERNAL with errno text when fork fails.
  static absl::StatusOr<pid_t> Launch(const std::vector<std::string>& argv,
                                      const std::vector<std::string>& extra_env,
                                      int output_fd = -1, int input_fd = -1);
  // Signals the child's whole process group.
  static void Signal(pid_t pid, int signal);
  // Children that ended since the last call (non-blocking).
  static std::vector<ExitedChild> Reap();
};

}  // namespace mptrain
