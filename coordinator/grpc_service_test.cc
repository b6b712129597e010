// The gRPC layer over a real CoordinatorState and store, in process.
#include "coordinator/grpc_service.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
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
  workers.AddPollQueues(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  workers.StartPolls();
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
  workers.StopPolls();  // Before the server goes.
  for (int i = 0; i < 500 && answered.load() < kSubmits; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::filesystem::remove_all(dir);
}


// PollAssignments on its asynchronous queues (grpc_service.h): a registered worker's polls,
// over a real server in process.
class PollTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(kDefaultLongPollLimits); }
  void TearDown() override { Stop(); }

  void Start(CallLimits limits) {
    options_.notify = [this](const std::vector<std::string>& keys) { waits_.Notify(keys); };
    state_ = std::make_unique<CoordinatorState>(options_);
    ASSERT_TRUE(state_->Restore().ok());
    auth_ = std::make_shared<const Authenticator>(std::nullopt);
    coordinator_ = std::make_unique<CoordinatorService>(state_.get(), &waits_, auth_);
    workers_ = std::make_unique<WorkerControlService>(state_.get(), &waits_, auth_, limits);
    grpc::ServerBuilder builder;
    builder.RegisterService(coordinator_.get());
    builder.RegisterService(workers_.get());
    workers_->AddPollQueues(&builder, /*queues=*/3);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    workers_->StartPolls();
    channel_ = server_->InProcessChannel({});
    control_ = v1::WorkerControl::NewStub(channel_);
    jobs_ = v1::Coordinator::NewStub(channel_);
  }

  void Stop() {
    if (server_ == nullptr) return;
    waits_.Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    workers_->StopPolls();
    server_.reset();
  }

  v1::RegisterWorkerResponse Register(const std::string& name) {
    v1::RegisterWorkerRequest request;
    request.set_host("127.0.0.1");
    request.set_name(name);
    request.set_device(v1::CPU);
    request.set_slots(1);
    request.set_incarnation(7);
    auto registered = state_->RegisterWorker(request);
    EXPECT_TRUE(registered.ok()) << registered.status();
    return registered.ok() ? *registered : v1::RegisterWorkerResponse();
  }

  v1::PollAssignmentsRequest PollOf(const v1::RegisterWorkerResponse& worker, int64_t wait_ms) {
    v1::PollAssignmentsRequest request;
    request.set_worker_id(worker.worker_id());
    request.set_incarnation(7);
    request.set_worker_secret(worker.worker_secret());
    request.set_wait_ms(wait_ms);
    return request;
  }

  CoordinatorOptions options_;
  WaitSet waits_;
  std::unique_ptr<CoordinatorState> state_;
  std::shared_ptr<const Authenticator> auth_;
  std::unique_ptr<CoordinatorService> coordinator_;
  std::unique_ptr<WorkerControlService> workers_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerControl::Stub> control_;
  std::unique_ptr<v1::Coordinator::Stub> jobs_;
};

TEST_F(PollTest, NothingToStart_AnsweredEmptyAtItsWait) {
  const auto worker = Register("w");
  grpc::ClientContext context;
  v1::PollAssignmentsResponse response;
  const auto start = std::chrono::steady_clock::now();
  grpc::Status status = control_->PollAssignments(&context, PollOf(worker, 300), &response);
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.start_size(), 0);
  EXPECT_GE(waited, std::chrono::milliseconds(280));
  EXPECT_LT(waited, std::chrono::seconds(5));
}

TEST_F(PollTest, AJobPlacedWhileItWaits_AnsweredWithItsStart) {
  const auto worker = Register("w");
  v1::PollAssignmentsResponse response;
  grpc::Status status;
  std::thread poll([&] {
    grpc::ClientContext context;
    status = control_->PollAssignments(&context, PollOf(worker, 20'000), &response);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // The poll is waiting.
  const auto start = std::chrono::steady_clock::now();
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = SmallJobSpec(1);
  v1::SubmitJobResponse submitted;
  grpc::ClientContext submit_context;
  ASSERT_TRUE(jobs_->SubmitJob(&submit_context, submit, &submitted).ok());
  poll.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.start_size(), 1);
  EXPECT_EQ(response.start(0).job_id(), submitted.job_id());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Over gRPC: a heartbeat's usage reaches ListWorkers; a hostile one (a device the CPU worker
// never registered, too many devices) is INVALID_ARGUMENT naming the field, and the listing
// keeps the last good one.
TEST_F(PollTest, HeartbeatUsage_ListedByListWorkers_HostileOneRefusedNamingTheField) {
  const auto worker = Register("w");
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id(worker.worker_id());
  heartbeat.set_incarnation(7);
  heartbeat.set_worker_secret(worker.worker_secret());
  heartbeat.mutable_usage()->set_memory_available_bytes(int64_t{3} << 30);
  heartbeat.mutable_usage()->set_memory_total_bytes(int64_t{8} << 30);
  heartbeat.set_usage_age_ms(10);
  auto send = [&](const v1::HeartbeatRequest& request) {
    grpc::ClientContext context;
    v1::HeartbeatResponse response;
    return control_->Heartbeat(&context, request, &response);
  };
  auto listed = [&] {
    grpc::ClientContext context;
    v1::ListWorkersResponse response;
    EXPECT_TRUE(jobs_->ListWorkers(&context, v1::ListWorkersRequest(), &response).ok());
    return response.workers_size() == 1 ? response.workers(0) : v1::Worker();
  };
  ASSERT_TRUE(send(heartbeat).ok());
  EXPECT_EQ(listed().usage().memory_available_bytes(), int64_t{3} << 30);
  EXPECT_GT(listed().usage_unix_ms(), 0);

  v1::HeartbeatRequest stranger = heartbeat;
  stranger.mutable_usage()->add_devices()->set_index(0);
  grpc::Status refused = send(stranger);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(),
            "usage.devices[0].index must be one of the 0 device(s) this worker registered, got 0");
  v1::HeartbeatRequest many = heartbeat;
  for (int i = 0; i < 100'000; ++i) many.mutable_usage()->add_devices()->set_index(i);
  refused = send(many);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(), "usage.devices may list at most 64 devices, got 100000");
  EXPECT_EQ(listed().usage().memory_available_bytes(), int64_t{3} << 30);
  EXPECT_EQ(listed().usage().devices_size(), 0);
}

TEST_F(PollTest, AStrangersSecret_Refused) {
  auto worker = Register("w");
  worker.set_worker_secret("not its secret");
  grpc::ClientContext context;
  v1::PollAssignmentsResponse response;
  grpc::Status status = control_->PollAssignments(&context, PollOf(worker, 10'000), &response);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.error_code(), grpc::StatusCode::UNKNOWN) << status.error_message();
}

TEST_F(PollTest, BytesThatAreNoRequest_InvalidArgumentNamingTheType) {
  grpc::GenericStub generic(channel_);
  grpc::ClientContext context;
  grpc::Slice garbage(std::string("\xff\xff\xff\xff not a protobuf", 20));
  grpc::ByteBuffer request(&garbage, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  generic.UnaryCall(&context, "/mptrain.v1.WorkerControl/PollAssignments", {}, &request,
                    &response, [&](grpc::Status s) {
                      std::lock_guard<std::mutex> lock(mu);
                      status = std::move(s);
                      done = true;
                      cv.notify_all();
                    });
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done; }));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("PollAssignmentsRequest"), std::string::npos)
      << status.error_message();
}

// A poll the client gave up on gives its place back: with one place per worker, the same
// worker's next poll is admitted (without the release it is RESOURCE_EXHAUSTED for good).
TEST(PollLimits, ACancelledPoll_GivesItsPlaceBack) {
  class Limited : public PollTest {
   public:
    void TestBody() override {}
    using PollTest::control_;
    using PollTest::PollOf;
    using PollTest::Register;
    using PollTest::Start;
    using PollTest::Stop;
  } test;
  test.Start(CallLimits{8, 1});
  const auto worker = test.Register("w");
  {
    grpc::ClientContext waiting;
    v1::PollAssignmentsResponse response;
    std::thread canceller([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      waiting.TryCancel();
    });
    grpc::Status status = test.control_->PollAssignments(&waiting, test.PollOf(worker, 20'000),
                                                         &response);
    canceller.join();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  }
  // The server learns of the cancellation a little later: the place is free within seconds.
  grpc::Status next;
  for (int attempt = 0; attempt < 50; ++attempt) {
    grpc::ClientContext context;
    v1::PollAssignmentsResponse response;
    next = test.control_->PollAssignments(&context, test.PollOf(worker, 0), &response);
    if (next.ok()) break;
    EXPECT_EQ(next.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << next.error_message();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(next.ok()) << next.error_message();
  test.Stop();
}

// Many workers' polls at once, over every queue, all answered; then the server stops with
// polls still waiting: each ends (UNAVAILABLE or CANCELLED), none hangs, StopPolls returns.
TEST_F(PollTest, ManyAtOnce_AllAnswered_AndAStopEndsTheWaitingOnes) {
  constexpr int kWorkers = 48;
  std::vector<v1::RegisterWorkerResponse> registered;
  for (int i = 0; i < kWorkers; ++i) registered.push_back(Register(absl::StrCat("w", i)));
  std::atomic<int> ok{0};
  {
    std::vector<std::thread> polls;
    for (int i = 0; i < kWorkers; ++i) {
      polls.emplace_back([&, i] {
        grpc::ClientContext context;
        v1::PollAssignmentsResponse response;
        ok += control_->PollAssignments(&context, PollOf(registered[i], 200), &response).ok();
      });
    }
    for (std::thread& poll : polls) poll.join();
  }
  EXPECT_EQ(ok.load(), kWorkers);
  std::atomic<int> ended{0};
  std::vector<std::thread> waiting;
  for (int i = 0; i < 8; ++i) {
    waiting.emplace_back([&, i] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      v1::PollAssignmentsResponse response;
      grpc::Status status =
          control_->PollAssignments(&context, PollOf(registered[i], 25'000), &response);
      EXPECT_FALSE(status.ok());
      ++ended;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  Stop();
  for (std::thread& thread : waiting) thread.join();
  EXPECT_EQ(ended.load(), 8);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

}  // namespace
}  // namespace mptrain
