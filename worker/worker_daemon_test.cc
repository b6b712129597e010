#include "worker/worker_daemon.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

// A coordinator for one worker: registers it as w#N (N counting registrations; heartbeats every
// 100 ms, `heartbeat_timeout_ms`), answers heartbeats, exits, log chunks and deregistration OK,
// and answers polls after 50 ms with nothing. The fakes below change what their test is about.
class FakeCoordinator : public v1::WorkerControl::Service {
 public:
  explicit FakeCoordinator(int64_t heartbeat_timeout_ms = 60'000)
      : heartbeat_timeout_ms_(heartbeat_timeout_ms) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    response->set_worker_id(absl::StrCat("w#", registrations.fetch_add(1) + 1));
    response->set_worker_secret("secret");
    response->set_heartbeat_interval_ms(100);
    response->set_heartbeat_timeout_ms(heartbeat_timeout_ms_);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status PollAssignments(grpc::ServerContext*, const v1::PollAssignmentsRequest*,
                               v1::PollAssignmentsResponse*) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return grpc::Status::OK;
  }
  grpc::Status ReportRankExit(grpc::ServerContext*, const v1::ReportRankExitRequest*,
                              v1::ReportRankExitResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status ReportRankLog(grpc::ServerContext*, const v1::ReportRankLogRequest*,
                             v1::ReportRankLogResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status DeregisterWorker(grpc::ServerContext*, const v1::DeregisterWorkerRequest*,
                                v1::DeregisterWorkerResponse*) override {
    return grpc::Status::OK;
  }
  std::atomic<int> registrations{0};

 protected:
  // Holds a call until the client cancels it or `limit` passes (an answer that does not come).
  static void Hold(grpc::ServerContext* context,
                   std::chrono::milliseconds limit = std::chrono::hours(1)) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!context->IsCancelled() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // Starts for ranks 0..count-1 of one job, rank r on slot r.
  static void AddStarts(int count, v1::PollAssignmentsResponse* response) {
    for (int rank = 0; rank < count; ++rank) {
      v1::Assignment* start = response->add_start();
      start->set_job_id("job-0001");
      start->set_rank(rank);
      start->set_attempt(1);
      start->set_world_size(count);
      start->set_device_index(rank);
      start->set_rank_secret("rank-secret");
    }
  }

 private:
  const int64_t heartbeat_timeout_ms_;
};

// A coordinator that registers the worker once, then forgets it (its heartbeats answer
// NOT_FOUND, as after a restart without its store) and refuses every registration after that
// for good (UNAUTHENTICATED: a token it no longer takes).
class ForgettingCoordinator final : public FakeCoordinator {
 public:
  ForgettingCoordinator() : FakeCoordinator(500) {}
  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    if (registrations.load() > 0) {
      registrations.fetch_add(1);
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "this token is not taken any more");
    }
    return FakeCoordinator::RegisterWorker(context, request, response);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker w#1; register again");
  }
};

// An in-process server for `service`.
std::unique_ptr<grpc::Server> Serve(grpc::Service* service) {
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// A daemon that starts no rank processes.
WorkerOptions TestOptions() {
  WorkerOptions options;
  options.coordinator = "in-process";
  options.name = "w";
  options.work_dir = ::testing::TempDir();
  options.rank_executable = "/bin/false";
  options.warm_ranks = false;
  return options;
}

// Runs a daemon on `stub` until `done()` holds or `limit` passes, then stops it and waits for
// its Run to end (before the caller's servers go: an in-process channel must not outlive its
// server). False when Run did not end within 30 s.
bool RunDaemonUntil(const WorkerOptions& options,
                    std::shared_ptr<v1::WorkerControl::StubInterface> stub,
                    const std::function<bool()>& done,
                    std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  auto daemon = std::make_shared<WorkerDaemon>(options, std::move(stub));
  auto stop = std::make_shared<std::atomic<bool>>(false);
  auto run = std::async(std::launch::async, [daemon, stop] { return daemon->Run(stop.get()); });
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop->store(true);
  return run.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
}

// A registration refused for good ends the daemon with that error. (Its other loops waited
// for the stop flag alone, and the daemon hung for ever in Run.)
TEST(WorkerDaemon, RegistrationRefusedForGood_RunEndsWithTheError) {
  ForgettingCoordinator coordinator;
  std::unique_ptr<grpc::Server> server = Serve(&coordinator);
  WorkerOptions options = TestOptions();
  options.fence_after_ms = 0;
  auto daemon = std::make_shared<WorkerDaemon>(
      options, v1::WorkerControl::NewStub(server->InProcessChannel({})));
  auto stop = std::make_shared<std::atomic<bool>>(false);
  auto run = std::async(std::launch::async, [daemon, stop] { return daemon->Run(stop.get()); });
  const bool ended = run.wait_for(std::chrono::seconds(15)) == std::future_status::ready;
  stop->store(true);  // So that a failure ends instead of hanging.
  ASSERT_TRUE(ended) << "Run did not end after its registration was refused for good";
  const absl::Status status = run.get();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_GE(coordinator.registrations.load(), 2);
  server->Shutdown();
}


// One coordinator behind two connections: the first answers the registration, then holds
// every call (its answers lost, as in a one-way outage); the other answers.
struct SharedCoordinator {
  std::atomic<bool> registered{false};
  std::atomic<int> held_polls{0};
  std::atomic<int> answered_polls{0};
  std::atomic<int> answered_heartbeats{0};
};

class OneConnection final : public FakeCoordinator {
 public:
  OneConnection(SharedCoordinator* shared, bool holds)
      : FakeCoordinator(3'000), shared_(shared), holds_(holds) {}
  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    shared_->registered.store(true);
    return FakeCoordinator::RegisterWorker(context, request, response);
  }
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    if (holds_) {
      Hold(context);
      return grpc::Status(grpc::StatusCode::CANCELLED, "held");
    }
    shared_->answered_heartbeats.fetch_add(1);
    return grpc::Status::OK;
  }
  grpc::Status PollAssignments(grpc::ServerContext* context,
                               const v1::PollAssignmentsRequest* request,
                               v1::PollAssignmentsResponse* response) override {
    if (holds_) {
      shared_->held_polls.fetch_add(1);
      Hold(context);
      return grpc::Status(grpc::StatusCode::CANCELLED, "held");
    }
    shared_->answered_polls.fetch_add(1);
    return FakeCoordinator::PollAssignments(context, request, response);
  }

 private:
  SharedCoordinator* shared_;
  bool holds_;
};

// The connection in use stops answering: heartbeats try fresh ones, and the first answered
// one carries every call from then on — the poll held on the old one is cancelled and sent
// again at once on the new one. (Calls stayed on the old connection, whose retransmissions
// had backed off: a self-fenced rank's exit reached the coordinator too late to name the cause
// of its job's failure.)
TEST(WorkerDaemon, ConnectionStopsAnswering_CallsMoveToAFreshOneThatDoes) {
  SharedCoordinator shared;
  OneConnection held(&shared, /*holds=*/true);
  OneConnection answering(&shared, /*holds=*/false);
  std::unique_ptr<grpc::Server> held_server = Serve(&held);
  std::unique_ptr<grpc::Server> answering_server = Serve(&answering);

  WorkerOptions options = TestOptions();
  options.fresh_stub = [&]() -> std::shared_ptr<v1::WorkerControl::StubInterface> {
    return v1::WorkerControl::NewStub(answering_server->InProcessChannel({}));
  };
  ASSERT_TRUE(RunDaemonUntil(options,
                             v1::WorkerControl::NewStub(held_server->InProcessChannel({})),
                             [&] { return shared.answered_polls.load() > 0; },
                             std::chrono::seconds(5)));
  const bool moved = shared.answered_polls.load() > 0;
  held_server->Shutdown(std::chrono::system_clock::now());
  answering_server->Shutdown(std::chrono::system_clock::now());
  EXPECT_TRUE(shared.registered.load());
  EXPECT_GE(shared.held_polls.load(), 1) << "the first poll went on the first connection";
  EXPECT_GE(shared.answered_heartbeats.load(), 1);
  EXPECT_TRUE(moved) << "no poll reached the answering connection within 5 s (held polls: "
                     << shared.held_polls.load() << ")";
}

// Hands out `ranks` ranks of one job at its first poll (rank r on slot r), holds every later
// poll for 15 s unless cancelled, and answers each rank's first exit report UNAVAILABLE (as if
// the coordinator could not be reached); rank 0's second report is answered only after
// `rank0_retry_ms`.
class ExitsUnreachableOnce final : public FakeCoordinator {
 public:
  ExitsUnreachableOnce(int ranks, int rank0_retry_ms)
      : ranks_(ranks), rank0_retry_ms_(rank0_retry_ms) {}
  grpc::Status PollAssignments(grpc::ServerContext* context, const v1::PollAssignmentsRequest*,
                               v1::PollAssignmentsResponse* response) override {
    if (polls.fetch_add(1) == 0) {
      AddStarts(ranks_, response);
      return grpc::Status::OK;
    }
    Hold(context, std::chrono::seconds(15));
    return grpc::Status::OK;
  }
  grpc::Status ReportRankExit(grpc::ServerContext*, const v1::ReportRankExitRequest* request,
                              v1::ReportRankExitResponse*) override {
    int report;
    {
      std::lock_guard<std::mutex> lock(mu);
      reports[request->rank()].push_back(std::chrono::steady_clock::now());
      report = static_cast<int>(reports[request->rank()].size());
    }
    if (report == 1) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not now");
    if (request->rank() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(rank0_retry_ms_));
    }
    return grpc::Status::OK;
  }
  size_t Reported(int rank) {
    std::lock_guard<std::mutex> lock(mu);
    return reports[rank].size();
  }
  std::atomic<int> polls{0};
  std::mutex mu;
  std::map<int, std::vector<std::chrono::steady_clock::time_point>> reports;  // rank -> times

 private:
  const int ranks_;
  const int rank0_retry_ms_;
};

// An exit the coordinator could not be told of is reported again at once, not after the long
// poll in flight ends (up to 20 s, while the coordinator waits for this very exit to name the
// cause of a job's failure).
TEST(WorkerDaemon, AnExitNotReported_IsReportedAgainWithoutWaitingForThePoll) {
  ExitsUnreachableOnce coordinator(/*ranks=*/1, /*rank0_retry_ms=*/0);
  std::unique_ptr<grpc::Server> server = Serve(&coordinator);
  WorkerOptions options = TestOptions();
  options.fence_after_ms = 0;
  ASSERT_TRUE(RunDaemonUntil(options, v1::WorkerControl::NewStub(server->InProcessChannel({})),
                             [&] { return coordinator.Reported(0) >= 2; }));
  server->Shutdown(std::chrono::system_clock::now());
  std::lock_guard<std::mutex> lock(coordinator.mu);
  const auto& reports = coordinator.reports[0];
  ASSERT_EQ(reports.size(), 2u) << "the exit was not reported again within 10 s";
  const double gap_s = std::chrono::duration<double>(reports[1] - reports[0]).count();
  EXPECT_LT(gap_s, 5.0) << "reported again only " << gap_s << " s later";
}

// Forgets the worker's first registration: its first heartbeat is answered NOT_FOUND late
// (1.5 s), its second at once; every later registration is known.
class LateForgettingCoordinator final : public FakeCoordinator {
 public:
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override {
    if (request->worker_id() != "w#1") return grpc::Status::OK;
    if (first_heartbeats.fetch_add(1) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1'500));
      late_answer_sent.store(true);
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker w#1; register again");
  }
  std::atomic<int> first_heartbeats{0};
  std::atomic<bool> late_answer_sent{false};
};

// A late answer for a registration the worker has already replaced changes nothing: it does
// not register again. (It did, and stopped heartbeating meanwhile: the coordinator declared
// a healthy worker lost.)
TEST(WorkerDaemon, ALateNotFoundForAReplacedRegistration_IsIgnored) {
  LateForgettingCoordinator coordinator;
  std::unique_ptr<grpc::Server> server = Serve(&coordinator);
  WorkerOptions options = TestOptions();
  options.fence_after_ms = 0;
  // Until half a second after the late answer (its effect, if any).
  std::optional<std::chrono::steady_clock::time_point> answered;
  ASSERT_TRUE(RunDaemonUntil(options, v1::WorkerControl::NewStub(server->InProcessChannel({})),
                             [&] {
                               const auto now = std::chrono::steady_clock::now();
                               if (!answered && coordinator.late_answer_sent.load()) answered = now;
                               return answered && now - *answered > std::chrono::milliseconds(500);
                             }));
  server->Shutdown(std::chrono::system_clock::now());
  EXPECT_TRUE(coordinator.late_answer_sent.load()) << "the test did not run as intended";
  EXPECT_GE(coordinator.first_heartbeats.load(), 2) << "the test did not run as intended";
  EXPECT_EQ(coordinator.registrations.load(), 2)
      << "registered again after a late answer for its first, replaced registration";
}

// An exit queued while the main loop is reporting earlier ones (not polling: nothing to end)
// is reported before the loop polls again. (It waited for the whole next poll, 15 s here.)
TEST(WorkerDaemon, AnExitQueuedWhileOthersAreReported_IsReportedBeforeThePoll) {
  const std::string script = ::testing::TempDir() + "/rank_exits.sh";
  {
    std::ofstream out(script);
    out << "#!/bin/sh\ncase \"$*\" in *-rank1-*) sleep 0.5;; esac\nexit 1\n";
  }
  ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  // Rank 0 exits at once, rank 1 half a second later (the rank executable looks at its
  // assignment file's name); rank 0's report from the queue is held 1.5 s, so that rank 1's
  // report fails while the main loop is not polling.
  ExitsUnreachableOnce coordinator(/*ranks=*/2, /*rank0_retry_ms=*/1'500);
  std::unique_ptr<grpc::Server> server = Serve(&coordinator);
  WorkerOptions options = TestOptions();
  options.slots = 2;
  options.fence_after_ms = 0;
  options.rank_executable = script;
  ASSERT_TRUE(RunDaemonUntil(options, v1::WorkerControl::NewStub(server->InProcessChannel({})),
                             [&] { return coordinator.Reported(1) >= 2; }));
  server->Shutdown(std::chrono::system_clock::now());
  std::lock_guard<std::mutex> lock(coordinator.mu);
  ASSERT_EQ(coordinator.reports[0].size(), 2u);
  ASSERT_GE(coordinator.reports[1].size(), 1u);
  // Rank 1's first report failed while rank 0's second was held (the case this is about).
  EXPECT_LT(coordinator.reports[1][0], coordinator.reports[0][1] + std::chrono::milliseconds(1'500));
  ASSERT_EQ(coordinator.reports[1].size(), 2u) << "rank 1's exit was not reported again in 10 s";
  const double gap_s =
      std::chrono::duration<double>(coordinator.reports[1][1] - coordinator.reports[1][0]).count();
  EXPECT_LT(gap_s, 5.0) << "reported again only " << gap_s << " s later";
}

// Records every heartbeat; holds polls (so that only heartbeats count as contact) and, with
// `refuse_usage`, answers a heartbeat carrying usage INVALID_ARGUMENT, as a coordinator whose
// bounds the usage breaks.
class UsageCoordinator final : public FakeCoordinator {
 public:
  explicit UsageCoordinator(bool refuse_usage) : refuse_usage_(refuse_usage) {}
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      heartbeats.push_back({*request, std::chrono::steady_clock::now()});
    }
    if (refuse_usage_ && request->has_usage()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "usage.devices[0].utilization_percent must be in [0, 100], got 101");
    }
    return grpc::Status::OK;
  }
  grpc::Status PollAssignments(grpc::ServerContext* context, const v1::PollAssignmentsRequest*,
                               v1::PollAssignmentsResponse*) override {
    Hold(context, std::chrono::seconds(20));
    return grpc::Status::OK;
  }
  struct Received {
    v1::HeartbeatRequest request;
    std::chrono::steady_clock::time_point at;
  };
  std::vector<Received> Heartbeats() {
    std::lock_guard<std::mutex> lock(mu);
    return heartbeats;
  }
  size_t WithUsage() {
    std::lock_guard<std::mutex> lock(mu);
    return std::count_if(heartbeats.begin(), heartbeats.end(),
                         [](const Received& h) { return h.request.has_usage(); });
  }

 private:
  const bool refuse_usage_;
  std::mutex mu;
  std::vector<Received> heartbeats;
};

// Each reading a fresh figure: memory_available_bytes counts the readings.
std::function<v1::WorkerUsage()> CountingUsage(std::shared_ptr<std::atomic<int>> readings) {
  return [readings] {
    v1::WorkerUsage usage;
    usage.set_memory_total_bytes(int64_t{64} << 30);
    usage.set_memory_available_bytes(readings->fetch_add(1) + 1);
    v1::DeviceUsage* device = usage.add_devices();
    device->set_index(0);
    return usage;
  };
}

TEST(WorkerDaemon, Heartbeats_CarryTheLatestUsage) {
  UsageCoordinator coordinator(/*refuse_usage=*/false);
  std::unique_ptr<grpc::Server> server = Serve(&coordinator);
  WorkerOptions options = TestOptions();
  auto readings = std::make_shared<std::atomic<int>>(0);
  options.read_usage = CountingUsage(readings);
  ASSERT_TRUE(RunDaemonUntil(options, v1::WorkerControl::NewStub(server->InProcessChannel({})),
                             [&] { return coordinator.WithUsage() >= 6; }));
  server->Shutdown(std::chrono::system_clock::now());
  int64_t last = 0;
  int fresh = 0;
  for (const auto& heartbeat : coordinator.Heartbeats()) {
    if (!heartbeat.request.has_usage()) continue;  // (The first may go before a reading.)
    const v1::WorkerUsage& usage = heartbeat.request.usage();
    EXPECT_EQ(usage.devices_size(), 1);
    EXPECT_GE(heartbeat.request.usage_age_ms(), 0);
    EXPECT_LE(heartbeat.request.usage_age_ms(), 1'000) << "read every interval (100 ms)";
    EXPECT_GE(usage.memory_available_bytes(), last) << "an older reading after a newer one";
    fresh += usage.memory_available_bytes() > last;
    last = usage.memory_available_bytes();
  }
  EXPECT_GE(coordinator.WithUsage(), 6u);
  EXPECT_GE(fresh, 3) << "the heartbeats kept sending one old reading";
}

// A reading that hangs (a driver call that does not return) holds back neither the heartbeats
// nor the daemon's stop; the heartbeats then carry no reading older than kMaxUsageAgeMs (here:
// the first one, a moment old, at most).
TEST(WorkerDaemon, AReadingThatHangs_HoldsBackNeitherTheHeartbeatsNorTheStop) {
  UsageCoordinator coordinator(/*refuse_usage=*/false);
  std::unique_ptr<grpc::Server> server = Serve(&coordinator);
  WorkerOptions options = TestOptions();
  auto readings = std::make_shared<std::atomic<int>>(0);
  options.read_usage = [readings] {
    if (readings->fetch_add(1) > 0) std::this_thread::sleep_for(std::chrono::seconds(30));
    return v1::WorkerUsage();
  };
  const auto started = std::chrono::steady_clock::now();
  ASSERT_TRUE(RunDaemonUntil(options, v1::WorkerControl::NewStub(server->InProcessChannel({})),
                             [&] { return coordinator.Heartbeats().size() >= 10; }));
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  server->Shutdown(std::chrono::system_clock::now());
  EXPECT_GE(coordinator.Heartbeats().size(), 10u) << "the heartbeats waited for the reading";
  EXPECT_LT(took_s, 15) << "the stop waited for the reading (it waits 2 s at most)";
  EXPECT_EQ(readings->load(), 2) << "the thread went on reading while one hung";
}

// A usage the coordinator refuses (INVALID_ARGUMENT: it still counted the heartbeat) is no
// silence: the worker does not try fresh connections as if the coordinator were gone (nor
// fence its ranks, nor register again).
TEST(WorkerDaemon, UsageRefused_TheHeartbeatStillCounts) {
  UsageCoordinator coordinator(/*refuse_usage=*/true);
  std::unique_ptr<grpc::Server> server = Serve(&coordinator);
  WorkerOptions options = TestOptions();
  options.read_usage = CountingUsage(std::make_shared<std::atomic<int>>(0));
  auto fresh_stubs = std::make_shared<std::atomic<int>>(0);
  options.fresh_stub = [&server, fresh_stubs]() -> std::shared_ptr<v1::WorkerControl::StubInterface> {
    fresh_stubs->fetch_add(1);
    return v1::WorkerControl::NewStub(server->InProcessChannel({}));
  };
  // 15 heartbeats refused, 100 ms apart: silence would have been seen after 2 of them.
  ASSERT_TRUE(RunDaemonUntil(options, v1::WorkerControl::NewStub(server->InProcessChannel({})),
                             [&] { return coordinator.WithUsage() >= 15; }));
  server->Shutdown(std::chrono::system_clock::now());
  EXPECT_GE(coordinator.WithUsage(), 15u);
  EXPECT_EQ(fresh_stubs->load(), 0) << "refused usage taken for a silent coordinator";
  EXPECT_EQ(coordinator.registrations.load(), 1);
}

}  // namespace
}  // namespace mptrain
