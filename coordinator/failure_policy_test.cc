#include "coordinator/failure_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

class NoChanges : public JobChanges {
 public:
  void JobChanged(const JobRecord&, bool) override {}
  void EventAppended(const JobRecord&, const v1::WatchJobEvent&) override {}
  void EventsTrimmed(const JobRecord&, int64_t) override {}
  void RankLogKept(const JobRecord&, store::StoredRankLog) override {}
  void KvWritten(const JobRecord&, const std::string&, const std::string&) override {}
  void KvCleared(const JobRecord&) override {}
};

struct RunningJob {
  explicit RunningJob(int max_restarts = 0, double progress_timeout_s = 10) {
    v1::JobSpec spec;
    spec.set_world_size(2);
    spec.set_max_restarts(max_restarts);
    spec.set_progress_timeout_s(progress_timeout_s);
    record = std::make_unique<JobRecord>(1, spec, Tenancy{"alice", false}, "", 0, /*now=*/0, JobLimits(),
                                         &changes);
    record->StartAttempt({{0, "a#1", "a", "ha", 0}, {1, "b#1", "hb", "hb", 0}}, /*now=*/0);
  }
  void Report(int rank, int64_t step, int64_t now, int64_t work_units = 0) {
    v1::ReportTelemetryRequest request;
    request.set_rank(rank);
    request.set_step(step);
    request.set_work_units(work_units);
    ASSERT_TRUE(record->RecordTelemetry(request, "", now).ok());
  }
  NoChanges changes;
  std::unique_ptr<JobRecord> record;
};

TEST(FailurePolicy, StallError_NoneWhileRanksProgress) {
  RunningJob job;
  FailurePolicy policy(5'000);
  job.Report(0, 1, 9'000);
  job.Report(1, 1, 9'000);
  EXPECT_FALSE(policy.StallError(*job.record, 15'000).has_value());
}

TEST(FailurePolicy, StallError_NamesTheSilentRankFirst) {
  RunningJob job;
  FailurePolicy policy(5'000);
  // Rank 0 keeps reporting without advancing (it waits in a collective); rank 1 went silent.
  for (int64_t now = 500; now <= 12'000; now += 500) job.Report(0, 3, now);
  job.Report(1, 3, 1'000);
  auto error = policy.StallError(*job.record, 12'000);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("rank 1 on worker b#1 (hb) stopped responding: no report for 11.0 s"),
            std::string::npos)
      << *error;
}

TEST(FailurePolicy, StallError_NamesAStuckRankWhenAllReport) {
  RunningJob job;
  FailurePolicy policy(5'000);
  for (int64_t now = 500; now <= 11'000; now += 500) {
    job.Report(0, 2, now);
    job.Report(1, 2, now);
  }
  auto error = policy.StallError(*job.record, 11'000);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("rank 0 on worker a#1 (ha) made no progress"), std::string::npos)
      << *error;
}

TEST(FailurePolicy, StallError_NoneWhileRanksEvaluateOrSampleBetweenSteps) {
  RunningJob job;
  FailurePolicy policy(5'000);
  // Step 2 stays for 30 s (three times the timeout) while both ranks go through evaluation
  // batches and sampled tokens.
  int64_t units = 0;
  for (int64_t now = 500; now <= 30'000; now += 500) {
    ++units;
    job.Report(0, 2, now, units);
    job.Report(1, 2, now, units);
  }
  EXPECT_FALSE(policy.StallError(*job.record, 30'000).has_value());
  // Then rank 1's work stops advancing (it reports the same count, as a stuck rank would):
  // a stall once the timeout has passed, and a smaller count (a hostile or stale report)
  // is no progress either.
  for (int64_t now = 30'500; now <= 41'000; now += 500) {
    ++units;
    job.Report(0, 2, now, units);
    job.Report(1, 2, now, now % 1'000 == 0 ? 3 : 60);
  }
  auto error = policy.StallError(*job.record, 41'000);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("rank 1 on worker b#1 (hb) made no progress for 11.0 s"),
            std::string::npos)
      << *error;
}

TEST(FailurePolicy, Decide_RestartsWhileRestartsRemain) {
  RunningJob job(/*max_restarts=*/1);
  FailurePolicy policy(5'000);
  auto decision = policy.Decide(*job.record, "worker b lost", /*restartable=*/true);
  EXPECT_TRUE(decision.restart);
  EXPECT_EQ(decision.note, "restart 1 of 1 from the beginning after: worker b lost");
  EXPECT_FALSE(policy.Decide(*job.record, "diverged", /*restartable=*/false).restart);
  job.record->Requeue(decision.note, 1);
  EXPECT_FALSE(policy.Decide(*job.record, "again", true).restart);  // Not RUNNING.
}

TEST(FailurePolicy, Decide_RootCauseFirstThenTheHeldConsequence) {
  RunningJob job;
  FailurePolicy policy(5'000);
  job.record->HoldConsequence("rank 0 failed: connection reset", policy.ConsequenceDeadline(0));
  EXPECT_EQ(job.record->consequence_deadline_ms(), 6'000);  // The timeout and an interval.
  auto decision = policy.Decide(*job.record, "worker b lost", true);
  EXPECT_FALSE(decision.restart);
  EXPECT_EQ(decision.error, "worker b lost; then rank 0 failed: connection reset");
}

}  // namespace
}  // namespace mptrain
