#pragma once

// Warm rank processes ("standbys"): one per slot, started before any assignment, so that a
// job's rank skips what makes a rank slow to start (process start, loading the CUDA libraries,
// the device's context, cuBLAS) and begins with its rendezvous. A standby waits on its stdin
// (a socket only the daemon holds) for the path of an assignment file, then runs that one rank
// exactly as a cold-started rank would, and exits: its process ending releases the job's
// memory, host and device, so nothing of one job is left for the next. The daemon starts the
// slot's next standby once a rank of that slot has exited.
//
// Bounded: at most one standby per slot; a slot whose standbys die before they get a job
// kMaxStandbyDeaths times in a row (each replaced only when a rank of that slot has exited)
// gets no more, and its ranks start cold.
//
// Every standby is forked by one thread that this object owns until it is destroyed:
// PR_SET_PDEATHSIG (worker/rank_launcher.h) fires when the *thread* that forked a child ends,
// so a standby forked by a short-lived or early-joined thread (the daemon's reaper) would be
// killed, its job with it, the moment that thread ended.

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "worker/rank_log.h"

namespace mptrain {

class StandbyRanks {
 public:
  static constexpr int kMaxStandbyDeaths = 3;

  // Starts a standby for `slot` with stdin on `input_fd` and stdout/stderr on `output_fd`
  // (RankLauncher::Launch with the standby's command line).
  using Launch = std::function<absl::StatusOr<pid_t>(int slot, int input_fd, int output_fd)>;
  using Clock = std::function<int64_t()>;  // Milliseconds, for "warm for N ms" in logs.

  StandbyRanks(Launch launch, Clock now_ms);
  ~StandbyRanks();  // Kills the standbys still waiting (they have no job to lose).
  StandbyRanks(const StandbyRanks&) = delete;
  StandbyRanks& operator=(const StandbyRanks&) = delete;

  // Starts a standby for `slot` unless it has one (or gave up on it), on the launcher thread;
  // returns once it is started (not warm: that goes on in the standby).
  void Ensure(int slot);

  struct Handed {
    pid_t pid = 0;
    std::shared_ptr<RankLogTap> log;  // Its output since it started (its warm-up lines).
    int64_t warm_for_ms = 0;          // How long it had been waiting.
  };
  // Gives `assignment_file` to the slot's standby, which then runs it as a rank and is no
  // longer a standby. Nothing when the slot has none or it is gone (the caller starts the rank
  // cold; the dead standby is reaped as usual).
  std::optional<Handed> Hand(int slot, const std::string& assignment_file);

  // For a child the daemon reaped: true when it was a standby (forgotten now; a death counts
  // against its slot unless it was being stopped).
  bool Forget(pid_t pid, int exit_code, int term_signal);

  // Kills every standby without stopping (their deaths do not count against their slots);
  // the caller then Ensures the idle slots, which start new ones with what the launch gives
  // now (a changed advertised address).
  void Renew();
  // SIGKILL to every standby (the daemon is stopping); they are reaped by the caller.
  void KillAll();

  int Count() const;

 private:
  struct Standby {
    pid_t pid = 0;
    int control_fd = -1;
    std::shared_ptr<RankLogTap> log;
    int64_t started_ms = 0;
  };

  void StartLocked(int slot);  // On the launcher thread, under mu_.
  void LauncherLoop();

  Launch launch_;
  Clock now_ms_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<int, Standby> standbys_;  // slot -> its standby
  std::map<int, int> deaths_;        // slot -> standbys that died waiting, in a row
  std::deque<int> requests_;         // Slots to start a standby for (launcher thread).
  uint64_t requested_ = 0, served_ = 0;
  bool stopping_ = false;
  bool exiting_ = false;  // The launcher thread ends.
  std::thread launcher_;  // Last: starts once the rest is built.
};

}  // namespace mptrain
