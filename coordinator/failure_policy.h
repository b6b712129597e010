#pragma once

// What a failure of a running job means: which rank is the root cause, whether the job
// restarts or ends, and what its error says. Decisions only: the caller applies them to the
// JobRecord and frees slots. No clocks, no locks.
//
//   - A rank that stopped reporting (hung or stopped process) is the root cause of a stall;
//     ranks that report without advancing are waiting for it in a collective.
//   - A rank's collective failure is usually a consequence (its peer died): it is held back for
//     the heartbeat timeout and one interval, so that the root cause (a lost worker, a rank that
//     exited) names the failure when it arrives; the consequence follows it ("...; then ...").
//   - Two ranks whose collective failures name each other ("... waited for rank N ...") while
//     both their workers are alive are the two ends of a partition: that is the cause, and the
//     job fails at once naming the pair, not after the heartbeat timeout.
//   - A failure restarts a RUNNING job while restarts remain (like torchrun's --max-restarts),
//     unless it is one no restart can fix (diverged parameters, a queue timeout).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/job_record.h"

namespace mptrain {

class FailurePolicy {
 public:
  explicit FailurePolicy(int64_t heartbeat_timeout_ms)
      : heartbeat_timeout_ms_(heartbeat_timeout_ms) {}

  // Why the job must fail now because a rank stalled or went silent past progress_timeout_s,
  // naming the rank silent the longest first; nullopt while it progresses.
  std::optional<std::string> StallError(const JobRecord& job, int64_t now) const;

  // Until when a collective failure waits for its root cause: the heartbeat timeout and one
  // heartbeat interval (WorkerRegistry's fifth of it). The dead host's last heartbeat may cross
  // the report (sent just before the host died, read just after), and its worker is declared
  // lost a timeout after that heartbeat.
  int64_t ConsequenceDeadline(int64_t now) const {
    return now + heartbeat_timeout_ms_ + std::max<int64_t>(100, heartbeat_timeout_ms_ / 5);
  }

  struct Decision {
    bool restart = false;
    std::string error;  // The failure as recorded: root cause first, consequence after.
    std::string note;   // For a restart: what the watch event says.
  };
  Decision Decide(const JobRecord& job, const std::string& error, bool restartable) const;

  // The ranks a collective failure says its rank waited for (CollectiveTimeoutMessage's
  // "waited for rank 1 on h2 (10.0.0.3), rank 3 on ..."); at most kMaxWaitedFor, none when the
  // text does not say.
  static constexpr int kMaxWaitedFor = 16;
  static std::vector<int> WaitedFor(const std::string& error);
  // Whether `rank`'s error and `peer`'s recorded errors name each other: each waited for the
  // other.
  static bool NameEachOther(const JobRecord& job, int rank, int peer);

 private:
  int64_t heartbeat_timeout_ms_;
};

}  // namespace mptrain
