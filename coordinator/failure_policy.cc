#include "coordinator/failure_policy.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_format.h"

namespace mptrain {

std::optional<std::string> FailurePolicy::StallError(const JobRecord& job, int64_t now) const {
  const int64_t timeout_ms = static_cast<int64_t>(job.spec().progress_timeout_s() * 1000);
  if (timeout_ms <= 0) return std::nullopt;
  // Ranks report every half second while alive, progress or not. Once any rank has made no
  // progress for the timeout, the rank silent the longest (past a few report intervals) is
  // named first.
  const int64_t silent_ms = std::clamp<int64_t>(timeout_ms / 2, 1'500, 10'000);
  int silent = -1, stalled = -1;
  for (int rank = 0; rank < job.world_size(); ++rank) {
    const RankRecord& r = job.rank(rank);
    if (r.result_reported || r.exited) continue;
    if (now - r.last_progress_ms > timeout_ms && stalled < 0) stalled = rank;
    const int64_t quiet = now - r.last_report_ms;
    if (quiet > silent_ms && (silent < 0 || r.last_report_ms < job.rank(silent).last_report_ms)) {
      silent = rank;
    }
  }
  if (stalled < 0 && (silent < 0 || now - job.rank(silent).last_report_ms <= timeout_ms)) {
    return std::nullopt;
  }
  if (silent >= 0) {
    const RankRecord& r = job.rank(silent);
    return absl::StrFormat(
        "%s stopped responding: no report for %.1f s (last step %d; progress_timeout_s %g)",
        job.DescribeRank(silent), (now - r.last_report_ms) / 1000.0, r.step,
        job.spec().progress_timeout_s());
  }
  const RankRecord& r = job.rank(stalled);
  return absl::StrFormat(
      "%s made no progress for %.1f s (stuck after step %d; progress_timeout_s %g)",
      job.DescribeRank(stalled), (now - r.last_progress_ms) / 1000.0, r.step,
      job.spec().progress_timeout_s());
}

FailurePolicy::Decision FailurePolicy::Decide(const JobRecord& job, const std::string& error,
                                              bool restartable) const {
  Decision decision;
  decision.error = error;
  if (!job.consequence_error().empty() && job.consequence_error() != error) {
    absl::StrAppend(&decision.error, "; then ", job.consequence_error());
  }
  decision.restart = restartable && job.running() &&
                     job.job().restarts() < job.spec().max_restarts();
  if (decision.restart) {
    decision.note = absl::StrCat(
        "restart ", job.job().restarts() + 1, " of ", job.spec().max_restarts(),
        job.job().latest_checkpoint_path().empty()
            ? " from the beginning"
            : absl::StrCat(" from the checkpoint of step ", job.job().latest_checkpoint_step()),
        " after: ", decision.error);
  }
  return decision;
}

std::vector<int> FailurePolicy::WaitedFor(const std::string& error) {
  std::vector<int> ranks;
  const std::string waited = "waited for ";
  const size_t at = error.find(waited);
  if (at == std::string::npos) return ranks;
  absl::string_view rest = absl::string_view(error).substr(at + waited.size());
  // "rank N on HOST (ADDRESS)", separated by ", "; anything else ends the list.
  while (absl::ConsumePrefix(&rest, "rank ") && ranks.size() < static_cast<size_t>(kMaxWaitedFor)) {
    size_t digits = 0;
    while (digits < rest.size() && digits < 9 && absl::ascii_isdigit(rest[digits])) ++digits;
    int rank = 0;
    if (digits == 0 || !absl::SimpleAtoi(rest.substr(0, digits), &rank)) break;
    ranks.push_back(rank);
    const size_t next = rest.find(", rank ");
    if (next == absl::string_view::npos) break;
    rest.remove_prefix(next + 2);
  }
  return ranks;
}

bool FailurePolicy::NameEachOther(const JobRecord& job, int rank, int peer) {
  if (rank == peer || !job.ValidRank(rank) || !job.ValidRank(peer)) return false;
  const std::vector<int> by_rank = WaitedFor(job.job().progress(rank).error());
  const std::vector<int> by_peer = WaitedFor(job.job().progress(peer).error());
  return std::count(by_rank.begin(), by_rank.end(), peer) > 0 &&
         std::count(by_peer.begin(), by_peer.end(), rank) > 0;
}

}  // namespace mptrain
