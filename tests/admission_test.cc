// Admission against real worker daemons that share one machine (issue 27, item 5): two CPU
// workers on this host each advertise the host's memory (here capped by --memory_limit_mib),
// and the coordinator counts that memory once for both. A rank that would fit either worker
// alone waits while the machine's memory is held by the other worker's rank, says why, and is
// placed once that rank is gone.

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/resource_estimate.h"
#include "gtest/gtest.h"
#include "tests/local_cluster.h"

namespace mptrain::testing {
namespace {

std::string SpecJson(const std::string& name) {
  return absl::StrCat(R"({
    "name": ")", name, R"(", "world_size": 1, "device": "cpu",
    "model": {"input_dim": 64, "hidden_dims": [2048, 2048], "output_dim": 8},
    "data": {"synthetic": {"seed": 1}}, "micro_batch_size": 8, "accumulation_steps": 1,
    "steps": 1000000, "optimizer": {"lr": 0.0001}, "telemetry_every": 50})");
}

TEST(Admission, CoLocatedWorkers_ShareTheMachinesMemory_TheSecondRankWaitsWithTheReason) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(SpecJson("first"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ApplyJobSpecDefaults(&*spec);
  const int64_t rank_bytes = EstimateRankMemory(*spec).total;
  // Each worker alone holds one rank (1.5 of them); the machine does not hold two.
  const int64_t limit_mib = (rank_bytes + rank_bytes / 2) >> 20;

  LocalCluster::Options options;
  options.workers = 2;
  options.slots_per_worker = 1;
  options.secure = false;
  options.worker_flags = {absl::StrCat("--memory_limit_mib=", limit_mib)};
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());

  const std::string first = cluster.Submit(WriteSpec("first", SpecJson("first")));
  auto running = cluster.WaitForJob(
      first, [](const v1::Job& job) { return job.state() != v1::PENDING; }, 30);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING) << running->error();

  // The other worker's slot is free and big enough; the machine's memory is not.
  const std::string second = cluster.Submit(WriteSpec("second", SpecJson("second")));
  auto waiting = cluster.WaitForJob(
      second, [](const v1::Job& job) { return !job.pending_reason().empty(); }, 10);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ(waiting->state(), v1::PENDING);
  const std::string& reason = waiting->pending_reason();
  EXPECT_NE(reason.find(absl::StrCat("needs 1 cpu ranks of ", FormatBytes(rank_bytes),
                                     " each; the free memory of their machines holds 0")),
            std::string::npos)
      << reason;
  // Both workers, in whichever order they registered (ids are name#registration).
  EXPECT_NE(reason.find("(w0#"), std::string::npos) << reason;
  EXPECT_NE(reason.find(", w1#"), std::string::npos) << reason;
  EXPECT_NE(reason.find(absl::StrCat("free of ", FormatBytes(limit_mib << 20), ", room for 0")),
            std::string::npos)
      << reason;
  EXPECT_TRUE(cluster.RankProcesses(second).empty());

  // Once the first job's rank is gone, the machine's memory frees and the second is placed.
  CommandResult cancelled = cluster.Trainctl("cancel " + first);
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.output;
  auto placed = cluster.WaitForJob(
      second, [](const v1::Job& job) { return job.state() != v1::PENDING; }, 30);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->state(), v1::RUNNING) << placed->error();
  EXPECT_EQ(cluster.Trainctl("cancel " + second).exit_code, 0);
}

}  // namespace
}  // namespace mptrain::testing
