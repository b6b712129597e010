// The gRPC layer over a real CoordinatorState and store, in process.
#include "coordinator/grpc_service.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/store/gated_job_store.h"
#include "coordinator/store/sqlite_job_store.h"
#include "coordinator/test_job_spec.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

// While the disk holds a commit, no gRPC thread waits for it: many writing calls in flight
// (each answered only once its change is written) leave a worker's heartbeats answered at
// once. (Callback threads waiting for the disk stalled every call, heartbeats included, and
// the coordinator declared healthy workers lost.)
TEST(GrpcService, ASlowDisk_HoldsNoThread_WritesAnswerOnceWritten) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/grpc_service_store_", getpid());
  std::filesystem::remove_all(dir);
  auto sqlite = SqliteJobStore::Open(dir);
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  GatedJobStore store(sqlite->get());
  WaitSet waits;
  CoordinatorOptions options;
  options.store = &store;
  options.notify = [&waits](const std::vector<std::string>& keys) { waits.Notify(keys); };
  CoordinatorState state(options);
  ASSERT_TRUE(state.Restore().ok());
  v1::RegisterWorkerRequest registration;
  registration.set_host("127.0.0.1");
  registration.set_name("w");
  registration.set_device(v1::CPU);
  registration.set_slots(1);
  registration.set_incarnation(1);
  auto registered = state.RegisterWorker(registration);
  ASSERT_TRUE(registered.ok()) << registered.status();

  auto auth = std::make_shared<const Authenticator>(std::nullopt);  // Everyone an admin.
  CoordinatorService coordinator(&state, &waits, auth);
  WorkerControlService workers(&state, &waits, auth);
  grpc::ServerBuilder builder;
  builder.RegisterService(&coordinator);
  builder.RegisterService(&workers);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  auto channel = server->InProcessChannel({});
  auto jobs = v1::Coordinator::NewStub(channel);
  auto control = v1::WorkerControl::NewStub(channel);

  store.Close();
  // More writing calls than gRPC has threads for its callbacks.
  constexpr int kSubmits = 64;
  struct Submit {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    v1::SubmitJobResponse response;
  };
  std::vector<std::unique_ptr<Submit>> submits;
  std::atomic<int> answered{0};
  std::atomic<int> succeeded{0};
  for (int i = 0; i < kSubmits; ++i) {
    auto submit = std::make_unique<Submit>();
    submit->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    *submit->request.mutable_spec() = SmallJobSpec(1);
    submit->request.set_request_id(absl::StrCat("r", i));
    jobs->async()->SubmitJob(&submit->context, &submit->request, &submit->response,
                             [&](grpc::Status status) {
                               if (status.ok()) succeeded.fetch_add(1);
                               answered.fetch_add(1);
                             });
    submits.push_back(std::move(submit));
  }
  if (!store.AwaitHeldCommit()) {
    store.Open();  // So that what waits for it ends.
    FAIL() << "no write reached the store";
  }
  // Every submit has reached the coordinator (its job is in memory, its write held behind the
  // gate) before the heartbeats: the case is more writing calls in flight than gRPC threads.
  for (int i = 0; i < 1000 && state.GetOverview().submitted_total < kSubmits; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (state.GetOverview().submitted_total != static_cast<uint64_t>(kSubmits)) {
    store.Open();  // So that what waits for it ends.
    FAIL() << state.GetOverview().submitted_total << " of " << kSubmits
           << " submits reached the coordinator within 10 s";
  }

  int heartbeats_answered = 0;
  for (int i = 0; i < 10; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::HeartbeatRequest heartbeat;
    heartbeat.set_worker_id(registered->worker_id());
    heartbeat.set_worker_secret(registered->worker_secret());
    heartbeat.set_incarnation(1);
    v1::HeartbeatResponse response;
    grpc::Status status = control->Heartbeat(&context, heartbeat, &response);
    EXPECT_TRUE(status.ok()) << "heartbeat " << i << " while the disk holds a write: "
                             << status.error_message();
    heartbeats_answered += status.ok();
  }
  EXPECT_EQ(answered.load(), 0) << "a submit was answered before its job was written";

  store.Open();
  for (int i = 0; i < 1000 && answered.load() < kSubmits; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(answered.load(), kSubmits);
  EXPECT_EQ(succeeded.load(), kSubmits);
  EXPECT_EQ(heartbeats_answered, 10);
  server->Shutdown(std::chrono::system_clock::now());
  for (int i = 0; i < 500 && answered.load() < kSubmits; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mptrain
