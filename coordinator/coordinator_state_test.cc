#include "coordinator/coordinator_state.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

class CoordinatorStateTest : public ::testing::Test {
 protected:
  CoordinatorStateTest() {
    CoordinatorOptions options;
    options.heartbeat_timeout_ms = 10'000;
    options.now_ms = [this] { return now_ms_.load(); };
    state_ = std::make_unique<CoordinatorState>(options);
  }

  std::string Register(const std::string& name, int slots, v1::DeviceKind device = v1::CPU,
                       uint64_t incarnation = 1) {
    v1::RegisterWorkerRequest request;
    request.set_host("127.0.0.1");
    request.set_name(name);
    request.set_device(device);
    request.set_slots(slots);
    request.set_incarnation(incarnation);
    auto response = state_->RegisterWorker(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response->worker_id();
  }

  static v1::JobSpec Spec(int world_size, v1::DeviceKind device = v1::CPU) {
    v1::JobSpec spec;
    spec.set_name("t");
    spec.set_world_size(world_size);
    spec.set_device(device);
    spec.mutable_model()->set_input_dim(4);
    spec.mutable_model()->set_output_dim(2);
    spec.mutable_data()->mutable_synthetic()->set_seed(0);
    spec.set_micro_batch_size(2);
    spec.set_accumulation_steps(1);
    spec.set_steps(1);
    spec.mutable_optimizer()->set_lr(0.1);
    return spec;
  }

  std::string Submit(int world_size, v1::DeviceKind device = v1::CPU) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = Spec(world_size, device);
    auto response = state_->SubmitJob(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response->job_id();
  }

  v1::JobState StateOf(const std::string& job_id) { return state_->GetJob(job_id)->state(); }

  v1::PollAssignmentsResponse Poll(const std::string& worker_id,
                                   const std::vector<v1::Assignment>& running = {},
                                   uint64_t incarnation = 1) {
    v1::PollAssignmentsRequest request;
    request.set_worker_id(worker_id);
    request.set_incarnation(incarnation);
    for (const auto& assignment : running) *request.add_running() = assignment;
    request.set_wait_ms(0);
    auto response = state_->PollAssignments(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return *response;
  }

  void ReportResult(const std::string& job_id, int rank, const std::string& checksum,
                    int attempt = 1) {
    v1::ReportRankResultRequest request;
    request.set_job_id(job_id);
    request.set_rank(rank);
    request.set_attempt(attempt);
    request.set_parameter_checksum(checksum);
    ASSERT_TRUE(state_->ReportRankResult(request).ok());
  }

  void ReportExit(const std::string& worker, const std::string& job_id, int rank, int attempt,
                  int term_signal) {
    v1::ReportRankExitRequest exit;
    exit.set_worker_id(worker);
    exit.set_job_id(job_id);
    exit.set_rank(rank);
    exit.set_attempt(attempt);
    exit.set_term_signal(term_signal);
    ASSERT_TRUE(state_->ReportRankExit(exit).ok());
  }

  // One second passes: the worker heartbeats, rank 0 reports `step`, liveness is checked.
  void SecondPasses(const std::string& worker, const std::string& job_id, int64_t step) {
    now_ms_ += 1'000;
    ASSERT_TRUE(state_->Heartbeat(worker, 1).ok());
    v1::ReportTelemetryRequest report;
    report.set_job_id(job_id);
    report.set_attempt(1);
    report.set_rank(0);
    report.set_step(step);
    ASSERT_TRUE(state_->ReportTelemetry(report).ok());
    state_->CheckLiveness();
  }

  std::atomic<int64_t> now_ms_{1'000'000};
  std::unique_ptr<CoordinatorState> state_;
};

TEST_F(CoordinatorStateTest, SubmitJob_InvalidSpec_IsInvalidArgumentNamingField) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(2);
  request.mutable_spec()->mutable_model()->add_hidden_dims(0);
  auto response = state_->SubmitJob(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(response.status().message()).find("model.hidden_dims[0]"),
            std::string::npos);
  EXPECT_TRUE(state_->ListJobs().empty()) << "a refused job must not be recorded";
}

TEST_F(CoordinatorStateTest, SubmitJob_NoWorkers_StaysPending) {
  std::string job = Submit(2);
  EXPECT_EQ(StateOf(job), v1::PENDING);
}

TEST_F(CoordinatorStateTest, SubmitJob_SameRequestId_ReturnsSameJob) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(1);
  request.set_request_id("retry-me");
  auto first = state_->SubmitJob(request);
  auto second = state_->SubmitJob(request);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->job_id(), second->job_id());
  EXPECT_EQ(state_->ListJobs().size(), 1u);
}

TEST_F(CoordinatorStateTest, RegisterWorker_PlacesPendingJob_AndPollDeliversRanks) {
  std::string job = Submit(2);
  std::string worker = Register("w", 2);
  EXPECT_EQ(StateOf(job), v1::RUNNING);
  v1::Job status = *state_->GetJob(job);
  ASSERT_EQ(status.placement_size(), 2);
  EXPECT_EQ(status.placement(0).worker_id(), worker);
  EXPECT_EQ(status.placement(1).device_index(), 1);

  v1::PollAssignmentsResponse poll = Poll(worker);
  ASSERT_EQ(poll.start_size(), 2);
  EXPECT_EQ(poll.start(0).job_id(), job);
  EXPECT_EQ(poll.start(0).attempt(), 1);
  EXPECT_EQ(poll.start(0).spec().loss_scaler().init_scale(), 65536.0)
      << "ranks receive the spec with defaults applied";
  // Once running, the same poll has nothing new.
  std::vector<v1::Assignment> running(poll.start().begin(), poll.start().end());
  v1::PollAssignmentsResponse again = Poll(worker, running);
  EXPECT_EQ(again.start_size(), 0);
  EXPECT_EQ(again.stop_size(), 0);
}

TEST_F(CoordinatorStateTest, Scheduling_IsFifo_AndMatchesDeviceKind) {
  std::string big = Submit(3);
  std::string small = Submit(1);
  Register("gpu", 4, v1::CUDA);
  EXPECT_EQ(StateOf(big), v1::PENDING) << "a CUDA worker must not take a CPU job";
  Register("cpu", 2, v1::CPU);
  EXPECT_EQ(StateOf(big), v1::PENDING);
  EXPECT_EQ(StateOf(small), v1::PENDING) << "strict FIFO: the small job waits behind the big one";
  Register("cpu2", 1, v1::CPU);
  EXPECT_EQ(StateOf(big), v1::RUNNING);
  EXPECT_EQ(StateOf(small), v1::PENDING);
}

TEST_F(CoordinatorStateTest, EqualChecksums_Succeed_AndSlotsAreReusedOnceRanksExit) {
  std::string job = Submit(2);
  std::string next = Submit(2);
  std::string worker = Register("w", 2);
  ReportResult(job, 0, "abc");
  EXPECT_EQ(StateOf(job), v1::RUNNING);
  ReportResult(job, 1, "abc");
  EXPECT_EQ(StateOf(job), v1::SUCCEEDED);
  EXPECT_EQ(StateOf(next), v1::PENDING) << "the ranks' processes still hold their slots";
  ReportExit(worker, job, 0, 1, 0);
  EXPECT_EQ(StateOf(next), v1::PENDING);
  ReportExit(worker, job, 1, 1, 0);
  EXPECT_EQ(StateOf(next), v1::RUNNING) << "slots freed by the finished job are reused";
}

TEST_F(CoordinatorStateTest, CancelledJob_SlotsDrainUntilTheWorkerNoLongerRunsTheRanks) {
  std::string job = Submit(1);
  std::string worker = Register("w", 1);
  v1::PollAssignmentsResponse started = Poll(worker);
  ASSERT_EQ(started.start_size(), 1);
  std::string next = Submit(1);
  ASSERT_TRUE(state_->CancelJob(job).ok());
  EXPECT_EQ(StateOf(next), v1::PENDING) << "the cancelled rank may still be on the GPU";
  std::vector<v1::Assignment> running(started.start().begin(), started.start().end());
  v1::PollAssignmentsResponse stop = Poll(worker, running);
  EXPECT_EQ(stop.stop_size(), 1);
  EXPECT_EQ(StateOf(next), v1::PENDING);
  v1::PollAssignmentsResponse after = Poll(worker, {});  // The worker's rank is gone.
  EXPECT_EQ(StateOf(next), v1::RUNNING);
  ASSERT_EQ(after.start_size(), 1);
  EXPECT_EQ(after.start(0).job_id(), next);
}

TEST_F(CoordinatorStateTest, DifferentChecksums_FailAsDiverged) {
  std::string job = Submit(2);
  Register("w", 2);
  ReportResult(job, 0, "abc");
  ReportResult(job, 1, "abd");
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_NE(status.error().find("parameters diverged across ranks"), std::string::npos);
}

TEST_F(CoordinatorStateTest, RankError_FailsJobNamingRankAndWorker) {
  std::string job = Submit(2);
  std::string worker = Register("w", 2);
  v1::ReportRankResultRequest request;
  request.set_job_id(job);
  request.set_rank(1);
  request.set_attempt(1);
  request.set_error("cannot open /data/x.npy");
  ASSERT_TRUE(state_->ReportRankResult(request).ok());
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_NE(status.error().find("rank 1 on worker " + worker), std::string::npos) << status.error();
  EXPECT_NE(status.error().find("cannot open /data/x.npy"), std::string::npos);
}

TEST_F(CoordinatorStateTest, RankExitWithoutResult_FailsJob_AndOtherRanksAreStopped) {
  std::string job = Submit(2);
  std::string worker = Register("w", 2);
  v1::PollAssignmentsResponse poll = Poll(worker);
  std::vector<v1::Assignment> running(poll.start().begin(), poll.start().end());
  ReportExit(worker, job, 0, 1, 9);
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_NE(status.error().find("rank 0"), std::string::npos);
  EXPECT_NE(status.error().find("signal 9"), std::string::npos) << status.error();
  running.erase(running.begin());
  v1::PollAssignmentsResponse after = Poll(worker, running);
  ASSERT_EQ(after.stop_size(), 1);
  EXPECT_EQ(after.stop(0).rank(), 1);
}

TEST_F(CoordinatorStateTest, FinishedRank_IsNotRestartedAfterItExits) {
  std::string job = Submit(2);
  std::string worker = Register("w", 2);
  Poll(worker);
  ReportResult(job, 0, "abc");
  ReportExit(worker, job, 0, 1, 0);
  EXPECT_EQ(StateOf(job), v1::RUNNING);
  v1::Assignment rank1;
  rank1.set_job_id(job);
  rank1.set_rank(1);
  rank1.set_attempt(1);
  v1::PollAssignmentsResponse poll = Poll(worker, {rank1});
  EXPECT_EQ(poll.start_size(), 0);
  EXPECT_EQ(poll.stop_size(), 0);
}

TEST_F(CoordinatorStateTest, SilentWorker_IsLost_AndItsJobFailsNamingIt) {
  std::string job = Submit(2);
  std::string quiet = Register("quiet", 1);
  std::string chatty = Register("chatty", 1);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  now_ms_ += 6'000;
  ASSERT_TRUE(state_->Heartbeat(chatty, 1).ok());
  state_->CheckLiveness();
  EXPECT_EQ(StateOf(job), v1::RUNNING);
  now_ms_ += 6'000;
  ASSERT_TRUE(state_->Heartbeat(chatty, 1).ok());
  state_->CheckLiveness();
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_NE(status.error().find("worker " + quiet), std::string::npos) << status.error();
  EXPECT_NE(status.error().find("no heartbeat"), std::string::npos);
  EXPECT_NE(status.error().find("rank"), std::string::npos);
  EXPECT_EQ(state_->Heartbeat(quiet, 1).code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorStateTest, NewIncarnation_ReplacesWorker_AndFailsItsJobs) {
  std::string job = Submit(1);
  std::string old_id = Register("w", 1, v1::CPU, /*incarnation=*/1);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  std::string new_id = Register("w", 1, v1::CPU, /*incarnation=*/2);
  EXPECT_NE(old_id, new_id);
  EXPECT_EQ(StateOf(job), v1::FAILED);
  EXPECT_NE(state_->GetJob(job)->error().find("restarted"), std::string::npos);
  EXPECT_EQ(state_->Heartbeat(old_id, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(state_->Heartbeat(new_id, 2).ok());
}

TEST_F(CoordinatorStateTest, CancelJob_CancelsOnce_ThenFailedPrecondition) {
  std::string job = Submit(1);
  auto cancelled = state_->CancelJob(job);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(*cancelled, v1::CANCELLED);
  EXPECT_EQ(state_->CancelJob(job).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(state_->CancelJob("job-9999").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(state_->GetJob("job-9999").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorStateTest, KeyValueGet_BlocksUntilSet) {
  std::string job = Submit(2);
  Register("w", 2);
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(state_->KeyValueSet(job, 1, "nccl_unique_id", std::string(128, 'x')).ok());
  });
  auto value = state_->KeyValueGet(job, 1, "nccl_unique_id", 5'000);
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(value->size(), 128u);
}

TEST_F(CoordinatorStateTest, KeyValueGet_TimesOut_OrAbortsWhenJobEnds) {
  std::string job = Submit(1);
  Register("w", 1);
  EXPECT_EQ(state_->KeyValueGet(job, 1, "missing", 50).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(state_->CancelJob(job).ok());
  });
  EXPECT_EQ(state_->KeyValueGet(job, 1, "missing", 10'000).status().code(),
            absl::StatusCode::kAborted);
  canceller.join();
  EXPECT_EQ(state_->KeyValueSet(job, 1, "k", "v").code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorStateTest, Telemetry_IsRecorded_AndWatchSeesOrderedEventsToTheEnd) {
  std::string job = Submit(1);
  Register("w", 1);
  auto snapshot = state_->WatchSnapshot(job);
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->snapshot().state(), v1::RUNNING);

  v1::ReportTelemetryRequest telemetry;
  telemetry.set_job_id(job);
  telemetry.set_attempt(1);
  telemetry.set_step(2);
  for (int step = 1; step <= 2; ++step) {
    v1::TelemetryRecord* record = telemetry.add_records();
    record->set_step(step);
    record->set_loss(1.0 / step);
  }
  auto abort = state_->ReportTelemetry(telemetry);
  ASSERT_TRUE(abort.ok());
  EXPECT_FALSE(abort->abort());
  EXPECT_EQ(state_->GetJob(job)->latest_telemetry().step(), 2);
  EXPECT_EQ(state_->GetJob(job)->progress(0).step(), 2);
  ReportResult(job, 0, "abc");

  auto batch = state_->WaitForJobEvents(job, snapshot->sequence(), 1'000);
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->events.size(), 3u);
  EXPECT_EQ(batch->events[0].telemetry().step(), 1);
  EXPECT_EQ(batch->events[1].telemetry().step(), 2);
  EXPECT_EQ(batch->events[2].state_change().state(), v1::SUCCEEDED);
  EXPECT_LT(batch->events[0].sequence(), batch->events[1].sequence());
  EXPECT_LT(batch->events[1].sequence(), batch->events[2].sequence());
  EXPECT_TRUE(batch->finished);
  // After the end, telemetry from a straggler is answered with abort.
  EXPECT_TRUE(state_->ReportTelemetry(telemetry)->abort());
}

TEST_F(CoordinatorStateTest, PollAssignments_LongPollWakesOnNewJob) {
  std::string worker = Register("w", 1);
  std::thread submitter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Submit(1);
  });
  v1::PollAssignmentsRequest request;
  request.set_worker_id(worker);
  request.set_incarnation(1);
  request.set_wait_ms(10'000);
  auto start = std::chrono::steady_clock::now();
  auto response = state_->PollAssignments(request);
  submitter.join();
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->start_size(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(CoordinatorStateTest, CollectiveFailure_WaitsForRootCause_ThenNamesBoth) {
  std::string job = Submit(2);
  std::string worker = Register("w", 2);
  v1::ReportRankResultRequest consequence;
  consequence.set_job_id(job);
  consequence.set_rank(0);
  consequence.set_attempt(1);
  consequence.set_error("gloo allreduce failed: connection reset");
  consequence.set_collective_failure(true);
  ASSERT_TRUE(state_->ReportRankResult(consequence).ok());
  EXPECT_EQ(StateOf(job), v1::RUNNING) << "a peer failure waits for its root cause";
  ReportExit(worker, job, 1, 1, 9);
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_EQ(status.error().find("rank 1"), 0u) << "root cause first: " << status.error();
  EXPECT_NE(status.error().find("then rank 0"), std::string::npos) << status.error();
}

TEST_F(CoordinatorStateTest, CollectiveFailureAlone_FailsAfterHeartbeatTimeout) {
  std::string job = Submit(2);
  std::string worker = Register("w", 2);
  v1::ReportRankResultRequest consequence;
  consequence.set_job_id(job);
  consequence.set_rank(0);
  consequence.set_attempt(1);
  consequence.set_error("rendezvous timed out");
  consequence.set_collective_failure(true);
  ASSERT_TRUE(state_->ReportRankResult(consequence).ok());
  now_ms_ += 5'000;
  ASSERT_TRUE(state_->Heartbeat(worker, 1).ok());
  state_->CheckLiveness();
  EXPECT_EQ(StateOf(job), v1::RUNNING);
  now_ms_ += 6'000;
  ASSERT_TRUE(state_->Heartbeat(worker, 1).ok());
  state_->CheckLiveness();
  EXPECT_EQ(StateOf(job), v1::FAILED);
  EXPECT_NE(state_->GetJob(job)->error().find("rendezvous timed out"), std::string::npos);
}

TEST_F(CoordinatorStateTest, ProgressTimeout_NamesTheSilentRank) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(2);
  request.mutable_spec()->set_progress_timeout_s(5);
  std::string job = state_->SubmitJob(request)->job_id();
  std::string worker = Register("w", 2);
  // Rank 0 reports (stuck at step 3), rank 1 is silent.
  for (int second = 1; second <= 6; ++second) SecondPasses(worker, job, 3);
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_NE(status.error().find("rank 1 on worker"), std::string::npos) << status.error();
  EXPECT_NE(status.error().find("stopped responding"), std::string::npos) << status.error();
}

TEST_F(CoordinatorStateTest, ProgressTimeout_NamesAStalledRankThatStillReports) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(1);
  request.mutable_spec()->set_progress_timeout_s(5);
  std::string job = state_->SubmitJob(request)->job_id();
  std::string worker = Register("w", 1);
  for (int second = 1; second <= 6; ++second) SecondPasses(worker, job, second == 1 ? 1 : 2);
  EXPECT_EQ(StateOf(job), v1::RUNNING) << "step 2 arrived 4 s ago: not yet";
  for (int second = 7; second <= 8; ++second) SecondPasses(worker, job, 2);
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_NE(status.error().find("made no progress"), std::string::npos) << status.error();
}

TEST_F(CoordinatorStateTest, MaxRestarts_ReplacesJobFromLatestCheckpoint_ThenFails) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(2);
  request.mutable_spec()->set_max_restarts(1);
  std::string job = state_->SubmitJob(request)->job_id();
  std::string worker = Register("w", 2);
  v1::PollAssignmentsResponse first = Poll(worker);
  ASSERT_EQ(first.start_size(), 2);
  EXPECT_EQ(first.start(0).resume_checkpoint(), "");

  v1::ReportTelemetryRequest report;
  report.set_job_id(job);
  report.set_attempt(1);
  report.set_step(10);
  report.set_checkpoint_step(10);
  report.set_checkpoint_path("/ckpt/step-00000010.safetensors");
  ASSERT_TRUE(state_->ReportTelemetry(report).ok());
  ASSERT_TRUE(state_->KeyValueSet(job, 1, "nccl_unique_id", "old").ok());

  ReportExit(worker, job, 1, 1, 9);
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::PENDING) << "queued again; rank 0 of attempt 1 still runs";
  EXPECT_EQ(status.restarts(), 1);
  ASSERT_EQ(status.failures_size(), 1);
  EXPECT_NE(status.failures(0).find("signal 9"), std::string::npos);
  EXPECT_EQ(status.error(), "");

  // The worker still runs rank 0 of attempt 1: it is told to stop it; once it is gone, attempt
  // 2 is placed and started.
  std::vector<v1::Assignment> running = {first.start(0)};
  v1::PollAssignmentsResponse stop = Poll(worker, running);
  EXPECT_EQ(stop.stop_size(), 1);
  ReportExit(worker, job, 0, 1, 15);
  EXPECT_EQ(StateOf(job), v1::RUNNING);
  EXPECT_EQ(state_->KeyValueGet(job, 2, "nccl_unique_id", 0).status().code(),
            absl::StatusCode::kDeadlineExceeded)
      << "the new attempt gets a fresh store (a fresh NCCL unique id)";
  v1::PollAssignmentsResponse second = Poll(worker, {});
  ASSERT_EQ(second.start_size(), 2);
  EXPECT_EQ(second.start(0).attempt(), 2);
  EXPECT_EQ(second.start(0).resume_checkpoint(), "/ckpt/step-00000010.safetensors");

  ReportExit(worker, job, 1, 2, 9);
  status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED) << "restarts are used up";
  EXPECT_EQ(status.failures_size(), 2);
}

TEST_F(CoordinatorStateTest, DeregisteredWorker_IsLostAtOnce_AndItsJobFails) {
  std::string job = Submit(1);
  std::string worker = Register("w", 1);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  ASSERT_TRUE(state_->DeregisterWorker(worker, 1, "SIGTERM").ok());
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_NE(status.error().find("left: SIGTERM"), std::string::npos) << status.error();
  EXPECT_EQ(state_->ListWorkers()[0].state(), v1::LOST);
  std::string next = Submit(1);
  EXPECT_EQ(StateOf(next), v1::PENDING) << "nothing is placed on a deregistered worker";
  EXPECT_EQ(state_->DeregisterWorker(worker, 1, "again").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mptrain
