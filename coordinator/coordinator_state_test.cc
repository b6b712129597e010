#include "coordinator/coordinator_state.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/job_event_log.h"
#include "coordinator/store/gated_job_store.h"
#include "coordinator/test_job_spec.h"
#include "coordinator/store/sqlite_job_store.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

class CoordinatorStateTest : public ::testing::Test {
 protected:
  CoordinatorStateTest() { state_ = std::make_unique<CoordinatorState>(Options()); }

  CoordinatorOptions Options() {
    CoordinatorOptions options;
    options.heartbeat_timeout_ms = 10'000;
    options.now_ms = [this] { return now_ms_.load(); };
    // Its own: a test that moves now_ms_ is no stall of the coordinator unless it says so.
    options.monotonic_ms = [this] { return monotonic_ms_.load(); };
    options.notify = [this](const std::vector<std::string>& keys) {
      std::lock_guard<std::mutex> lock(notified_mu_);
      notified_.insert(keys.begin(), keys.end());
    };
    return options;
  }

  bool Notified(const std::string& key) {
    std::lock_guard<std::mutex> lock(notified_mu_);
    return notified_.count(key) > 0;
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
    worker_secrets_[response->worker_id()] = response->worker_secret();
    return response->worker_id();
  }

  absl::Status Heartbeat(const std::string& worker_id, uint64_t incarnation = 1) {
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    request.set_incarnation(incarnation);
    request.set_worker_secret(worker_secrets_[worker_id]);
    return state_->Heartbeat(request);
  }

  absl::Status Deregister(const std::string& worker_id, const std::string& reason) {
    v1::DeregisterWorkerRequest request;
    request.set_worker_id(worker_id);
    request.set_incarnation(1);
    request.set_reason(reason);
    request.set_worker_secret(worker_secrets_[worker_id]);
    return state_->DeregisterWorker(request);
  }

  std::string RankSecret(const std::string& job_id, int rank, int attempt = 1) {
    return state_->RankSecretForTesting(job_id, attempt, rank);
  }

  absl::Status KvSet(const std::string& job_id, int attempt, const std::string& key,
                     const std::string& value, int rank = 0) {
    v1::KeyValueSetRequest request;
    request.set_job_id(job_id);
    request.set_attempt(attempt);
    request.set_rank(rank);
    request.set_rank_secret(RankSecret(job_id, rank, attempt));
    request.set_key(key);
    request.set_value(value);
    return state_->KeyValueSet(request);
  }

  absl::StatusOr<std::optional<std::string>> KvGet(const std::string& job_id, int attempt,
                                                   const std::string& key, int rank = 0) {
    v1::KeyValueGetRequest request;
    request.set_job_id(job_id);
    request.set_attempt(attempt);
    request.set_rank(rank);
    request.set_rank_secret(RankSecret(job_id, rank, attempt));
    request.set_key(key);
    auto read = state_->KeyValueGet(request);
    if (!read.ok()) return read.status();
    return read->value;
  }

  static v1::JobSpec Spec(int world_size, v1::DeviceKind device = v1::CPU) {
    return SmallSpec(world_size, device);
  }

 public:
  static v1::JobSpec SmallSpec(int world_size, v1::DeviceKind device = v1::CPU) {
    return SmallJobSpec(world_size, device);
  }

 protected:
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
    request.set_worker_secret(worker_secrets_[worker_id]);
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
    request.set_rank_secret(RankSecret(job_id, rank, attempt));
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
    exit.set_worker_secret(worker_secrets_[worker]);
    ASSERT_TRUE(state_->ReportRankExit(exit).ok());
  }

  // One second passes: the worker heartbeats, rank 0 reports `step`, liveness is checked.
  void SecondPasses(const std::string& worker, const std::string& job_id, int64_t step) {
    now_ms_ += 1'000;
    ASSERT_TRUE(Heartbeat(worker, 1).ok());
    v1::ReportTelemetryRequest report;
    report.set_job_id(job_id);
    report.set_attempt(1);
    report.set_rank(0);
    report.set_step(step);
    report.set_rank_secret(RankSecret(job_id, 0));
    ASSERT_TRUE(state_->ReportTelemetry(report).ok());
    state_->CheckLiveness();
  }

  std::map<std::string, std::string> worker_secrets_;  // worker id -> its secret
  std::mutex notified_mu_;
  std::set<std::string> notified_;  // Keys the state asked to wake.
  std::atomic<int64_t> now_ms_{1'000'000};
  std::atomic<int64_t> monotonic_ms_{0};
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
  EXPECT_TRUE(state_->ListJobs({})->jobs().empty()) << "a refused job must not be recorded";
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
  EXPECT_EQ(state_->ListJobs({})->jobs_size(), 1);

  // Another spec under the same id would silently never run: refused, naming the job.
  v1::SubmitJobRequest changed = request;
  changed.mutable_spec()->set_steps(request.spec().steps() + 1);
  auto refused = state_->SubmitJob(changed);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists) << refused.status();
  EXPECT_NE(refused.status().message().find("was used for " + first->job_id() +
                                            " with another spec"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(state_->ListJobs({})->jobs_size(), 1);
  // Ids are each principal's own: another's same id is another job.
  auto stranger = state_->SubmitJob(request, "mallory");
  ASSERT_TRUE(stranger.ok()) << stranger.status();
  EXPECT_NE(stranger->job_id(), first->job_id());
  EXPECT_EQ(state_->ListJobs({})->jobs_size(), 2);
}

// A job's name is how its owner refers to it: unique among that owner's jobs that have not
// ended (queued or running), free for other owners and again once the job ended.
TEST_F(CoordinatorStateTest, SubmitJob_NameOfAnOwnersLiveJob_AlreadyExistsNamingIt) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(2);
  request.mutable_spec()->set_name("resnet-sweep");
  auto first = state_->SubmitJob(request, "alice", false);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->state(), v1::PENDING);
  auto again = state_->SubmitJob(request, "alice", false);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_NE(again.status().message().find("name resnet-sweep is taken by " + first->job_id() +
                                          " (pending)"),
            std::string::npos)
      << again.status();
  EXPECT_EQ(state_->ListJobs({})->jobs_size(), 1) << "a refused job must not be recorded";
  // Another owner's namespace.
  auto bobs = state_->SubmitJob(request, "bob", false);
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  // Running holds the name too.
  Register("w", 4);
  ASSERT_EQ(StateOf(first->job_id()), v1::RUNNING);
  again = state_->SubmitJob(request, "alice", false);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_NE(again.status().message().find("(running)"), std::string::npos) << again.status();
  // Unnamed jobs never collide.
  v1::SubmitJobRequest unnamed;
  *unnamed.mutable_spec() = Spec(1);
  unnamed.mutable_spec()->clear_name();
  ASSERT_TRUE(state_->SubmitJob(unnamed, "alice", false).ok());
  ASSERT_TRUE(state_->SubmitJob(unnamed, "alice", false).ok());
  // Ended: the name is free again, and the new job holds it.
  ASSERT_TRUE(state_->CancelJob(first->job_id(), "alice", false).ok());
  auto reused = state_->SubmitJob(request, "alice", false);
  ASSERT_TRUE(reused.ok()) << reused.status();
  again = state_->SubmitJob(request, "alice", false);
  EXPECT_NE(again.status().message().find("taken by " + reused->job_id()), std::string::npos)
      << again.status();
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

TEST_F(CoordinatorStateTest, Scheduling_MatchesDeviceKind_OldestPlaceableFirst) {
  std::string big = Submit(3);
  std::string small = Submit(1);
  std::string second_small = Submit(1);
  Register("gpu", 4, v1::CUDA);
  EXPECT_EQ(StateOf(big), v1::PENDING) << "a CUDA worker must not take a CPU job";
  EXPECT_EQ(StateOf(small), v1::PENDING);
  std::string cpu = Register("cpu", 1, v1::CPU);
  EXPECT_EQ(StateOf(big), v1::PENDING);
  EXPECT_EQ(StateOf(small), v1::RUNNING) << "the oldest job that fits, behind one that does not";
  EXPECT_EQ(StateOf(second_small), v1::PENDING);
  state_->CancelJob(small).IgnoreError();
  ReportExit(cpu, small, 0, 1, 15);  // Its slot is free once the rank is gone.
  EXPECT_EQ(StateOf(second_small), v1::RUNNING);
  state_->CancelJob(second_small).IgnoreError();
  ReportExit(cpu, second_small, 0, 1, 15);
  Register("cpu2", 2, v1::CPU);
  EXPECT_EQ(StateOf(big), v1::RUNNING) << "once it fits, the job that waited runs";
  EXPECT_EQ(StateOf(Submit(1)), v1::PENDING);
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
  // While the rank dies, the worker's polls are not answered the same stop again (a worker
  // spun at ~2,700 polls a second): nothing new, so they wait; the stop is repeated after
  // kStopResendMs in case it was lost.
  EXPECT_EQ(Poll(worker, running).stop_size(), 0);
  now_ms_ += kStopResendMs - 1;
  EXPECT_EQ(Poll(worker, running).stop_size(), 0);
  now_ms_ += 1;
  EXPECT_EQ(Poll(worker, running).stop_size(), 1);
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
  request.set_rank_secret(RankSecret(job, 1));
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
  ASSERT_TRUE(Heartbeat(chatty, 1).ok());
  state_->CheckLiveness();
  EXPECT_EQ(StateOf(job), v1::RUNNING);
  now_ms_ += 6'000;
  ASSERT_TRUE(Heartbeat(chatty, 1).ok());
  state_->CheckLiveness();
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_NE(status.error().find("worker " + quiet), std::string::npos) << status.error();
  EXPECT_NE(status.error().find("no heartbeat"), std::string::npos);
  EXPECT_NE(status.error().find("rank"), std::string::npos);
  EXPECT_EQ(Heartbeat(quiet, 1).code(), absl::StatusCode::kNotFound);
}

// Any call a worker proves is its own counts as a sign of life: after a network blip its
// poll may get through before its next heartbeat is due.
TEST_F(CoordinatorStateTest, AWorkersPolls_KeepItAliveLikeHeartbeats) {
  std::string job = Submit(1);
  std::string polling = Register("polling", 1);
  const v1::PollAssignmentsResponse started = Poll(polling);
  std::vector<v1::Assignment> running(started.start().begin(), started.start().end());
  ASSERT_EQ(running.size(), 1u);
  for (int i = 0; i < 3; ++i) {
    now_ms_ += 6'000;
    Poll(polling, running);
    state_->CheckLiveness();
  }
  EXPECT_EQ(StateOf(job), v1::RUNNING) << "a worker that polls every 6 s was declared lost";
  now_ms_ += 11'000;
  state_->CheckLiveness();
  EXPECT_EQ(StateOf(job), v1::FAILED);
}

// A GPU worker's heartbeats carry its usage: the latest is kept (read usage_age_ms before the
// heartbeat came) and listed; the next replaces it; one without usage leaves it; a hostile one
// is refused naming the field, keeps the last, and still counts as a sign of life; a lost worker
// shows none.
TEST_F(CoordinatorStateTest, Heartbeat_Usage_KeptReplacedRefusedNamingTheField) {
  v1::RegisterWorkerRequest request;
  request.set_host("127.0.0.1");
  request.set_name("g");
  request.set_device(v1::CUDA);
  request.set_slots(2);
  request.set_incarnation(1);
  for (int i = 0; i < 2; ++i) request.add_devices()->set_index(i);
  auto registered = state_->RegisterWorker(request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id(registered->worker_id());
  heartbeat.set_incarnation(1);
  heartbeat.set_worker_secret(registered->worker_secret());
  auto listed = [&] { return state_->ListWorkers().at(0); };
  EXPECT_TRUE(listed().has_usage());
  EXPECT_EQ(listed().usage_unix_ms(), 0) << "a usage before the worker sent one";

  v1::WorkerUsage* usage = heartbeat.mutable_usage();
  usage->set_memory_available_bytes(int64_t{40} << 30);
  usage->set_memory_total_bytes(int64_t{64} << 30);
  for (int i = 0; i < 2; ++i) {
    v1::DeviceUsage* device = usage->add_devices();
    device->set_index(i);
    device->set_available(true);
    device->set_memory_used_bytes(int64_t{10 + i} << 30);
    device->set_memory_total_bytes(int64_t{80} << 30);
    device->set_utilization_percent(50 + i);
  }
  heartbeat.set_usage_age_ms(250);
  v1::HeartbeatRequest stolen = heartbeat;
  stolen.set_worker_secret("not the secret");
  EXPECT_EQ(state_->Heartbeat(stolen).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(listed().usage_unix_ms(), 0) << "usage kept from a call without the secret";
  ASSERT_TRUE(state_->Heartbeat(heartbeat).ok());
  EXPECT_EQ(listed().usage_unix_ms(), now_ms_.load() - 250);
  EXPECT_EQ(listed().usage().devices(1).utilization_percent(), 51);
  EXPECT_EQ(state_->GetOverview().workers.at(0).usage_age_s, 0.25);

  now_ms_ += 2'000;
  usage->mutable_devices(1)->set_utilization_percent(97);
  heartbeat.set_usage_age_ms(0);
  ASSERT_TRUE(state_->Heartbeat(heartbeat).ok());
  EXPECT_EQ(listed().usage_unix_ms(), now_ms_.load());
  EXPECT_EQ(listed().usage().devices(1).utilization_percent(), 97) << "not replaced";
  const int64_t kept_at = now_ms_.load();

  v1::HeartbeatRequest without = heartbeat;
  without.clear_usage();
  without.set_usage_age_ms(0);
  now_ms_ += 1'000;
  ASSERT_TRUE(state_->Heartbeat(without).ok());
  EXPECT_EQ(listed().usage_unix_ms(), kept_at) << "a heartbeat without usage dropped it";

  v1::HeartbeatRequest hostile = heartbeat;
  hostile.mutable_usage()->mutable_devices(1)->set_utilization_percent(101);
  // Silent but for hostile heartbeats past the 10 s timeout: still alive.
  for (int i = 0; i < 3; ++i) {
    now_ms_ += 5'000;
    absl::Status refused = state_->Heartbeat(hostile);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(refused.message(), "usage.devices[1].utilization_percent must be in [0, 100], got 101");
    state_->CheckLiveness();
  }
  EXPECT_EQ(listed().state(), v1::ALIVE) << "a heartbeat with a refused usage did not count";
  EXPECT_EQ(listed().usage_unix_ms(), kept_at) << "a refused usage replaced the last";
  EXPECT_EQ(listed().usage().devices(1).utilization_percent(), 97);

  now_ms_ += 11'000;
  state_->CheckLiveness();
  EXPECT_EQ(listed().state(), v1::LOST);
  EXPECT_EQ(listed().usage_unix_ms(), 0);
  EXPECT_EQ(listed().usage().devices_size(), 0) << "a lost worker shows its last figures";
}

TEST_F(CoordinatorStateTest, NameOfLiveWorker_CannotBeTakenOver_UntilItIsLost) {
  std::string job = Submit(1);
  std::string old_id = Register("w", 1, v1::CPU, /*incarnation=*/1);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  v1::RegisterWorkerRequest takeover;
  takeover.set_host("10.0.0.66");
  takeover.set_name("w");
  takeover.set_device(v1::CPU);
  takeover.set_slots(1);
  takeover.set_incarnation(2);
  auto refused = state_->RegisterWorker(takeover);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(refused.status().message().find("held by live worker " + old_id), std::string::npos)
      << refused.status();
  EXPECT_EQ(StateOf(job), v1::RUNNING) << "the live worker and its job are untouched";

  // Once the old worker misses its heartbeats, the name is free again.
  now_ms_ += 11'000;
  state_->CheckLiveness();
  EXPECT_EQ(StateOf(job), v1::FAILED);
  std::string new_id = Register("w", 1, v1::CPU, /*incarnation=*/2);
  EXPECT_NE(old_id, new_id);
  EXPECT_EQ(Heartbeat(old_id, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Heartbeat(new_id, 2).ok());
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

TEST_F(CoordinatorStateTest, KeyValueGet_NotYetThenSet_AndTheSetWakesTheJobsWaiters) {
  std::string job = Submit(2);
  Register("w", 2);
  auto before = KvGet(job, 1, "nccl_unique_id", 1);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_FALSE(before->has_value()) << "not set yet: the caller waits on JobKey";
  notified_.clear();
  ASSERT_TRUE(KvSet(job, 1, "nccl_unique_id", std::string(128, 'x')).ok());
  EXPECT_TRUE(Notified(CoordinatorState::JobKey(job)));
  auto value = KvGet(job, 1, "nccl_unique_id", 1);
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(value->value().size(), 128u);
}

TEST_F(CoordinatorStateTest, KeyValueGet_AbortedWhenTheJobEnds) {
  std::string job = Submit(1);
  Register("w", 1);
  notified_.clear();
  ASSERT_TRUE(state_->CancelJob(job).ok());
  EXPECT_TRUE(Notified(CoordinatorState::JobKey(job))) << "a waiting get looks again";
  EXPECT_EQ(KvGet(job, 1, "missing").status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(KvSet(job, 1, "k", "v").code(), absl::StatusCode::kFailedPrecondition);
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
  telemetry.set_rank_secret(RankSecret(job, 0));
  for (int step = 1; step <= 2; ++step) {
    v1::TelemetryRecord* record = telemetry.add_records();
    record->set_step(step);
    record->set_loss(1.0 / step);
    record->set_unix_ms(42);  // A rank's clock: the coordinator's stands instead.
  }
  const int64_t recorded_at = now_ms_.load();
  auto abort = state_->ReportTelemetry(telemetry);
  ASSERT_TRUE(abort.ok());
  EXPECT_FALSE(abort->abort());
  EXPECT_EQ(state_->GetJob(job)->latest_telemetry().step(), 2);
  EXPECT_EQ(state_->GetJob(job)->progress(0).step(), 2);
  // The same report again (its answer lost), then one overlapping it: each step once.
  ASSERT_TRUE(state_->ReportTelemetry(telemetry).ok());
  v1::ReportTelemetryRequest overlapping = telemetry;
  overlapping.clear_records();
  overlapping.set_step(3);
  for (int step = 2; step <= 3; ++step) overlapping.add_records()->set_step(step);
  ASSERT_TRUE(state_->ReportTelemetry(overlapping).ok());
  EXPECT_EQ(state_->GetJob(job)->latest_telemetry().step(), 3);
  ReportResult(job, 0, "abc");

  auto batch = state_->JobEventsSince(job, snapshot->sequence());
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->events.size(), 4u);
  EXPECT_EQ(batch->events[0].telemetry().step(), 1);
  EXPECT_EQ(batch->events[1].telemetry().step(), 2);
  EXPECT_EQ(batch->events[1].telemetry().loss(), 0.5) << "the first record of a step stands";
  EXPECT_EQ(batch->events[1].telemetry().attempt(), 1) << "stamped with the attempt that ran it";
  EXPECT_EQ(batch->events[1].telemetry().unix_ms(), recorded_at)
      << "stamped with the coordinator's time of recording (exports' wall-clock column)";
  EXPECT_EQ(batch->events[2].telemetry().step(), 3);
  EXPECT_EQ(batch->events[3].state_change().state(), v1::SUCCEEDED);
  EXPECT_LT(batch->events[0].sequence(), batch->events[1].sequence());
  EXPECT_LT(batch->events[1].sequence(), batch->events[2].sequence());
  EXPECT_TRUE(batch->finished);
  // After the end, telemetry from a straggler is answered with abort.
  EXPECT_TRUE(state_->ReportTelemetry(telemetry)->abort());
}

TEST_F(CoordinatorStateTest, ListJobs_LabelSelector_ListsOnlyJobsWithEveryLabel) {
  auto submit = [this](std::map<std::string, std::string> labels) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = Spec(1);
    request.mutable_spec()->mutable_labels()->insert(labels.begin(), labels.end());
    auto response = state_->SubmitJob(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response->job_id();
  };
  const std::string vision = submit({{"team", "vision"}, {"env", "prod"}});
  submit({{"team", "speech"}});
  const std::string vision_dev = submit({{"team", "vision"}, {"env", "dev"}});
  auto listed = [this](std::map<std::string, std::string> selector) {
    v1::ListJobsRequest request;
    request.mutable_label_selector()->insert(selector.begin(), selector.end());
    std::vector<std::string> ids;
    absl::StatusOr<v1::ListJobsResponse> response = state_->ListJobs(request);
    EXPECT_TRUE(response.ok()) << response.status();
    for (const v1::Job& job : response->jobs()) ids.push_back(job.job_id());
    return ids;
  };
  EXPECT_EQ(listed({{"team", "vision"}}), (std::vector<std::string>{vision, vision_dev}));
  EXPECT_EQ(listed({{"team", "vision"}, {"env", "prod"}}), std::vector<std::string>{vision});
  EXPECT_TRUE(listed({{"team", "audio"}}).empty());
  EXPECT_EQ(listed({}).size(), 3u);
  v1::ListJobsRequest page;
  page.mutable_label_selector()->insert({"team", "vision"});
  EXPECT_EQ(state_->ListJobs(page)->jobs(0).spec().labels().at("env"), "prod")
      << "a listing shows the labels";
  v1::ListJobsRequest bad;
  (*bad.mutable_label_selector())["SECRET key"] = "x";
  EXPECT_EQ(state_->ListJobs(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_->ListJobs(bad).status().message().find("SECRET"), std::string::npos);
}

TEST_F(CoordinatorStateTest, NewJob_WakesOnlyThePollsOfItsWorkers) {
  std::string worker = Register("w", 1);
  std::string other = Register("other", 1, v1::CUDA);
  EXPECT_EQ(Poll(worker).start_size(), 0) << "nothing yet: the poll waits on WorkerKey";
  notified_.clear();
  Submit(1);
  EXPECT_TRUE(Notified(CoordinatorState::WorkerKey(worker)));
  EXPECT_FALSE(Notified(CoordinatorState::WorkerKey(other))) << "no wake-up for everybody";
  EXPECT_EQ(Poll(worker).start_size(), 1);
  notified_.clear();
  ASSERT_TRUE(Heartbeat(worker).ok());
  EXPECT_TRUE(notified_.empty()) << "a heartbeat changes nothing anyone waits for";
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
  consequence.set_rank_secret(RankSecret(job, 0));
  ASSERT_TRUE(state_->ReportRankResult(consequence).ok());
  EXPECT_EQ(StateOf(job), v1::RUNNING) << "a peer failure waits for its root cause";
  ReportExit(worker, job, 1, 1, 9);
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_EQ(status.error().find("rank 1"), 0u) << "root cause first: " << status.error();
  EXPECT_NE(status.error().find("then rank 0"), std::string::npos) << status.error();
}

// The dead host's last heartbeat crossed its peer's collective failure (sent just before the
// host died, read just after the report): the worker is declared lost a heartbeat timeout after
// that heartbeat, later than a timeout after the report. The consequence waits one interval
// more than the timeout, so the lost worker still names the failure (slurm_test saw the bare
// "connection reset by peer" win that race).
TEST_F(CoordinatorStateTest, CollectiveFailure_TheDeadWorkersHeartbeatCrossedIt_LossNamedFirst) {
  std::string job = Submit(2);
  std::string chatty = Register("chatty", 1);  // Name order: rank 0.
  std::string quiet = Register("quiet", 1);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  v1::ReportRankResultRequest consequence;
  consequence.set_job_id(job);
  consequence.set_rank(0);
  consequence.set_attempt(1);
  consequence.set_error("gloo allreduce failed: connection reset by peer");
  consequence.set_collective_failure(true);
  consequence.set_rank_secret(RankSecret(job, 0));
  ASSERT_TRUE(state_->ReportRankResult(consequence).ok());
  now_ms_ += 50;
  ASSERT_TRUE(Heartbeat(quiet, 1).ok());  // Its last.
  for (int second = 1; second <= 13 && StateOf(job) == v1::RUNNING; ++second) {
    now_ms_ += 1'000;
    ASSERT_TRUE(Heartbeat(chatty, 1).ok());
    state_->CheckLiveness();
  }
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_EQ(status.error().find("worker " + quiet + " (127.0.0.1) lost: no heartbeat"), 0u)
      << status.error();
  EXPECT_NE(status.error().find("then rank 0"), std::string::npos) << status.error();
}

// A worker that self-fenced (no answers from the coordinator: with a one-way loss it is never
// declared lost) says so with the exits of the ranks it stopped, and the job names it — before,
// a fenced rank looked like a crash ("exited with code 143") or its "stopped" report, a
// consequence, was all the job had.
// Two ranks that each timed out waiting for the other while both workers heartbeat: a
// partition between their hosts, named at once (before, the job waited a heartbeat timeout
// more for a cause that never comes: 70 s at the defaults).
TEST_F(CoordinatorStateTest, CollectiveFailuresNamingEachOther_BothWorkersAlive_PartitionAtOnce) {
  std::string job = Submit(2);
  std::string w1 = Register("w1", 1);
  std::string w2 = Register("w2", 1);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  auto report = [&](int rank, int peer) {
    v1::ReportRankResultRequest failure;
    failure.set_job_id(job);
    failure.set_rank(rank);
    failure.set_attempt(1);
    failure.set_error(absl::StrCat("DEADLINE_EXCEEDED: collective allreduce timed out after 5 s: "
                                   "rank ", rank, " on h (10.0.0.", rank, ") waited for rank ",
                                   peer, " on h (10.0.0.", peer, ")"));
    failure.set_collective_failure(true);
    failure.set_rank_secret(RankSecret(job, rank));
    ASSERT_TRUE(state_->ReportRankResult(failure).ok());
  };
  report(0, 1);
  EXPECT_EQ(StateOf(job), v1::RUNNING) << "one side alone may be a consequence";
  now_ms_ += 1'000;
  ASSERT_TRUE(Heartbeat(w1).ok());
  ASSERT_TRUE(Heartbeat(w2).ok());
  report(1, 0);
  v1::Job failed = *state_->GetJob(job);
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_EQ(failed.error().find("a partition between rank 1 on worker " + w2 +
                                " (127.0.0.1) and rank 0 on worker " + w1 + " (127.0.0.1)"),
            0u)
      << failed.error();

}

// A worker that stopped heartbeating may be the cause (it is being lost): the failures wait.
TEST_F(CoordinatorStateTest, CollectiveFailuresNamingEachOther_OneWorkerSilent_HeldBack) {
  std::string job = Submit(2);
  std::string w1 = Register("w1", 1);
  Register("w2", 1);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  now_ms_ += 4'100;  // Two intervals (2 s each) and more without w2's heartbeat.
  ASSERT_TRUE(Heartbeat(w1).ok());
  for (int rank : {0, 1}) {
    v1::ReportRankResultRequest failure;
    failure.set_job_id(job);
    failure.set_rank(rank);
    failure.set_attempt(1);
    failure.set_error(absl::StrCat("collective allreduce timed out after 5 s: rank ", rank,
                                   " on h waited for rank ", 1 - rank, " on h"));
    failure.set_collective_failure(true);
    failure.set_rank_secret(RankSecret(job, rank));
    ASSERT_TRUE(state_->ReportRankResult(failure).ok());
  }
  EXPECT_EQ(StateOf(job), v1::RUNNING);
}

TEST(FailurePolicyWaitedForTest, ParsesTheRanksOfACollectiveTimeout) {
  EXPECT_EQ(FailurePolicy::WaitedFor("collective allreduce timed out after 60 s: rank 0 on h1 "
                                     "(10.0.0.2) waited for rank 1 on h2 (10.0.0.3), rank 3 "
                                     "on h4 (10.0.0.5) (gloo: recv)"),
            (std::vector<int>{1, 3}));
  EXPECT_TRUE(FailurePolicy::WaitedFor("connection reset").empty());
  EXPECT_TRUE(FailurePolicy::WaitedFor("waited for its peers").empty());
  EXPECT_TRUE(FailurePolicy::WaitedFor("waited for rank 99999999999999").size() <= 1);
  std::string many = "waited for rank 1";
  for (int i = 0; i < 100; ++i) many += ", rank 1";
  EXPECT_EQ(FailurePolicy::WaitedFor(many).size(), size_t{FailurePolicy::kMaxWaitedFor});
}

// The coordinator stopped for 20 s (SIGSTOP, a paused VM): its workers' heartbeats queued
// meanwhile. Before, the first check after it resumed marked every worker lost ("no heartbeat
// for 20.0 s") and blamed a worker for the jobs whose ranks had self-fenced because of it.
TEST_F(CoordinatorStateTest, CoordinatorStall_WorkersGetAGrace_AndTheJobNamesTheStall) {
  std::string job = Submit(2);
  std::string worker = Register("w", 2);
  std::string dead = Register("dead", 1);  // Dead for real: it never heartbeats again.
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  state_->CheckLiveness();
  now_ms_ += 20'000;
  monotonic_ms_ += 20'000;
  state_->CheckLiveness();  // The first check after the stall: nothing read yet.
  for (const v1::Worker& listed : state_->ListWorkers()) {
    EXPECT_EQ(listed.state(), v1::ALIVE) << listed.worker_id() << " declared lost at once";
  }
  EXPECT_EQ(StateOf(job), v1::RUNNING);
  ASSERT_TRUE(Heartbeat(worker).ok());  // What queued is read.
  // Its rank self-fenced while the coordinator was stopped.
  v1::ReportRankExitRequest exit;
  exit.set_worker_id(worker);
  exit.set_job_id(job);
  exit.set_rank(1);
  exit.set_attempt(1);
  exit.set_exit_code(143);
  exit.set_worker_secret(worker_secrets_[worker]);
  exit.set_stop_reason("its worker self-fenced: no answer from the coordinator for 10.1 s");
  ASSERT_TRUE(state_->ReportRankExit(exit).ok());
  v1::Job failed = *state_->GetJob(job);
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_EQ(failed.error().find("the coordinator did not run for 20.0 s"), 0u) << failed.error();
  EXPECT_EQ(failed.error().find("lost"), std::string::npos) << failed.error();
  // After one interval (2 s at a 10 s timeout) the silent one is lost, the other is not.
  now_ms_ += 1'000;
  monotonic_ms_ += 1'000;
  state_->CheckLiveness();
  EXPECT_EQ(state_->GetOverview().workers.size(), 2u);
  now_ms_ += 1'100;
  monotonic_ms_ += 1'100;
  state_->CheckLiveness();
  for (const v1::Worker& listed : state_->ListWorkers()) {
    EXPECT_EQ(listed.state(), listed.worker_id() == dead ? v1::LOST : v1::ALIVE)
        << listed.worker_id();
  }
  // A short stall (a late tick on a loaded machine, under half the timeout) delays loss
  // detection but is named in no failure, even one right after it.
  now_ms_ += 3'000;
  monotonic_ms_ += 3'000;
  state_->CheckLiveness();
  ASSERT_TRUE(Heartbeat(worker).ok());
  std::string later = Submit(1);
  ASSERT_TRUE(Heartbeat(worker).ok());
  ASSERT_EQ(StateOf(later), v1::RUNNING);
  ReportExit(worker, later, 0, 1, 9);
  EXPECT_EQ(state_->GetJob(later)->error().find("the coordinator did not run"), std::string::npos);
}

TEST_F(CoordinatorStateTest, SelfFencedRanks_TheJobNamesTheFence) {
  const std::string fence = "its worker self-fenced: no answer from the coordinator for 10.1 s";
  auto exit_with_reason = [&](const std::string& worker, const std::string& job, int rank) {
    v1::ReportRankExitRequest exit;
    exit.set_worker_id(worker);
    exit.set_job_id(job);
    exit.set_rank(rank);
    exit.set_attempt(1);
    exit.set_exit_code(143);
    exit.set_worker_secret(worker_secrets_[worker]);
    exit.set_stop_reason(fence);
    ASSERT_TRUE(state_->ReportRankExit(exit).ok());
  };
  // The rank could not report (its connection is gone too): its exit carries the reason.
  std::string job = Submit(2);
  std::string worker = Register("w", 2);
  exit_with_reason(worker, job, 1);
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_NE(status.error().find("rank 1 on worker " + worker), std::string::npos)
      << status.error();
  EXPECT_NE(status.error().find("exited with code 143 (" + fence + ") before reporting a result"),
            std::string::npos)
      << status.error();
  // The rank reported its stop (ABORTED, held back as a consequence): the exit names the cause.
  std::string second = Submit(2);
  ASSERT_EQ(StateOf(second), v1::PENDING);
  ReportExit(worker, job, 0, 1, 9);  // The first job's other rank is gone: its slots are free.
  Poll(worker, {});
  ASSERT_EQ(StateOf(second), v1::RUNNING);
  v1::ReportRankResultRequest stopped;
  stopped.set_job_id(second);
  stopped.set_rank(0);
  stopped.set_attempt(1);
  stopped.set_error("ABORTED: collective allreduce on rank 0 aborted: signal 15 (Terminated)");
  stopped.set_collective_failure(true);
  stopped.set_rank_secret(RankSecret(second, 0));
  ASSERT_TRUE(state_->ReportRankResult(stopped).ok());
  EXPECT_EQ(StateOf(second), v1::RUNNING) << "a consequence waits for its cause";
  exit_with_reason(worker, second, 0);
  status = *state_->GetJob(second);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_EQ(status.error().find("rank 0 on worker " + worker + " (127.0.0.1) was stopped (" +
                                fence + ")"),
            0u)
      << status.error();
  // A rank that reported success is done, whatever stopped its process afterwards.
  std::string third = Submit(2);
  ReportExit(worker, second, 1, 1, 9);
  Poll(worker, {});
  ASSERT_EQ(StateOf(third), v1::RUNNING);
  ReportResult(third, 0, "abc");
  exit_with_reason(worker, third, 0);
  EXPECT_EQ(StateOf(third), v1::RUNNING) << state_->GetJob(third)->error();
}

// A stop reason is the worker's word, echoed into the job's error: bounded however long.
TEST_F(CoordinatorStateTest, HostileStopReason_IsCutShortInTheError) {
  std::string job = Submit(1);
  std::string worker = Register("w", 1);
  v1::ReportRankExitRequest exit;
  exit.set_worker_id(worker);
  exit.set_job_id(job);
  exit.set_rank(0);
  exit.set_attempt(1);
  exit.set_exit_code(143);
  exit.set_worker_secret(worker_secrets_[worker]);
  exit.set_stop_reason(std::string(100'000, 'x'));
  ASSERT_TRUE(state_->ReportRankExit(exit).ok());
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_LT(status.error().size(), 2'000u);
  EXPECT_NE(status.error().find("more bytes"), std::string::npos) << status.error();
}

// Alone (no worker lost, no rank exited): after the heartbeat timeout (10 s) and an interval (2 s).
TEST_F(CoordinatorStateTest, CollectiveFailureAlone_FailsAfterHeartbeatTimeoutAndAnInterval) {
  std::string job = Submit(2);
  std::string worker = Register("w", 2);
  v1::ReportRankResultRequest consequence;
  consequence.set_job_id(job);
  consequence.set_rank(0);
  consequence.set_attempt(1);
  consequence.set_error("rendezvous timed out");
  consequence.set_collective_failure(true);
  consequence.set_rank_secret(RankSecret(job, 0));
  ASSERT_TRUE(state_->ReportRankResult(consequence).ok());
  now_ms_ += 5'000;
  ASSERT_TRUE(Heartbeat(worker, 1).ok());
  state_->CheckLiveness();
  EXPECT_EQ(StateOf(job), v1::RUNNING);
  now_ms_ += 6'000;
  ASSERT_TRUE(Heartbeat(worker, 1).ok());
  state_->CheckLiveness();
  EXPECT_EQ(StateOf(job), v1::RUNNING) << "failed at 11 s";
  now_ms_ += 1'100;
  ASSERT_TRUE(Heartbeat(worker, 1).ok());
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
  request.mutable_spec()->set_checkpoint_every(10);
  request.mutable_spec()->set_checkpoint_dir("/ckpt");
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
  report.set_rank_secret(RankSecret(job, 0));
  ASSERT_TRUE(state_->ReportTelemetry(report).ok());
  ASSERT_TRUE(KvSet(job, 1, "nccl_unique_id", "old").ok());

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
  auto fresh = KvGet(job, 2, "nccl_unique_id");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_FALSE(fresh->has_value()) << "the new attempt gets a fresh store (a fresh NCCL id)";
  v1::PollAssignmentsResponse second = Poll(worker, {});
  ASSERT_EQ(second.start_size(), 2);
  EXPECT_EQ(second.start(0).attempt(), 2);
  EXPECT_EQ(second.start(0).resume_checkpoint(), "/ckpt/step-00000010.safetensors");

  ReportExit(worker, job, 1, 2, 9);
  status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED) << "restarts are used up";
  EXPECT_EQ(status.failures_size(), 2);
}

// Three one-slot workers; a 2-rank job with restarts checkpoints on rank 0's worker.
struct HolderCase {
  std::string job, holder, other, spare;
};

class CheckpointHolderTest : public CoordinatorStateTest {
 protected:
  HolderCase Start(bool shared) {
    HolderCase c;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = Spec(2);
    request.mutable_spec()->set_max_restarts(1);
    request.mutable_spec()->set_checkpoint_every(10);
    request.mutable_spec()->set_checkpoint_dir("/ckpt");
    request.mutable_spec()->set_checkpoint_dir_shared(shared);
    c.job = state_->SubmitJob(request)->job_id();
    std::string a = Register("a", 1), b = Register("b", 1);
    v1::Job job = *state_->GetJob(c.job);
    EXPECT_EQ(job.state(), v1::RUNNING);
    c.holder = job.placement(0).worker_id();
    c.other = job.placement(1).worker_id();
    v1::ReportTelemetryRequest report;
    report.set_job_id(c.job);
    report.set_attempt(1);
    report.set_step(10);
    report.set_checkpoint_step(10);
    report.set_checkpoint_path("/ckpt/step-00000010.safetensors");
    report.set_rank_secret(RankSecret(c.job, 0));
    EXPECT_TRUE(state_->ReportTelemetry(report).ok());
    EXPECT_EQ(state_->GetJob(c.job)->latest_checkpoint_worker(),
              c.holder.substr(0, c.holder.find('#')));
    c.spare = Register("c", 1);
    return c;
  }
};

TEST_F(CheckpointHolderTest, Restart_PutsRankZeroOnTheWorkerThatHoldsTheCheckpoint) {
  HolderCase c = Start(/*shared=*/false);
  ASSERT_TRUE(Deregister(c.other, "host down").ok());  // Rank 1's host.
  // Rank 0 of attempt 1 still runs on the holder: the restart waits for its slot.
  v1::Job job = *state_->GetJob(c.job);
  EXPECT_EQ(job.state(), v1::PENDING);
  EXPECT_NE(job.pending_reason().find("rank 0 must go to worker a"), std::string::npos)
      << job.pending_reason();
  ReportExit(c.holder, c.job, 0, 1, 15);
  job = *state_->GetJob(c.job);
  ASSERT_EQ(job.state(), v1::RUNNING);
  EXPECT_EQ(job.placement(0).worker_id(), c.holder);
  EXPECT_EQ(job.placement(1).worker_id(), c.spare);
}

TEST_F(CheckpointHolderTest, HolderLost_NotShared_FailsBeforeAnyRankStarts) {
  HolderCase c = Start(/*shared=*/false);
  ASSERT_TRUE(Deregister(c.holder, "host down").ok());
  v1::Job job = *state_->GetJob(c.job);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_NE(job.error().find("cannot resume: the checkpoint of step 10 "
                             "(/ckpt/step-00000010.safetensors) is on worker a, which is not "
                             "alive"),
            std::string::npos)
      << job.error();
  EXPECT_TRUE(Poll(c.spare).start().empty());
}

TEST_F(CheckpointHolderTest, HolderLost_Shared_ResumesAnywhere) {
  HolderCase c = Start(/*shared=*/true);
  ASSERT_TRUE(Deregister(c.holder, "host down").ok());
  ReportExit(c.other, c.job, 1, 1, 15);
  v1::Job job = *state_->GetJob(c.job);
  ASSERT_EQ(job.state(), v1::RUNNING) << job.error() << job.pending_reason();
  EXPECT_EQ(job.restarts(), 1);
  for (const v1::RankPlacement& placement : job.placement()) {
    EXPECT_NE(placement.worker_id(), c.holder);
  }
}

TEST_F(CoordinatorStateTest, DeregisteredWorker_IsLostAtOnce_AndItsJobFails) {
  std::string job = Submit(1);
  std::string worker = Register("w", 1);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  ASSERT_TRUE(Deregister(worker, "SIGTERM").ok());
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_NE(status.error().find("left: SIGTERM"), std::string::npos) << status.error();
  EXPECT_EQ(state_->ListWorkers()[0].state(), v1::LOST);
  std::string next = Submit(1);
  EXPECT_EQ(StateOf(next), v1::PENDING) << "nothing is placed on a deregistered worker";
  EXPECT_EQ(Deregister(worker, "again").code(), absl::StatusCode::kNotFound);
}

}  // namespace
// ---- Capabilities: what a client with a valid role but no (or the wrong) secret can do ----

TEST_F(CoordinatorStateTest, WorkerCalls_WrongSecret_PermissionDeniedAndNothingChanges) {
  std::string job = Submit(1);
  std::string worker = Register("w", 1);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  worker_secrets_[worker] = "forged";
  EXPECT_EQ(Heartbeat(worker).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Deregister(worker, "forged").code(), absl::StatusCode::kPermissionDenied);
  v1::PollAssignmentsRequest poll;
  poll.set_worker_id(worker);
  poll.set_incarnation(1);  // Public: ListWorkers shows it.
  EXPECT_EQ(state_->PollAssignments(poll).status().code(), absl::StatusCode::kPermissionDenied);
  v1::ReportRankExitRequest exit;
  exit.set_worker_id(worker);
  exit.set_job_id(job);
  exit.set_attempt(1);
  exit.set_term_signal(9);
  EXPECT_EQ(state_->ReportRankExit(exit).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(StateOf(job), v1::RUNNING);
  EXPECT_EQ(state_->ListWorkers()[0].state(), v1::ALIVE);
}

TEST_F(CoordinatorStateTest, ReportRankExit_RankOfAnotherWorker_IsIgnored) {
  std::string job = Submit(1);
  std::string holder = Register("holder", 1);
  std::string other = Register("other", 1);
  ASSERT_EQ(state_->GetJob(job)->placement(0).worker_id(), holder);
  ReportExit(other, job, 0, 1, 9);  // A valid worker secret, but not the rank's worker.
  EXPECT_EQ(StateOf(job), v1::RUNNING);
  ReportExit(holder, job, 0, 1, 9);
  EXPECT_EQ(StateOf(job), v1::FAILED);
}

TEST_F(CoordinatorStateTest, RankCalls_WrongOtherRanksOrStaleSecret_PermissionDenied) {
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = Spec(2);
  submit.mutable_spec()->set_max_restarts(1);
  std::string job = state_->SubmitJob(submit)->job_id();
  std::string worker = Register("w", 2);
  const std::string stale = RankSecret(job, 1, 1);
  // Restart: attempt 2 gets fresh secrets.
  ReportExit(worker, job, 1, 1, 9);
  ReportExit(worker, job, 0, 1, 15);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  ASSERT_EQ(state_->GetJob(job)->restarts(), 1);
  const std::string rank0 = RankSecret(job, 0, 2);
  ASSERT_FALSE(rank0.empty());
  ASSERT_NE(rank0, RankSecret(job, 1, 2));
  ASSERT_NE(stale, RankSecret(job, 1, 2));

  for (const std::string& secret : {std::string(), std::string("forged"), rank0, stale}) {
    SCOPED_TRACE("secret '" + secret + "' used as rank 1 of attempt 2");
    v1::ReportRankResultRequest result;
    result.set_job_id(job);
    result.set_rank(1);
    result.set_attempt(2);
    result.set_parameter_checksum("forged");
    result.set_rank_secret(secret);
    EXPECT_EQ(state_->ReportRankResult(result).code(), absl::StatusCode::kPermissionDenied);
    result.set_error("forged failure");
    EXPECT_EQ(state_->ReportRankResult(result).code(), absl::StatusCode::kPermissionDenied);
    v1::ReportTelemetryRequest telemetry;
    telemetry.set_job_id(job);
    telemetry.set_rank(1);
    telemetry.set_attempt(2);
    telemetry.set_step(123456789);
    telemetry.add_records()->set_loss(-42);
    telemetry.set_rank_secret(secret);
    EXPECT_EQ(state_->ReportTelemetry(telemetry).status().code(),
              absl::StatusCode::kPermissionDenied);
    v1::KeyValueSetRequest set;
    set.set_job_id(job);
    set.set_attempt(2);
    set.set_rank(1);
    set.set_key("k");
    set.set_value("v");
    set.set_rank_secret(secret);
    EXPECT_EQ(state_->KeyValueSet(set).code(), absl::StatusCode::kPermissionDenied);
    v1::KeyValueGetRequest get;
    get.set_job_id(job);
    get.set_attempt(2);
    get.set_rank(1);
    get.set_key("k");
    get.set_rank_secret(secret);
    EXPECT_EQ(state_->KeyValueGet(get).status().code(), absl::StatusCode::kPermissionDenied);
  }
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::RUNNING);
  EXPECT_EQ(status.progress(1).step(), 0);
  EXPECT_FALSE(status.latest_telemetry().loss() < 0);
  // The stale secret still speaks for its own attempt, which is over: abort, no effect.
  v1::ReportTelemetryRequest late;
  late.set_job_id(job);
  late.set_rank(1);
  late.set_attempt(1);
  late.set_rank_secret(stale);
  EXPECT_TRUE(state_->ReportTelemetry(late)->abort());
  // The right secrets finish the job.
  ReportResult(job, 0, "same", 2);
  ReportResult(job, 1, "same", 2);
  EXPECT_EQ(StateOf(job), v1::SUCCEEDED);
}

// A report's records are bounded in number (each is bounded in size: unknown fields are
// dropped at the RPC layer), and a get's key like a set's.
TEST_F(CoordinatorStateTest, TelemetryRecordsAndKeyValueGetKeys_AreBounded) {
  std::string job = Submit(1);
  Register("w", 1);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  v1::ReportTelemetryRequest report;
  report.set_job_id(job);
  report.set_attempt(1);
  report.set_rank_secret(RankSecret(job, 0));
  for (int i = 0; i <= 10'000; ++i) report.add_records()->set_step(i + 1);
  auto refused = state_->ReportTelemetry(report);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("10000"), std::string::npos) << refused.status();
  report.mutable_records()->RemoveLast();
  EXPECT_TRUE(state_->ReportTelemetry(report).ok());
  auto get = KvGet(job, 1, std::string(257, 'k'));
  EXPECT_EQ(get.status().code(), absl::StatusCode::kInvalidArgument);
}

// A poll's list of running ranks is bounded by the worker's slots (each entry could cost a stop
// in the answer, built under the lock).
TEST_F(CoordinatorStateTest, PollAssignments_RunningListLongerThanTheSlots_InvalidArgument) {
  std::string worker = Register("w", 2);
  v1::PollAssignmentsRequest request;
  request.set_worker_id(worker);
  request.set_incarnation(1);
  request.set_worker_secret(worker_secrets_[worker]);
  for (int i = 0; i < 5; ++i) {
    v1::Assignment* running = request.add_running();
    running->set_job_id("job-9999");
    running->set_rank(i);
  }
  auto refused = state_->PollAssignments(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("2 slots"), std::string::npos) << refused.status();
  request.mutable_running()->DeleteSubrange(4, 1);
  EXPECT_TRUE(state_->PollAssignments(request).ok());
}

TEST_F(CoordinatorStateTest, KeyValueSet_IsWriteOncePerAttempt) {
  std::string job = Submit(2);
  Register("w", 2);
  ASSERT_TRUE(KvSet(job, 1, "nccl_unique_id", "id").ok());
  EXPECT_TRUE(KvSet(job, 1, "nccl_unique_id", "id", /*rank=*/1).ok()) << "a retry is fine";
  absl::Status overwrite = KvSet(job, 1, "nccl_unique_id", "attacker", /*rank=*/1);
  EXPECT_EQ(overwrite.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(KvGet(job, 1, "nccl_unique_id")->value(), "id");
}

TEST_F(CoordinatorStateTest, KeyValueSet_Limits_NameTheLimit) {
  std::string job = Submit(1);
  Register("w", 1);
  absl::Status big = KvSet(job, 1, "k", std::string(kMaxKvValueBytes + 1, 'x'));
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("the limit is 1048576"), std::string::npos) << big;
  EXPECT_EQ(KvSet(job, 1, std::string(kMaxKvKeyBytes + 1, 'k'), "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvSet(job, 1, "", "v").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorStateTest, KeyValueStore_IsBoundedPerJob) {
  CoordinatorOptions options;
  options.now_ms = [this] { return now_ms_.load(); };
  options.max_kv_keys_per_job = 3;
  options.max_kv_bytes_per_job = 1 << 20;
  state_ = std::make_unique<CoordinatorState>(options);
  std::string job = Submit(1);
  Register("w", 1);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(KvSet(job, 1, "k" + std::to_string(i), "v").ok());
  absl::Status full = KvSet(job, 1, "k3", "v");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("limits 3 keys"), std::string::npos) << full;
  EXPECT_EQ(KvSet(job, 1, "k4", std::string(1 << 20, 'x')).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(CoordinatorStateTest, CancelJob_OnlyOwnerOrAdmin) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(1);
  std::string job = state_->SubmitJob(request, "alice")->job_id();
  EXPECT_EQ(state_->GetJob(job)->owner(), "alice");
  auto denied = state_->CancelJob(job, "bob", /*admin=*/false);
  // As an unknown job: the refusal does not reveal that the job exists, nor whose it is.
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(denied.status().message()), absl::StrCat("unknown job ", job));
  EXPECT_EQ(StateOf(job), v1::PENDING);
  EXPECT_TRUE(state_->CancelJob(job, "alice", false).ok());
  std::string second = state_->SubmitJob(request, "alice")->job_id();
  EXPECT_TRUE(state_->CancelJob(second, "root", /*admin=*/true).ok());
  EXPECT_NE(state_->GetJob(second)->error().find("cancelled by root"), std::string::npos);
}

TEST_F(CoordinatorStateTest, Reads_AnotherPrincipalsJob_NotFoundAsAnUnknownOne) {
  Register("w", 1);  // alice's job runs, the others queue
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(1);
  const std::string alices = state_->SubmitJob(request, "alice")->job_id();
  const std::string bobs = state_->SubmitJob(request, "bob")->job_id();
  ASSERT_EQ(StateOf(alices), v1::RUNNING);
  v1::ReportRankLogRequest chunk;
  chunk.set_job_id(alices);
  chunk.set_attempt(1);
  chunk.set_rank(0);
  chunk.set_worker_id(state_->GetJob(alices)->placement(0).worker_id());
  chunk.set_worker_secret(worker_secrets_[chunk.worker_id()]);
  chunk.set_data("alice's secret output\n");
  ASSERT_TRUE(state_->ReportRankLog(chunk).ok());

  const JobReader bob = JobReader::Owner("bob");
  const JobReader alice = JobReader::Owner("alice");
  const JobReader viewer{"grafana", /*all=*/true};
  // The answer for alice's job, asked by bob, is the answer for a job that does not exist.
  auto expect_unknown = [&](const absl::Status& status, const std::string& unknown_message) {
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
    EXPECT_EQ(std::string(status.message()), unknown_message);
  };
  const auto view = CoordinatorState::View::kWritten;
  expect_unknown(state_->GetJob(alices, view, bob).status(),
                 absl::StrCat("unknown job ", alices));
  EXPECT_EQ(state_->GetJob(alices, view, alice)->owner(), "alice");
  EXPECT_EQ(state_->GetJob(alices, view, viewer)->owner(), "alice");
  v1::GetJobEventsRequest events;
  events.set_job_id(alices);
  expect_unknown(state_->GetJobEvents(events, view, bob).status(),
                 absl::StrCat("unknown job ", alices));
  EXPECT_GT(state_->GetJobEvents(events, view, alice)->events_size(), 0);
  EXPECT_GT(state_->GetJobEvents(events, view, viewer)->events_size(), 0);
  v1::GetRankLogRequest log;
  log.set_job_id(alices);
  log.set_attempt(1);
  expect_unknown(state_->GetRankLog(log, bob).status(), absl::StrCat("unknown job ", alices));
  EXPECT_EQ(state_->GetRankLog(log, alice)->data(), "alice's secret output\n");
  EXPECT_TRUE(state_->GetRankLog(log, viewer).ok());
  expect_unknown(state_->WatchSnapshot(alices, bob).status(),
                 absl::StrCat("unknown job ", alices));
  EXPECT_TRUE(state_->WatchSnapshot(alices, alice).ok());

  auto ids = [](const v1::ListJobsResponse& page) {
    std::vector<std::string> out;
    for (const v1::Job& job : page.jobs()) out.push_back(job.job_id());
    return out;
  };
  EXPECT_EQ(ids(*state_->ListJobs({}, view, bob)), std::vector<std::string>{bobs});
  EXPECT_EQ(ids(*state_->ListJobs({}, view, alice)), std::vector<std::string>{alices});
  EXPECT_EQ(ids(*state_->ListJobs({}, view, viewer)), (std::vector<std::string>{alices, bobs}));
  // Paging a filtered list: bob's page of one ends at his job, not at alice's in between.
  v1::ListJobsRequest one;
  one.set_page_size(1);
  ASSERT_TRUE(state_->SubmitJob(request, "carol").ok());  // between bob's two
  const std::string bobs_second = state_->SubmitJob(request, "bob")->job_id();
  auto page = state_->ListJobs(one, view, bob);
  EXPECT_EQ(ids(*page), std::vector<std::string>{bobs});
  one.set_page_token(page->next_page_token());
  EXPECT_EQ(ids(*state_->ListJobs(one, view, bob)), std::vector<std::string>{bobs_second});

  // /metrics' per-job lines: the running jobs the scraper may read; the counts are of all.
  EXPECT_TRUE(state_->GetOverview(bob).running.empty());
  ASSERT_EQ(state_->GetOverview(alice).running.size(), 1u);
  EXPECT_EQ(state_->GetOverview(alice).running[0].job_id(), alices);
  EXPECT_EQ(state_->GetOverview(viewer).running.size(), 1u);
  EXPECT_EQ(state_->GetOverview(bob).jobs.at(v1::RUNNING), 1);
}

TEST_F(CoordinatorStateTest, SubmitJob_OversizedSpecOrRequestId_InvalidArgumentNamingLimit) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(1);
  request.mutable_spec()->set_name(std::string(kMaxSpecBytes + 1, 'a'));
  auto big = state_->SubmitJob(request);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("the limit is 65536"), std::string::npos);
  EXPECT_LT(big.status().message().size(), 200u);
  *request.mutable_spec() = Spec(1);
  request.mutable_spec()->set_name(std::string(8'000, 'n'));
  auto long_name = state_->SubmitJob(request);
  EXPECT_EQ(long_name.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(long_name.status().message().size(), 400u) << "the name is not echoed in full";
  *request.mutable_spec() = Spec(1);
  request.set_request_id(std::string(1'000, 'r'));
  EXPECT_EQ(state_->SubmitJob(request).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorStateTest, SubmitJob_PathsOutsideEveryWorkersRoots_Refused) {
  v1::RegisterWorkerRequest worker;
  worker.set_host("127.0.0.1");
  worker.set_name("w");
  worker.set_device(v1::CPU);
  worker.set_slots(1);
  worker.add_data_roots("/srv/data");
  worker.add_output_roots("/srv/out");
  ASSERT_TRUE(state_->RegisterWorker(worker).ok());
  auto submit = [&](auto edit) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = Spec(1);
    edit(request.mutable_spec());
    return state_->SubmitJob(request).status();
  };
  absl::Status dotdot = submit([](v1::JobSpec* s) { s->set_output_checkpoint("/srv/out/../x"); });
  EXPECT_EQ(dotdot.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dotdot.message().find("output_checkpoint"), std::string::npos) << dotdot;
  absl::Status relative = submit([](v1::JobSpec* s) { s->set_init_checkpoint("init.st"); });
  EXPECT_EQ(relative.code(), absl::StatusCode::kInvalidArgument);
  absl::Status outside = submit([](v1::JobSpec* s) { s->set_init_checkpoint("/etc/shadow"); });
  EXPECT_EQ(outside.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(outside.message().find("init_checkpoint"), std::string::npos) << outside;
  absl::Status write_to_data =
      submit([](v1::JobSpec* s) { s->set_output_checkpoint("/srv/data/x.st"); });
  EXPECT_EQ(write_to_data.code(), absl::StatusCode::kPermissionDenied);
  absl::Status dir = submit([](v1::JobSpec* s) {
    s->set_checkpoint_every(1);
    s->set_checkpoint_dir("/tmp/elsewhere");
  });
  EXPECT_EQ(dir.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(dir.message().find("checkpoint_dir"), std::string::npos);
  EXPECT_TRUE(submit([](v1::JobSpec* s) {
                s->set_init_checkpoint("/srv/data/init.st");
                s->set_output_checkpoint("/srv/out/final.st");
              }).ok());
}

TEST_F(CoordinatorStateTest, ReportTelemetry_CheckpointOutsideCheckpointDir_Refused) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(1);
  request.mutable_spec()->set_checkpoint_every(1);
  request.mutable_spec()->set_checkpoint_dir("/ckpt");
  std::string job = state_->SubmitJob(request)->job_id();
  Register("w", 1);
  v1::ReportTelemetryRequest report;
  report.set_job_id(job);
  report.set_attempt(1);
  report.set_rank_secret(RankSecret(job, 0));
  report.set_checkpoint_step(5);
  for (const char* path : {"/etc/passwd", "/ckpt/../etc/passwd", "relative"}) {
    report.set_checkpoint_path(path);
    EXPECT_EQ(state_->ReportTelemetry(report).status().code(),
              absl::StatusCode::kInvalidArgument) << path;
  }
  EXPECT_EQ(state_->GetJob(job)->latest_checkpoint_path(), "");
}

TEST_F(CoordinatorStateTest, RegisterWorker_RetriedWithItsNonce_GetsTheSameAnswer) {
  v1::RegisterWorkerRequest request;
  request.set_host("127.0.0.1");
  request.set_name("w");
  request.set_device(v1::CPU);
  request.set_slots(1);
  request.set_incarnation(7);
  request.set_registration_nonce("private-nonce-0123456789");
  auto first = state_->RegisterWorker(request);
  ASSERT_TRUE(first.ok());
  auto retry = state_->RegisterWorker(request);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->worker_id(), first->worker_id());
  EXPECT_EQ(retry->worker_secret(), first->worker_secret());
  EXPECT_EQ(state_->ListWorkers().size(), 1u);
  request.set_registration_nonce("guessed-nonce-0123456789");  // Name and incarnation are public.
  EXPECT_EQ(state_->RegisterWorker(request).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(CoordinatorStateTest, RegisterWorker_BadNameOrRoots_InvalidArgument) {
  v1::RegisterWorkerRequest request;
  request.set_host("127.0.0.1");
  request.set_device(v1::CPU);
  request.set_slots(1);
  request.set_name("bad name/with slash");
  EXPECT_EQ(state_->RegisterWorker(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.set_name("w");
  request.add_data_roots("relative/dir");
  auto relative = state_->RegisterWorker(request);
  EXPECT_EQ(relative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(relative.status().message().find("data_roots[0]"), std::string::npos);
}

TEST_F(CoordinatorStateTest, RegisterWorker_TooManySlotsOrDevices_InvalidArgument) {
  v1::RegisterWorkerRequest request;
  request.set_host("127.0.0.1");
  request.set_device(v1::CPU);
  request.set_name("w");
  request.set_slots(kMaxWorkerSlots + 1);
  auto slots = state_->RegisterWorker(request);
  EXPECT_EQ(slots.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(slots.status().message().find("slots must be in [1, 1024], got 1025"),
            std::string::npos)
      << slots.status();
  request.set_slots(1);
  for (int i = 0; i <= kMaxWorkerSlots; ++i) request.add_devices()->set_index(i);
  EXPECT_EQ(state_->RegisterWorker(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.clear_devices();
  request.set_slots(kMaxWorkerSlots);
  EXPECT_TRUE(state_->RegisterWorker(request).ok());
}

TEST_F(CoordinatorStateTest, RegisterWorker_PastTheLiveWorkerLimit_RefusedWithARetryDelay) {
  CoordinatorOptions options = Options();
  options.max_live_workers = 3;
  state_ = std::make_unique<CoordinatorState>(options);
  const std::string first = Register("w0", 1);
  Register("w1", 1);
  Register("w2", 1);
  v1::RegisterWorkerRequest request;
  request.set_host("127.0.0.1");
  request.set_device(v1::CPU);
  request.set_slots(2);
  request.set_name("one-too-many");
  auto refused = state_->RegisterWorker(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("--max_live_workers 3"), std::string::npos)
      << refused.status();
  // A fifth of the 10 s heartbeat timeout: about when room may free.
  EXPECT_EQ(WorkerRegistry::RetryAfterOf(refused.status()), 2'000);
  EXPECT_EQ(state_->RegisterWorker(request).status().code(),
            absl::StatusCode::kResourceExhausted);
  CoordinatorState::Overview overview = state_->GetOverview();
  EXPECT_EQ(overview.worker_registrations_refused_total["capacity"], 2u);
  EXPECT_EQ(overview.workers_refused_recently, 1u) << "the same worker, twice";
  EXPECT_NE(overview.last_worker_refusal.find("one-too-many"), std::string::npos);
  v1::ListWorkersResponse listed;  // What trainctl workers shows.
  state_->DescribeRefusals(&listed);
  EXPECT_EQ(listed.registrations_refused_for_capacity(), 2u);
  EXPECT_EQ(listed.max_live_workers(), 3);
  EXPECT_NE(listed.last_refusal().find("one-too-many: the coordinator has 3 live workers"),
            std::string::npos)
      << listed.last_refusal();
  // A job that needs the refused worker's slots says why it waits.
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = Spec(4);
  auto job = state_->SubmitJob(submit);
  ASSERT_TRUE(job.ok()) << job.status();
  auto pending = state_->GetJob(job->job_id());
  ASSERT_TRUE(pending.ok());
  EXPECT_NE(pending->pending_reason().find("; 1 worker refused for capacity lately"),
            std::string::npos)
      << pending->pending_reason();
  // A worker leaving makes room; the refused one gets in and takes the job.
  ASSERT_TRUE(Deregister(first, "test").ok());
  EXPECT_TRUE(state_->RegisterWorker(request).ok());
  EXPECT_EQ(StateOf(job->job_id()), v1::RUNNING);
}

// The default limit is sized for clusters of tens of thousands (it was a fixed 4,096), and
// registration finds a name's records without a walk of the table.
TEST_F(CoordinatorStateTest, RegisterWorker_TenThousandWorkers_AllRegister) {
  for (int i = 0; i < 10'000; ++i) Register(absl::StrCat("w", i), 1);
  EXPECT_EQ(state_->ListWorkers().size(), 10'000u);
  EXPECT_EQ(state_->GetOverview().worker_registrations_refused_total["capacity"], 0u);
}

// A job's ranks each carry its spec: a worker's poll answer is cut at 2 MiB of assignments
// (under its 4 MiB receive limit), and the next poll brings the rest at once.
TEST_F(CoordinatorStateTest, PollAssignments_LargeSpecsOnManySlots_ComeInAnswersOf2MiB) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(128);
  const std::string dir = "/" + std::string(3'990, 'd');
  v1::NpyData* npy = request.mutable_spec()->mutable_data()->mutable_npy();
  npy->set_features_path(dir + "/f.npy");
  npy->set_targets_path(dir + "/t.npy");
  request.mutable_spec()->mutable_eval_data()->set_features_path(dir + "/ef.npy");
  request.mutable_spec()->mutable_eval_data()->set_targets_path(dir + "/et.npy");
  request.mutable_spec()->set_init_checkpoint(dir + "/init.safetensors");
  request.mutable_spec()->set_output_checkpoint(dir + "/out.safetensors");
  request.mutable_spec()->set_checkpoint_dir(dir + "/checkpoints");
  auto submitted = state_->SubmitJob(request);  // Before any worker: paths checked at placement.
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string worker = Register("w", 128);
  std::vector<v1::Assignment> running;
  std::set<int> ranks;
  int answers = 0;
  while (ranks.size() < 128 && answers < 10) {
    v1::PollAssignmentsResponse poll = Poll(worker, running);
    ++answers;
    ASSERT_GT(poll.start_size(), 0) << "answer " << answers;
    EXPECT_LE(poll.ByteSizeLong(), kMaxPollAnswerBytes + 64'000);
    for (const v1::Assignment& start : poll.start()) {
      EXPECT_TRUE(ranks.insert(start.rank()).second) << "rank " << start.rank() << " twice";
      running.push_back(start);
    }
  }
  EXPECT_EQ(ranks.size(), 128u);
  EXPECT_GE(answers, 2) << "128 ranks of a ~28 KB spec do not fit in one 2 MiB answer";
  EXPECT_EQ(Poll(worker, running).start_size(), 0);
}

TEST_F(CoordinatorStateTest, ReportRankResult_OversizedChecksum_InvalidArgument) {
  const std::string worker = Register("w", 1);
  const std::string job = Submit(1);
  Poll(worker);
  v1::ReportRankResultRequest request;
  request.set_job_id(job);
  request.set_rank(0);
  request.set_attempt(1);
  request.set_rank_secret(RankSecret(job, 0));
  request.set_parameter_checksum(std::string(4 << 20, 'f'));
  auto status = state_->ReportRankResult(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("parameter_checksum must be at most 64 bytes"),
            std::string::npos)
      << status;
  EXPECT_EQ(StateOf(job), v1::RUNNING);
}

// ---- Scheduling, resources and bounds ----

TEST_F(CoordinatorStateTest, UnplaceableJob_DoesNotHoldBackPlaceableOnes_AndSaysWhyItWaits) {
  Register("w", 2);
  std::string big = Submit(3);
  std::string small = Submit(2);
  EXPECT_EQ(StateOf(big), v1::PENDING);
  EXPECT_EQ(StateOf(small), v1::RUNNING) << "backfill: the job behind an unplaceable one runs";
  EXPECT_EQ(state_->GetJob(big)->pending_reason(), "needs 3 cpu slots; 2 exist");
  std::string waits = Submit(1);
  EXPECT_EQ(state_->GetJob(waits)->pending_reason(), "needs 1 free cpu slots; 0 of 2 are free");
  EXPECT_EQ(state_->GetJob(small)->pending_reason(), "");
  std::string gpu = Submit(1, v1::CUDA);
  EXPECT_EQ(state_->GetJob(gpu)->pending_reason(), "no live cuda worker");
}

TEST_F(CoordinatorStateTest, QueueTimeout_FailsAWaitingJobWithItsReason) {
  Register("w", 1);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(2);
  request.mutable_spec()->set_queue_timeout_s(30);
  std::string job = state_->SubmitJob(request)->job_id();
  for (int second = 0; second < 30; ++second) {
    now_ms_ += 1'000;
    ASSERT_TRUE(Heartbeat("w#1").ok());
    state_->CheckLiveness();
  }
  EXPECT_EQ(StateOf(job), v1::PENDING);
  now_ms_ += 1'001;
  state_->CheckLiveness();
  v1::Job status = *state_->GetJob(job);
  EXPECT_EQ(status.state(), v1::FAILED);
  EXPECT_EQ(status.error(), "not placed within queue_timeout_s 30: needs 2 cpu slots; 1 exist");
}

TEST_F(CoordinatorStateTest, ModelBiggerThanEveryWorker_RefusedAtSubmitWithEstimate) {
  v1::RegisterWorkerRequest worker;
  worker.set_host("127.0.0.1");
  worker.set_name("small");
  worker.set_device(v1::CPU);
  worker.set_slots(2);
  worker.set_memory_bytes(int64_t{8} << 30);  // 4 GiB per rank
  ASSERT_TRUE(state_->RegisterWorker(worker).ok());
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(1);
  for (int i = 0; i < 2; ++i) request.mutable_spec()->mutable_model()->add_hidden_dims(1 << 20);
  auto refused = state_->SubmitJob(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("a rank needs about"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("TiB"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("offers 4.0 GiB per rank"), std::string::npos)
      << refused.status();
  *request.mutable_spec() = Spec(1);
  request.mutable_spec()->mutable_model()->set_input_dim(1024);
  request.mutable_spec()->set_micro_batch_size(1 << 24);
  EXPECT_EQ(state_->SubmitJob(request).status().code(), absl::StatusCode::kInvalidArgument);
  *request.mutable_spec() = Spec(1);
  auto fits = state_->SubmitJob(request);
  ASSERT_TRUE(fits.ok());
  EXPECT_GT(state_->GetJob(fits->job_id())->estimated_rank_memory_bytes(), 0);
}

TEST_F(CoordinatorStateTest, QueueIsBounded) {
  CoordinatorOptions options;
  options.now_ms = [this] { return now_ms_.load(); };
  options.max_pending_jobs = 3;
  state_ = std::make_unique<CoordinatorState>(options);
  for (int i = 0; i < 3; ++i) Submit(1);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(1);
  auto full = state_->SubmitJob(request);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("the limit is 3"), std::string::npos);
}

// Issue 27: 10,000 queued jobs of 1,024 ranks took the coordinator to 1.48 GB: each held
// per-rank state from its submit on.
TEST_F(CoordinatorStateTest, QueuedJob_HoldsNoPerRankState_UntilPlaced) {
  const std::string job = Submit(1024);
  EXPECT_EQ(state_->GetJob(job)->progress_size(), 0);
  const int64_t charged = state_->GetOverview().queued_bytes;
  EXPECT_GT(charged, 0);
  EXPECT_LT(charged, 8 << 10) << "a queued job of 1,024 ranks is charged " << charged;
  ASSERT_TRUE(state_->CancelJob(job).ok());
  EXPECT_EQ(state_->GetOverview().queued_bytes, 0);
  // Placed, it has its ranks' progress.
  Register("w", 2);
  const std::string placed = Submit(2);
  ASSERT_EQ(StateOf(placed), v1::RUNNING);
  EXPECT_EQ(state_->GetJob(placed)->progress_size(), 2);
  EXPECT_EQ(state_->GetOverview().queued_bytes, 0);
}

TEST_F(CoordinatorStateTest, QueueIsBoundedInBytes) {
  CoordinatorOptions options;
  options.now_ms = [this] { return now_ms_.load(); };
  options.max_pending_bytes = 64 << 10;
  state_ = std::make_unique<CoordinatorState>(options);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(1);
  std::vector<std::string> queued;
  absl::StatusOr<v1::SubmitJobResponse> submitted;
  while ((submitted = state_->SubmitJob(request)).ok()) {
    queued.push_back(submitted->job_id());
    ASSERT_LT(queued.size(), 100u) << "64 KiB holds no 100 of these";
  }
  EXPECT_EQ(submitted.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(submitted.status().message().find("the limit is 64.0 KiB (--max_pending_mib)"),
            std::string::npos)
      << submitted.status();
  EXPECT_LE(state_->GetOverview().queued_bytes, 64 << 10);
  EXPECT_GT(queued.size(), 5u);
  // A job that leaves the queue gives its bytes back.
  ASSERT_TRUE(state_->CancelJob(queued[0]).ok());
  EXPECT_TRUE(state_->SubmitJob(request).ok());
}

TEST_F(CoordinatorStateTest, QueueIsBoundedInBytesPerOwner) {
  CoordinatorOptions options;
  options.now_ms = [this] { return now_ms_.load(); };
  options.max_pending_bytes_per_owner = 24 << 10;
  state_ = std::make_unique<CoordinatorState>(options);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(1);
  absl::StatusOr<v1::SubmitJobResponse> submitted;
  int alice = 0;
  while ((submitted = state_->SubmitJob(request, "alice")).ok()) ASSERT_LT(++alice, 100);
  EXPECT_EQ(submitted.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(submitted.status().message().find("alice's waiting jobs hold"), std::string::npos)
      << submitted.status();
  EXPECT_NE(submitted.status().message().find("(--max_pending_mib_per_principal)"),
            std::string::npos)
      << submitted.status();
  EXPECT_GT(alice, 2);
  EXPECT_TRUE(state_->SubmitJob(request, "bob").ok()) << "alice's bytes took bob's place";
}

TEST_F(CoordinatorStateTest, QueueIsBoundedPerOwnerToo) {
  CoordinatorOptions options;
  options.now_ms = [this] { return now_ms_.load(); };
  options.max_pending_jobs = 10;
  options.max_pending_jobs_per_owner = 2;
  state_ = std::make_unique<CoordinatorState>(options);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = Spec(1);
  ASSERT_TRUE(state_->SubmitJob(request, "alice").ok());
  ASSERT_TRUE(state_->SubmitJob(request, "alice").ok());
  auto refused = state_->SubmitJob(request, "alice");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("alice has 2 jobs waiting"), std::string::npos)
      << refused.status();
  EXPECT_TRUE(state_->SubmitJob(request, "bob").ok()) << "alice's jobs took bob's place";
}

TEST_F(CoordinatorStateTest, FinishedJobs_AreEvictedByCountAndAge_AndTheirEventsTrimmed) {
  CoordinatorOptions options;
  options.now_ms = [this] { return now_ms_.load(); };
  options.max_finished_jobs = 2;
  options.finished_job_retention_ms = 60'000;
  options.max_events_per_finished_job = 3;
  state_ = std::make_unique<CoordinatorState>(options);
  std::vector<std::string> jobs;
  for (int i = 0; i < 4; ++i) {
    jobs.push_back(Submit(1));
    ASSERT_TRUE(state_->CancelJob(jobs.back()).ok());
  }
  state_->CheckLiveness();
  EXPECT_EQ(state_->GetJob(jobs[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(state_->GetJob(jobs[1]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(state_->GetJob(jobs[3]).ok());
  EXPECT_EQ(state_->ListJobs({})->jobs_size(), 2);
  now_ms_ += 61'000;
  state_->CheckLiveness();
  EXPECT_EQ(state_->ListJobs({})->jobs_size(), 0) << "too old";

  // A long job's telemetry history shrinks when it ends.
  std::string job = Submit(1);
  Register("w", 1);
  v1::ReportTelemetryRequest report;
  report.set_job_id(job);
  report.set_attempt(1);
  report.set_rank_secret(RankSecret(job, 0));
  for (int step = 1; step <= 10; ++step) report.add_records()->set_step(step);
  ASSERT_TRUE(state_->ReportTelemetry(report).ok());
  ReportResult(job, 0, "x");
  auto batch = state_->JobEventsSince(job, 0);
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(batch->events.size(), 3u);
  EXPECT_TRUE(batch->finished);
}

TEST_F(CoordinatorStateTest, ListJobs_PagesFiltersAndTrimsSpecs) {
  Register("w", 1);
  std::vector<std::string> jobs;
  for (int i = 0; i < 5; ++i) jobs.push_back(Submit(1));  // 1 running, 4 pending
  v1::ListJobsRequest request;
  request.set_page_size(2);
  std::vector<std::string> seen;
  for (int page = 0; page < 10; ++page) {
    auto response = state_->ListJobs(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_LE(response->jobs_size(), 2);
    for (const v1::Job& job : response->jobs()) {
      seen.push_back(job.job_id());
      EXPECT_EQ(job.spec().world_size(), 1);
      EXPECT_FALSE(job.spec().has_model()) << "specs are trimmed in listings";
    }
    if (response->next_page_token().empty()) break;
    request.set_page_token(response->next_page_token());
  }
  EXPECT_EQ(seen, jobs);
  v1::ListJobsRequest pending;
  pending.set_state(v1::PENDING);
  EXPECT_EQ(state_->ListJobs(pending)->jobs_size(), 4);
  v1::ListJobsRequest bad;
  bad.set_page_token("abc");
  EXPECT_EQ(state_->ListJobs(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.set_page_token("");
  bad.set_page_size(5000);
  EXPECT_EQ(state_->ListJobs(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorStateTest, LostWorkers_AreBounded) {
  CoordinatorOptions options;
  options.now_ms = [this] { return now_ms_.load(); };
  options.max_lost_workers = 2;
  state_ = std::make_unique<CoordinatorState>(options);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Deregister(Register("w" + std::to_string(i), 1), "bye").ok());
  state_->CheckLiveness();
  EXPECT_EQ(state_->ListWorkers().size(), 2u);
}

}  // namespace mptrain

namespace mptrain {
namespace {

// A one-slot CPU worker "w" and a one-rank job on it; the job's id ("" when either failed).
std::string StartOneRankJob(CoordinatorState* state) {
  v1::RegisterWorkerRequest worker;
  worker.set_host("127.0.0.1");
  worker.set_name("w");
  worker.set_device(v1::CPU);
  worker.set_slots(1);
  auto registered = state->RegisterWorker(worker);
  EXPECT_TRUE(registered.ok()) << registered.status();
  v1::SubmitJobRequest request;
  *request.mutable_spec() = CoordinatorStateTest::SmallSpec(1);
  auto submitted = state->SubmitJob(request);
  EXPECT_TRUE(submitted.ok()) << submitted.status();
  return registered.ok() && submitted.ok() ? submitted->job_id() : "";
}

// A long running job's history in the store is bounded too (max_stored_events_per_job, trimmed
// in steps of kStoredEventsTrimStep events).
TEST(CoordinatorStateStore, RunningJobsStoredEvents_AreTrimmedToTheLimit) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/trimmed_store_", getpid());
  std::filesystem::remove_all(dir);
  auto store = SqliteJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  CoordinatorOptions options;
  options.store = store->get();
  options.max_stored_events_per_job = 100;
  CoordinatorState state(options);
  ASSERT_TRUE(state.Restore().ok());
  const std::string job = StartOneRankJob(&state);
  ASSERT_FALSE(job.empty());
  int64_t step = 0;
  for (int report = 0; report < 12; ++report) {
    v1::ReportTelemetryRequest telemetry;
    telemetry.set_job_id(job);
    telemetry.set_attempt(1);
    telemetry.set_rank_secret(state.RankSecretForTesting(job, 1, 0));
    for (int i = 0; i < 1'000; ++i) telemetry.add_records()->set_step(++step);
    ASSERT_TRUE(state.ReportTelemetry(telemetry).ok());
  }
  ASSERT_EQ(state.GetJob(job)->state(), v1::RUNNING);
  auto stored = (*store)->LoadEvents(1, 0, 20'000);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_FALSE(stored->empty());
  // The trim at sequence 10,000 kept the newest 100; about 2,000 came after it.
  EXPECT_GT(stored->front().sequence(), 9'000);
  EXPECT_LT(stored->size(), 2'200u);
  std::filesystem::remove_all(dir);
}

// A coordinator restarted from its store knows which names its queued jobs hold.
TEST(CoordinatorStateStore, JobNames_StayTakenAcrossARestart) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/names_store_", getpid());
  std::filesystem::remove_all(dir);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = CoordinatorStateTest::SmallSpec(1);
  request.mutable_spec()->set_name("kept");
  std::string first;
  {
    auto store = SqliteJobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions options;
    options.store = store->get();
    CoordinatorState state(options);
    ASSERT_TRUE(state.Restore().ok());
    auto submitted = state.SubmitJob(request, "alice", false);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    first = submitted->job_id();
  }
  auto store = SqliteJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  CoordinatorOptions options;
  options.store = store->get();
  CoordinatorState state(options);
  ASSERT_TRUE(state.Restore().ok());
  auto again = state.SubmitJob(request, "alice", false);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_NE(again.status().message().find("taken by " + first), std::string::npos)
      << again.status();
  std::filesystem::remove_all(dir);
}

// A watcher's fetch returns a bounded batch, from where it left off, whatever the log holds.
TEST(JobEventLog, Since_StartsAfterTheSequence_AndStopsAtTheLimit) {
  JobEventLog log(100);
  for (int i = 0; i < 250; ++i) log.Append(v1::WatchJobEvent());
  EXPECT_EQ(log.Since(0).size(), 100u);  // The newest 100: 151..250.
  EXPECT_EQ(log.Since(0).front().sequence(), 151);
  auto some = log.Since(200, 10);
  ASSERT_EQ(some.size(), 10u);
  EXPECT_EQ(some.front().sequence(), 201);
  EXPECT_EQ(some.back().sequence(), 210);
  EXPECT_TRUE(log.Since(250).empty());
  EXPECT_EQ(log.Since(249, 10).size(), 1u);
}

// A store whose Load returns a given snapshot (a hand-edited or corrupt database's content).
class SnapshotStore final : public JobStore {
 public:
  explicit SnapshotStore(Snapshot snapshot) : snapshot_(std::move(snapshot)) {}
  absl::StatusOr<Snapshot> Load() override { return snapshot_; }
  absl::Status Commit(const Batch&) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<v1::WatchJobEvent>> LoadEvents(int64_t, int64_t, int) override {
    return std::vector<v1::WatchJobEvent>{};
  }

 private:
  Snapshot snapshot_;
};

// A stored job this build would not have written refuses the store (DATA_LOSS naming the job)
// instead of crashing the coordinator or reaching the workers.
TEST(CoordinatorStateStore, HostileStoredJobs_RefuseTheStoreWithDataLoss) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/hostile_store_", getpid());
  std::filesystem::remove_all(dir);
  JobStore::Snapshot valid;
  {
    auto store = SqliteJobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions options;
    options.store = store->get();
    CoordinatorState state(options);
    ASSERT_TRUE(state.Restore().ok());
    v1::SubmitJobRequest request;
    *request.mutable_spec() = CoordinatorStateTest::SmallSpec(2);
    ASSERT_TRUE(state.SubmitJob(request).ok());
    auto loaded = (*store)->Load();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    valid = *loaded;
  }
  std::filesystem::remove_all(dir);
  ASSERT_EQ(valid.jobs.size(), 1u);
  auto restore = [](JobStore::Snapshot snapshot) {
    SnapshotStore store(std::move(snapshot));
    CoordinatorOptions options;
    options.store = &store;
    CoordinatorState state(options);
    return state.Restore();
  };
  EXPECT_TRUE(restore(valid).ok()) << restore(valid);
  auto expect_refused = [&](JobStore::Snapshot snapshot, const std::string& fragment) {
    absl::Status status = restore(std::move(snapshot));
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_NE(status.message().find(fragment), std::string::npos) << status;
  };
  JobStore::Snapshot twice = valid;
  twice.jobs.push_back(twice.jobs[0]);
  expect_refused(twice, "its number appears twice");
  JobStore::Snapshot renamed = valid;
  renamed.jobs[0].mutable_job()->set_job_id("../../pwned");
  expect_refused(renamed, "its id is not job-0001");
  JobStore::Snapshot huge = valid;
  huge.specs[huge.jobs[0].number()].set_world_size(2147483647);
  expect_refused(huge, "its world_size 2147483647 is out of range");
  JobStore::Snapshot short_progress = valid;
  // A queued job has none (its ranks' progress comes with its placement); one of two is wrong.
  ASSERT_EQ(short_progress.jobs[0].job().progress_size(), 0);
  short_progress.jobs[0].mutable_job()->add_progress()->set_rank(0);
  expect_refused(short_progress, "it has progress for 1 ranks and a world of 2");
  JobStore::Snapshot counter = valid;
  counter.next_job_number = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(restore(counter).code(), absl::StatusCode::kDataLoss);

  // A spec an older build accepted and this one refuses: the job is failed, saying why; the
  // store and the coordinator go on.
  JobStore::Snapshot stricter = valid;
  stricter.specs[stricter.jobs[0].number()].set_progress_timeout_s(0.0001);
  SnapshotStore store(stricter);
  CoordinatorOptions options;
  options.store = &store;
  CoordinatorState state(options);
  ASSERT_TRUE(state.Restore().ok());
  auto job = state.GetJob(stricter.jobs[0].job().job_id());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_NE(job->error().find("its spec is not valid for this coordinator: progress_timeout_s"),
            std::string::npos)
      << job->error();
}

// After a restart, rank 0 may report a checkpoint before its worker has registered again:
// the checkpoint's holder is still that worker's name (it had become "", and a later restart
// put rank 0 on a worker without the file).
TEST(CoordinatorStateStore, CheckpointReportedBeforeItsWorkerReturns_KeepsItsHolder) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/holder_store_", getpid());
  std::filesystem::remove_all(dir);
  auto store = SqliteJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  CoordinatorOptions options;
  options.store = store->get();
  std::string job_id, secret;
  auto report = [&](CoordinatorState& state, int64_t step) {
    v1::ReportTelemetryRequest telemetry;
    telemetry.set_job_id(job_id);
    telemetry.set_attempt(1);
    telemetry.set_rank(0);
    telemetry.set_step(step);
    telemetry.set_rank_secret(secret);
    telemetry.set_checkpoint_step(step);
    telemetry.set_checkpoint_path(absl::StrCat("/ck/job/step-", step, ".safetensors"));
    return state.ReportTelemetry(telemetry).status();
  };
  {
    CoordinatorState state(options);
    ASSERT_TRUE(state.Restore().ok());
    v1::RegisterWorkerRequest worker;
    worker.set_host("127.0.0.1");
    worker.set_name("gpu0");
    worker.set_device(v1::CPU);
    worker.set_slots(1);
    worker.set_incarnation(1);
    worker.add_output_roots("/ck");
    ASSERT_TRUE(state.RegisterWorker(worker).ok());
    v1::SubmitJobRequest request;
    *request.mutable_spec() = CoordinatorStateTest::SmallSpec(1);
    request.mutable_spec()->set_steps(100);
    request.mutable_spec()->set_checkpoint_every(10);
    request.mutable_spec()->set_checkpoint_dir("/ck/job");
    auto submitted = state.SubmitJob(request);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    job_id = submitted->job_id();
    secret = state.RankSecretForTesting(job_id, 1, 0);
    ASSERT_FALSE(secret.empty()) << "the job must be placed";
    ASSERT_TRUE(report(state, 10).ok());
    EXPECT_EQ(state.GetJob(job_id)->latest_checkpoint_worker(), "gpu0");
  }
  CoordinatorState restored(options);
  ASSERT_TRUE(restored.Restore().ok());
  ASSERT_TRUE(report(restored, 20).ok());  // Before any worker has registered again.
  auto job = restored.GetJob(job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->latest_checkpoint_step(), 20);
  EXPECT_EQ(job->latest_checkpoint_worker(), "gpu0");
  std::filesystem::remove_all(dir);
}

// A rank that died while the coordinator was away is reported, once its worker has registered
// again, with the rank's secret: the job fails at once naming the signal, instead of waiting
// out adopt_grace_s and blaming the wrong rank. Without the rank's secret the report is ignored.
TEST(CoordinatorStateStore, RankExitDuringTheOutage_EndsTheWaitForItWithItsCause) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/exit_store_", getpid());
  std::filesystem::remove_all(dir);
  auto store = SqliteJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  CoordinatorOptions options;
  options.store = store->get();
  auto register_worker = [](CoordinatorState& state) {
    v1::RegisterWorkerRequest worker;
    worker.set_host("127.0.0.1");
    worker.set_name("cpu0");
    worker.set_device(v1::CPU);
    worker.set_slots(2);
    worker.set_incarnation(1);
    auto registered = state.RegisterWorker(worker);
    EXPECT_TRUE(registered.ok()) << registered.status();
    return registered.ok() ? *registered : v1::RegisterWorkerResponse();
  };
  std::string job_id, secrets[2];
  v1::Assignment assignments[2];
  {
    CoordinatorState state(options);
    ASSERT_TRUE(state.Restore().ok());
    v1::RegisterWorkerResponse worker = register_worker(state);
    v1::SubmitJobRequest request;
    *request.mutable_spec() = CoordinatorStateTest::SmallSpec(2);
    auto submitted = state.SubmitJob(request);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    job_id = submitted->job_id();
    v1::PollAssignmentsRequest poll;
    poll.set_worker_id(worker.worker_id());
    poll.set_incarnation(1);
    poll.set_worker_secret(worker.worker_secret());
    auto started = state.PollAssignments(poll);
    ASSERT_TRUE(started.ok()) << started.status();
    ASSERT_EQ(started->start_size(), 2);
    for (const v1::Assignment& assignment : started->start()) {
      assignments[assignment.rank()] = assignment;
    }
  }
  CoordinatorState restored(options);
  ASSERT_TRUE(restored.Restore().ok());
  v1::RegisterWorkerResponse worker = register_worker(restored);
  // Rank 1 is still running and is listed; rank 0 died meanwhile.
  v1::PollAssignmentsRequest poll;
  poll.set_worker_id(worker.worker_id());
  poll.set_incarnation(1);
  poll.set_worker_secret(worker.worker_secret());
  *poll.add_running() = assignments[1];
  ASSERT_TRUE(restored.PollAssignments(poll).ok());
  v1::ReportRankExitRequest exit;
  exit.set_worker_id(worker.worker_id());
  exit.set_worker_secret(worker.worker_secret());
  exit.set_job_id(job_id);
  exit.set_rank(0);
  exit.set_attempt(assignments[0].attempt());
  exit.set_term_signal(9);
  exit.set_rank_secret("0123456789abcdef0123456789abcdef");  // Not rank 0's.
  ASSERT_TRUE(restored.ReportRankExit(exit).ok());
  EXPECT_EQ(restored.GetJob(job_id)->state(), v1::RUNNING) << "a wrong secret proves nothing";
  exit.set_rank_secret(assignments[0].rank_secret());
  ASSERT_TRUE(restored.ReportRankExit(exit).ok());
  auto job = restored.GetJob(job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_NE(job->error().find("rank 0"), std::string::npos) << job->error();
  EXPECT_NE(job->error().find("killed by signal 9"), std::string::npos) << job->error();
  std::filesystem::remove_all(dir);
}

// The state writes through its store writer; a second state on the same store restores it.
TEST(CoordinatorStateStore, WhatAnsweredCallsChanged_IsInTheStoreAndRestores) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/state_store_", getpid());
  std::filesystem::remove_all(dir);
  auto store = SqliteJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  CoordinatorOptions options;
  options.store = store->get();
  std::string job_id;
  {
    CoordinatorState state(options);
    ASSERT_TRUE(state.Restore().ok());
    v1::SubmitJobRequest request;
    *request.mutable_spec() = CoordinatorStateTest::SmallSpec(1);
    auto submitted = state.SubmitJob(request);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    job_id = submitted->job_id();
    // The answer came back: the job is in the database now, writer thread or not.
    auto snapshot = (*store)->Load();
    ASSERT_TRUE(snapshot.ok());
    ASSERT_EQ(snapshot->jobs.size(), 1u);
    EXPECT_EQ(snapshot->jobs[0].job().job_id(), job_id);
    ASSERT_TRUE(state.CancelJob(job_id).ok());
  }
  CoordinatorState restored(options);
  ASSERT_TRUE(restored.Restore().ok());
  auto job = restored.GetJob(job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::CANCELLED);
  std::filesystem::remove_all(dir);
}

// Inside a DeferWrites scope (the gRPC layer's callback threads) a call does not wait for its
// write: it returns at once, and its answer and wake-ups go out from AfterWrite once the write
// is done. (A waiting callback thread stalled every RPC while a commit was slow.)
TEST(CoordinatorStateStore, DeferredWrites_ReturnAtOnce_AnswerAndWakeOnceWritten) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/deferred_store_", getpid());
  std::filesystem::remove_all(dir);
  auto sqlite = SqliteJobStore::Open(dir);
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  GatedJobStore store(sqlite->get());
  std::mutex mu;
  std::vector<std::string> woken;
  CoordinatorOptions options;
  options.store = &store;
  options.notify = [&](const std::vector<std::string>& keys) {
    std::lock_guard<std::mutex> lock(mu);
    woken.insert(woken.end(), keys.begin(), keys.end());
  };
  CoordinatorState state(options);
  ASSERT_TRUE(state.Restore().ok());
  const std::string job = StartOneRankJob(&state);
  auto was_woken = [&](const std::string& key) {
    std::lock_guard<std::mutex> lock(mu);
    return std::find(woken.begin(), woken.end(), key) != woken.end();
  };

  {
    std::lock_guard<std::mutex> lock(mu);
    woken.clear();  // The submit's and the placement's.
  }
  store.Close();
  CoordinatorState::Deferred deferred;
  {
    CoordinatorState::DeferWrites defer;
    auto cancelled = std::async(std::launch::async, [&] {
      CoordinatorState::DeferWrites inner;  // (The scope is per thread.)
      auto result = state.CancelJob(job);
      return std::make_pair(result.ok(), inner.Take());
    });
    const bool returned =
        cancelled.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    if (!returned) store.Open();  // So that the failure ends instead of hanging.
    ASSERT_TRUE(returned) << "a deferred call waited for its write";
    auto [ok, taken] = cancelled.get();
    EXPECT_TRUE(ok);
    deferred = std::move(taken);
  }
  ASSERT_NE(deferred.state, nullptr);
  EXPECT_FALSE(state.IsWritten(deferred.ticket));
  EXPECT_FALSE(was_woken(CoordinatorState::JobKey(job))) << "woken before the write";
  std::atomic<bool> answered{false};
  state.AfterWrite(std::move(deferred), [&] { answered = true; });
  EXPECT_FALSE(answered.load());
  store.Open();
  for (int i = 0; i < 500 && !answered.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(answered.load()) << "the answer never went out";
  EXPECT_TRUE(was_woken(CoordinatorState::JobKey(job)));
  std::filesystem::remove_all(dir);
}

// What a client is shown is written, as what it is told is: while a change is still being
// written, a read of it (status, a listing) waits for the write, and a watch's events and a
// key's value (read from the wait set's thread, which must not block) carry the write's ticket
// to be handed out once it is done. Before, a status could show a job CANCELLED that a crash
// in that moment would bring back RUNNING.
TEST(CoordinatorStateStore, AChangeBeingWritten_IsShownOnlyOnceWritten) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/gated_store_", getpid());
  std::filesystem::remove_all(dir);
  auto sqlite = SqliteJobStore::Open(dir);
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  GatedJobStore store(sqlite->get());
  CoordinatorOptions options;
  options.store = &store;
  CoordinatorState state(options);
  ASSERT_TRUE(state.Restore().ok());
  const std::string job = StartOneRankJob(&state);
  ASSERT_EQ(state.GetJob(job)->state(), v1::RUNNING);
  const auto blocked = std::chrono::milliseconds(300);

  // A key being written: its value comes with an unwritten ticket.
  store.Close();
  v1::KeyValueSetRequest set;
  set.set_job_id(job);
  set.set_attempt(1);
  set.set_rank(0);
  set.set_rank_secret(state.RankSecretForTesting(job, 1, 0));
  set.set_key("nccl_unique_id");
  set.set_value("id");
  auto setting = std::async(std::launch::async, [&] { return state.KeyValueSet(set); });
  if (!store.AwaitHeldCommit()) {
    store.Open();  // So that what waits for it ends.
    FAIL() << "no write reached the store";
  }
  v1::KeyValueGetRequest get;
  get.set_job_id(job);
  get.set_attempt(1);
  get.set_rank(0);
  get.set_rank_secret(set.rank_secret());
  get.set_key("nccl_unique_id");
  auto read = state.KeyValueGet(get);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->value.has_value());
  EXPECT_FALSE(state.IsWritten(read->ticket)) << "a value still being written is handed out";
  auto status = std::async(std::launch::async, [&] { return state.GetJob(job); });
  EXPECT_EQ(status.wait_for(blocked), std::future_status::timeout)
      << "a read answered while a change it shows was being written";
  EXPECT_EQ(setting.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  store.Open();
  EXPECT_TRUE(setting.get().ok());
  EXPECT_TRUE(status.get().ok());
  EXPECT_TRUE(state.IsWritten(read->ticket));

  // A cancel being written: its event comes with an unwritten ticket; a listing waits.
  auto before = state.JobEventsSince(job, 0);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_TRUE(state.IsWritten(before->ticket));
  const int64_t seen = before->events.empty() ? 0 : before->events.back().sequence();
  store.Close();
  auto cancelling = std::async(std::launch::async, [&] { return state.CancelJob(job); });
  if (!store.AwaitHeldCommit()) {
    store.Open();  // So that what waits for it ends.
    FAIL() << "no write reached the store";
  }
  auto events = state.JobEventsSince(job, seen);
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_TRUE(events->finished);
  EXPECT_FALSE(state.IsWritten(events->ticket)) << "an event still being written is handed out";
  auto listing = std::async(std::launch::async, [&] { return state.ListJobs({}); });
  EXPECT_EQ(listing.wait_for(blocked), std::future_status::timeout);
  // Monitoring (the dashboard) sees memory at once: it must answer while a write hangs.
  auto live = state.GetJob(job, CoordinatorState::View::kLive);
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(live->state(), v1::CANCELLED);
  store.Open();
  ASSERT_TRUE(cancelling.get().ok());
  auto listed = listing.get();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->jobs_size(), 1);
  EXPECT_EQ(listed->jobs(0).state(), v1::CANCELLED);
  EXPECT_TRUE(state.IsWritten(events->ticket));

  // A retried submit (same request id, its first answer lost to a deadline) is told OK only
  // once the job is written; so is a repeated key set of the same value.
  store.Close();
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = CoordinatorStateTest::SmallSpec(1);
  submit.set_request_id("retried");
  auto first = std::async(std::launch::async, [&] { return state.SubmitJob(submit); });
  if (!store.AwaitHeldCommit()) {
    store.Open();  // So that what waits for it ends.
    FAIL() << "no write reached the store";
  }
  auto retry = std::async(std::launch::async, [&] { return state.SubmitJob(submit); });
  EXPECT_EQ(retry.wait_for(blocked), std::future_status::timeout)
      << "a retried submit answered before its job was written";
  store.Open();
  ASSERT_TRUE(first.get().ok());
  auto retried = retry.get();
  ASSERT_TRUE(retried.ok()) << retried.status();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mptrain

namespace mptrain {
namespace {

// Rank output outlives a coordinator restart once the rank or the job ended (the store keeps
// the tails), and an ended job's tails read as complete, so `trainctl logs --follow` returns.
TEST_F(CoordinatorStateTest, EndedJobsRankLogs_OutliveARestart_AndReadComplete) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/rank_logs_", getpid());
  std::filesystem::remove_all(dir);
  auto store = SqliteJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  CoordinatorOptions options;
  options.heartbeat_timeout_ms = 10'000;
  options.now_ms = [this] { return now_ms_.load(); };
  options.store = store->get();
  state_ = std::make_unique<CoordinatorState>(options);
  ASSERT_TRUE(state_->Restore().ok());
  const std::string job = Submit(3);
  const std::string worker = Register("w", 3);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  auto ship = [&](int rank, int64_t offset, const std::string& data) {
    v1::ReportRankLogRequest request;
    request.set_worker_id(worker);
    request.set_worker_secret(worker_secrets_[worker]);
    request.set_job_id(job);
    request.set_attempt(1);
    request.set_rank(rank);
    request.set_offset(offset);
    request.set_data(data);
    return state_->ReportRankLog(request);
  };
  ASSERT_TRUE(ship(0, 0, "rank 0/3 on cpu\n").ok());
  ASSERT_TRUE(ship(1, 0, "rank 1/3 on cpu\nstep 100\n").ok());
  v1::GetRankLogRequest read;
  read.set_job_id(job);
  read.set_rank(2);
  auto none = state_->GetRankLog(read);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("yet"), std::string::npos) << none.status();

  ReportExit(worker, job, 1, 1, 9);  // Rank 1 killed: the job fails.
  ASSERT_EQ(StateOf(job), v1::FAILED);
  ASSERT_TRUE(ship(0, 16, "stopping\n").ok());  // Rank 0's last words, after the end.

  state_ = std::make_unique<CoordinatorState>(options);  // The old one has written all.
  ASSERT_TRUE(state_->Restore().ok());
  read.set_rank(1);
  auto killed = state_->GetRankLog(read);
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_EQ(killed->data(), "rank 1/3 on cpu\nstep 100\n");
  EXPECT_EQ(killed->attempt(), 1);
  EXPECT_TRUE(killed->complete());
  read.set_rank(0);
  auto stopped = state_->GetRankLog(read);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->data(), "rank 0/3 on cpu\nstopping\n");
  EXPECT_TRUE(stopped->complete());
  // Nothing kept of rank 2, and nothing will come: said so, not "yet".
  read.set_rank(2);
  none = state_->GetRankLog(read);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("ended (FAILED)"), std::string::npos) << none.status();
  EXPECT_EQ(none.status().message().find("yet"), std::string::npos) << none.status();
  state_.reset();
  std::filesystem::remove_all(dir);
}

// The RPCs added for logs and history refuse what a hostile caller sends.
TEST_F(CoordinatorStateTest, RankLogAndJobEvents_RefuseHostileRequests) {
  const std::string job = Submit(1);
  const std::string worker = Register("w", 1);
  const std::string other = Register("x", 1);
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  const std::string runs = state_->GetJob(job)->placement(0).worker_id();
  const std::string idle = runs == worker ? other : worker;
  v1::ReportRankLogRequest log;
  log.set_job_id(job);
  log.set_rank(0);
  log.set_attempt(1);
  log.set_data("hello\n");
  log.set_worker_id(runs);
  log.set_worker_secret("wrong");
  EXPECT_EQ(state_->ReportRankLog(log).code(), absl::StatusCode::kPermissionDenied);
  log.set_worker_id(idle);  // A real worker speaking for a rank it does not run.
  log.set_worker_secret(worker_secrets_[idle]);
  EXPECT_EQ(state_->ReportRankLog(log).code(), absl::StatusCode::kPermissionDenied);
  log.set_worker_id(runs);
  log.set_worker_secret(worker_secrets_[runs]);
  log.set_data(std::string(RankLogs::kMaxChunkBytes + 1, 'x'));
  EXPECT_EQ(state_->ReportRankLog(log).code(), absl::StatusCode::kInvalidArgument);
  log.set_data("hello\n");
  ASSERT_TRUE(state_->ReportRankLog(log).ok());
  v1::GetRankLogRequest read;
  read.set_job_id(job);
  read.set_rank(0);
  EXPECT_EQ(state_->GetRankLog(read)->data(), "hello\n");
  read.set_rank(7);
  EXPECT_EQ(state_->GetRankLog(read).status().code(), absl::StatusCode::kInvalidArgument);

  v1::GetJobEventsRequest events;
  events.set_job_id(job);
  events.set_max_events(10'001);
  EXPECT_EQ(state_->GetJobEvents(events).status().code(), absl::StatusCode::kInvalidArgument);
  events.set_max_events(-1);
  EXPECT_EQ(state_->GetJobEvents(events).status().code(), absl::StatusCode::kInvalidArgument);
  events.set_max_events(0);
  events.set_after_sequence(std::numeric_limits<int64_t>::max());  // after + 1 must not wrap.
  auto none = state_->GetJobEvents(events);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->events_size(), 0);
  events.set_after_sequence(0);
  events.set_job_id("job-9999");
  EXPECT_EQ(state_->GetJobEvents(events).status().code(), absl::StatusCode::kNotFound);
}

// However often a job restarts, its record holds the rank secrets of two attempts: the current
// one and the one before (whose ranks may still send their last output).
TEST_F(CoordinatorStateTest, RankSecrets_OfTheLastTwoAttemptsOnly_OlderOnesAreOver) {
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = Spec(2);
  submit.mutable_spec()->set_max_restarts(5);
  std::string job = state_->SubmitJob(submit)->job_id();
  std::string worker = Register("w", 2);
  const std::string first = RankSecret(job, 0, 1);
  for (int attempt = 1; attempt <= 3; ++attempt) {
    ASSERT_EQ(StateOf(job), v1::RUNNING);
    ReportExit(worker, job, 1, attempt, 9);
    ReportExit(worker, job, 0, attempt, 15);
  }
  ASSERT_EQ(StateOf(job), v1::RUNNING);
  ASSERT_EQ(state_->GetJob(job)->restarts(), 3);
  v1::ReportRankResultRequest result;
  result.set_job_id(job);
  result.set_rank(0);
  result.set_parameter_checksum("0123456789abcdef");
  result.set_attempt(1);
  result.set_rank_secret(first);
  EXPECT_EQ(state_->ReportRankResult(result).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(RankSecret(job, 0, 2).empty());
  ASSERT_FALSE(RankSecret(job, 0, 3).empty());
  result.set_attempt(3);
  result.set_rank_secret(RankSecret(job, 0, 3));
  EXPECT_TRUE(state_->ReportRankResult(result).ok()) << "attempt 3 is over, its secret still known";
  result.set_rank_secret("forged");
  EXPECT_EQ(state_->ReportRankResult(result).code(), absl::StatusCode::kPermissionDenied);
}

// A store that counts what is written through it.
class CountingStore final : public JobStore {
 public:
  explicit CountingStore(JobStore* inner) : inner_(inner) {}
  absl::StatusOr<Snapshot> Load() override { return inner_->Load(); }
  absl::Status Commit(const Batch& batch) override {
    record_writes += static_cast<int>(batch.jobs.size());
    kv_writes += static_cast<int>(batch.kv_writes.size());
    return inner_->Commit(batch);
  }
  absl::StatusOr<std::vector<v1::WatchJobEvent>> LoadEvents(int64_t number, int64_t after,
                                                            int limit) override {
    return inner_->LoadEvents(number, after, limit);
  }
  std::atomic<int> record_writes{0};
  std::atomic<int> kv_writes{0};

 private:
  JobStore* inner_;
};

// A key-value set writes that key alone (not the job's whole record, key-value store included,
// as before: quadratic in the keys), and the keys survive a restart of the coordinator.
TEST(CoordinatorStateStore, KeyValueSet_WritesTheKeyAlone_AndTheKeysSurviveARestart) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/kv_store_", getpid());
  std::filesystem::remove_all(dir);
  auto sqlite = SqliteJobStore::Open(dir);
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  CountingStore store(sqlite->get());
  std::string job;
  {
    CoordinatorOptions options;
    options.store = &store;
    CoordinatorState state(options);
    ASSERT_TRUE(state.Restore().ok());
    job = StartOneRankJob(&state);
    ASSERT_FALSE(job.empty());
    ASSERT_EQ(state.GetJob(job)->state(), v1::RUNNING);
    const int records_before = store.record_writes;
    for (int key = 0; key < 200; ++key) {
      v1::KeyValueSetRequest set;
      set.set_job_id(job);
      set.set_attempt(1);
      set.set_rank(0);
      set.set_rank_secret(state.RankSecretForTesting(job, 1, 0));
      set.set_key(absl::StrCat("rank_", key));
      set.set_value(std::string(1000, 'a' + key % 26));
      ASSERT_TRUE(state.KeyValueSet(set).ok());
      ASSERT_TRUE(state.KeyValueSet(set).ok()) << "a retry with the same value";
    }
    EXPECT_EQ(store.record_writes, records_before) << "a key-value set rewrote the job record";
    EXPECT_EQ(store.kv_writes, 200);
  }
  CoordinatorOptions options;
  options.store = &store;
  CoordinatorState restarted(options);
  ASSERT_TRUE(restarted.Restore().ok());
  v1::KeyValueGetRequest get;
  get.set_job_id(job);
  get.set_attempt(1);
  get.set_rank(0);
  get.set_rank_secret(restarted.RankSecretForTesting(job, 1, 0));
  get.set_key("rank_127");
  auto value = restarted.KeyValueGet(get);
  ASSERT_TRUE(value.ok()) << value.status();
  ASSERT_TRUE(value->value.has_value()) << "the key did not survive the restart";
  EXPECT_EQ(*value->value, std::string(1000, 'a' + 127 % 26));
  std::filesystem::remove_all(dir);
}

// An older build kept the key-value store inside the job's record: a restart moves it to the
// store's key-value table (and rewrites the record without it).
TEST(CoordinatorStateStore, KeyValueInAnOlderRecord_IsReadAndMovedToItsTable) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/kv_legacy_", getpid());
  std::filesystem::remove_all(dir);
  auto sqlite = SqliteJobStore::Open(dir);
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  std::string job;
  {
    CoordinatorOptions options;
    options.store = sqlite->get();
    CoordinatorState state(options);
    ASSERT_TRUE(state.Restore().ok());
    job = StartOneRankJob(&state);
  }
  // The record as an older build wrote it.
  auto snapshot = (*sqlite)->Load();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->jobs.size(), 1u);
  store::StoredJob old = snapshot->jobs[0];
  ASSERT_EQ(old.attempt(), 1);
  (*old.mutable_kv())["nccl_unique_id"] = "legacy-id";
  JobStore::Batch rewrite;
  rewrite.jobs.push_back(old);
  ASSERT_TRUE((*sqlite)->Commit(rewrite).ok());

  for (int restart = 0; restart < 2; ++restart) {
    SCOPED_TRACE(absl::StrCat("restart ", restart));
    CoordinatorOptions options;
    options.store = sqlite->get();
    CoordinatorState state(options);
    ASSERT_TRUE(state.Restore().ok());
    v1::KeyValueGetRequest get;
    get.set_job_id(job);
    get.set_attempt(1);
    get.set_rank(0);
    get.set_rank_secret(state.RankSecretForTesting(job, 1, 0));
    get.set_key("nccl_unique_id");
    auto value = state.KeyValueGet(get);
    ASSERT_TRUE(value.ok()) << value.status();
    ASSERT_TRUE(value->value.has_value());
    EXPECT_EQ(*value->value, "legacy-id");
  }
  auto moved = (*sqlite)->Load();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_TRUE(moved->jobs[0].kv().empty()) << "the record still carries the key-value store";
  ASSERT_EQ(moved->kv[1].size(), 1u);
  EXPECT_EQ(moved->kv[1][0].key, "nccl_unique_id");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mptrain
