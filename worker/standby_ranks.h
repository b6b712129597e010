#pragma once

// Warm rank processes ("standbys"): one per slot, started before any assignment, so that a
// job's rank skips what makes a rank slow to start (process start, loading the CUDA libraries,
// the device's context, cuBLAS) and begins with its rendezvous. A standby waits on its stdin
// (a socket only the daemon holds) for the path of an assignment file, sent as one line with
// the job's own output pipe attached (SCM_RIGHTS: each job's log starts and ends with it), then
// runs that rank exactly as a cold-started rank would.
//
// After a job that ended cleanly, a process started for reuse releases the job's memory (its
// backend torn down: device memory, communicators; its heap trimmed), answers "done 0" on the
// same socket and waits for the slot's next job: back-to-back jobs do not wait seconds for a
// new process to set a GPU up (issue 33). The daemon takes "done" as the rank's exit (Done) and
// gives the process back to its slot (Return). It is handed only jobs of the principal whose
// job it ran (another's gets a new process: nothing of one principal's job is left in a
// process that runs another's), at most kMaxJobsPerRankProcess of them. A job that failed or
// was stopped ends its process, as before; the daemon starts the slot's next standby once a
// rank of that slot has exited.
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
#include <vector>

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

  // `reuse`: the standbys are started to be kept after a clean job (`--standby_reuse`); each
  // job's output then comes on a pipe of its own. Without it a standby's whole output is its
  // one job's log, and the daemon closes its stdin once the path is sent.
  StandbyRanks(Launch launch, Clock now_ms, bool reuse = false);
  ~StandbyRanks();  // Kills the standbys still waiting (they have no job to lose).
  StandbyRanks(const StandbyRanks&) = delete;
  StandbyRanks& operator=(const StandbyRanks&) = delete;

  // Starts a standby for `slot` unless it has one (or gave up on it), on the launcher thread;
  // returns once it is started (not warm: that goes on in the standby).
  void Ensure(int slot);

  struct Handed {
    pid_t pid = 0;
    // The job's output. Without reuse, the standby's whole output (its warm-up lines first);
    // with reuse, the job's own only, from the pipe that came with it: what the process wrote
    // while it waited, or between two jobs, is in the daemon's log (which copies every byte)
    // and in no job's.
    std::shared_ptr<RankLogTap> log;
    int64_t warm_for_ms = 0;  // How long it had been waiting.
    int jobs_before = 0;      // Jobs it ran before this one (0: a fresh process).
    std::string last_job;     // The last of them ("" for a fresh process).
  };
  // Gives `assignment_file` (of a job of `owner`) to the slot's standby, which then runs it as
  // a rank and is no longer a standby. Nothing when the slot has none or it is gone, or when
  // it ran another principal's job (ended now) (the caller starts the rank cold; a dead
  // standby is reaped as usual).
  std::optional<Handed> Hand(int slot, const std::string& assignment_file,
                             const std::string& owner = "", const std::string& job_id = "");

  // Processes handed a job that answered "done" since the last call: their ranks have ended
  // (exit code 0) without the process ending. Non-blocking. The caller then Returns each.
  std::vector<pid_t> Done();
  // A process that answered "done" becomes its slot's standby again; ended instead when the
  // slot has one, Renew was called since it was started, or the pool is stopping.
  void Return(pid_t pid);

  // For a child the daemon reaped: true when it was a standby or a process handed a job
  // (forgotten now; a standby's death counts against its slot unless it was being stopped).
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
    std::shared_ptr<RankLogTap> log;  // Its own output pipe, for its life.
    int64_t started_ms = 0;           // Started, or given back after a job.
    uint64_t generation = 0;          // Renew's count when it was started.
    int slot = 0;
    int jobs = 0;                     // Handed so far.
    std::string owner;                // Of its last job.
    std::string last_job;
    std::string answer;               // A partial "done" line read from it.
  };

  void StartLocked(int slot);  // On the launcher thread, under mu_.
  void LauncherLoop();

  // SIGKILL to `standby`, which the pool gives up on (not a death of its slot's).
  static void End(Standby& standby);

  Launch launch_;
  Clock now_ms_;
  const bool reuse_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<int, Standby> standbys_;  // slot -> its standby
  std::map<pid_t, Standby> lent_;    // Handed a job, kept for reuse: pid -> it
  uint64_t generation_ = 0;
  std::map<int, int> deaths_;        // slot -> standbys that died waiting, in a row
  std::deque<int> requests_;         // Slots to start a standby for (launcher thread).
  uint64_t requested_ = 0, served_ = 0;
  bool stopping_ = false;
  bool exiting_ = false;  // The launcher thread ends.
  std::thread launcher_;  // Last: starts once the rest is built.
};

}  // namespace mptrain
