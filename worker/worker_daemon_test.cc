#include "worker/worker_daemon.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

// A coordinator that registers the worker once, then forgets it (its heartbeats answer
// NOT_FOUND, as after a restart without its store) and refuses every registration after that
// for good (UNAUTHENTICATED: a token it no longer takes).
class ForgettingCoordinator final : public v1::WorkerControl::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    if (registrations.fetch_add(1) > 0) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "this token is not taken any more");
    }
    response->set_worker_id("w#1");
    response->set_worker_secret("secret");
    response->set_heartbeat_interval_ms(100);
    response->set_heartbeat_timeout_ms(500);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker w#1; register again");
  }
  grpc::Status PollAssignments(grpc::ServerContext*, const v1::PollAssignmentsRequest*,
                               v1::PollAssignmentsResponse*) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return grpc::Status::OK;
  }
  grpc::Status DeregisterWorker(grpc::ServerContext*, const v1::DeregisterWorkerRequest*,
                                v1::DeregisterWorkerResponse*) override {
    return grpc::Status::OK;
  }
  std::atomic<int> registrations{0};
};

// A registration refused for good ends the daemon with that error. (Its other loops waited
// for the stop flag alone, and the daemon hung for ever in Run.)
TEST(WorkerDaemon, RegistrationRefusedForGood_RunEndsWithTheError) {
  ForgettingCoordinator coordinator;
  grpc::ServerBuilder builder;
  builder.RegisterService(&coordinator);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  WorkerOptions options;
  options.coordinator = "in-process";
  options.name = "w";
  options.work_dir = ::testing::TempDir();
  options.rank_executable = "/bin/false";
  options.warm_ranks = false;
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

}  // namespace
}  // namespace mptrain
