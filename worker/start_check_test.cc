#include "worker/start_check.h"

#include "gtest/gtest.h"

namespace mptrain {
namespace {

v1::Assignment Start(const std::string& job, int rank, int attempt, int slot) {
  v1::Assignment start;
  start.set_job_id(job);
  start.set_rank(rank);
  start.set_attempt(attempt);
  start.set_device_index(slot);
  return start;
}

TEST(CheckStart, AFreeSlotOfThisWorker_IsStarted) {
  const v1::Assignment running = Start("job-0001", 0, 1, 0);
  EXPECT_TRUE(CheckStart(Start("job-0001", 1, 1, 1), 2, {&running}).ok());
  EXPECT_TRUE(CheckStart(Start("job-0002", 0, 1, 0), 1, {}).ok());
}

TEST(CheckStart, HostileOrConfusedCoordinator_IsRefused) {
  const v1::Assignment running = Start("job-0001", 0, 1, 0);
  // A slot that is not there.
  EXPECT_EQ(CheckStart(Start("job-0002", 0, 1, 1), 1, {&running}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckStart(Start("job-0002", 0, 1, -1), 4, {}).code(),
            absl::StatusCode::kInvalidArgument);
  // A busy slot: not now (the coordinator asks again), and not a second process on it.
  const absl::Status busy = CheckStart(Start("job-0002", 0, 1, 0), 4, {&running});
  EXPECT_EQ(busy.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(busy.message().find("held by rank 0 of job-0001"), std::string::npos) << busy;
  // The same rank again: not a second process.
  EXPECT_EQ(CheckStart(Start("job-0001", 0, 1, 0), 4, {&running}).code(),
            absl::StatusCode::kAlreadyExists);
  // Ids that would name files outside the work directory.
  for (const char* id : {"", "../../etc/x", "job 1", "a/b"}) {
    EXPECT_EQ(CheckStart(Start(id, 0, 1, 0), 4, {}).code(), absl::StatusCode::kInvalidArgument)
        << id;
  }
  EXPECT_EQ(CheckStart(Start(std::string(65, 'j'), 0, 1, 0), 4, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mptrain
