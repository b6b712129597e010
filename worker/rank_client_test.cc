#include "worker/rank_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/stop_token.h"
#include "gtest/gtest.h"
#include "trainer/train_loop.h"

namespace mptrain {
namespace {

// A coordinator whose KeyValueGet answers `code` for its first `refusals` calls, then the value.
class RefusingCoordinator final : public v1::WorkerControl::Service {
 public:
  RefusingCoordinator(grpc::StatusCode code, int refusals) : code_(code), refusals_(refusals) {}
  grpc::Status KeyValueGet(grpc::ServerContext*, const v1::KeyValueGetRequest* request,
                           v1::KeyValueGetResponse* response) override {
    if (calls.fetch_add(1) < refusals_) return grpc::Status(code_, "refused");
    response->set_value("value of " + request->key());
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};

 private:
  grpc::StatusCode code_;
  int refusals_;
};

std::unique_ptr<grpc::Server> StartInProcess(grpc::Service* service) {
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

absl::StatusOr<std::string> GetThrough(RefusingCoordinator* coordinator, int64_t timeout_ms) {
  std::unique_ptr<grpc::Server> server = StartInProcess(coordinator);
  GrpcKeyValueStore store(v1::WorkerControl::NewStub(server->InProcessChannel({})),
                          RankIdentity{"job-0001", 1, 1, "secret"});
  auto value = store.Get("nccl_unique_id", timeout_ms);
  server->Shutdown();
  return value;
}

// A rank's rendezvous outlasts a coordinator that is away or whose places for the rank's
// waiting calls are taken for a moment; other refusals end it at once.
TEST(GrpcKeyValueStore, Get_RetriesUnavailableAndResourceExhausted_ButNotOtherErrors) {
  for (grpc::StatusCode code :
       {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::RESOURCE_EXHAUSTED}) {
    RefusingCoordinator coordinator(code, 2);
    auto value = GetThrough(&coordinator, 10'000);
    ASSERT_TRUE(value.ok()) << "code " << code << ": " << value.status();
    EXPECT_EQ(*value, "value of nccl_unique_id");
    EXPECT_EQ(coordinator.calls.load(), 3);
  }
  RefusingCoordinator denying(grpc::StatusCode::PERMISSION_DENIED, 2);
  auto denied = GetThrough(&denying, 10'000);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << denied.status();
  EXPECT_EQ(denying.calls.load(), 1);
  // Within its timeout: a refusal that lasts ends the rendezvous when it is up.
  RefusingCoordinator lasting(grpc::StatusCode::RESOURCE_EXHAUSTED, 1'000'000);
  const auto start = std::chrono::steady_clock::now();
  auto refused = GetThrough(&lasting, 1'200);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// A coordinator that keeps the steps of each telemetry report it receives.
class RecordingCoordinator final : public v1::WorkerControl::Service {
 public:
  grpc::Status ReportTelemetry(grpc::ServerContext*, const v1::ReportTelemetryRequest* request,
                               v1::ReportTelemetryResponse*) override {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<int64_t> steps;
    for (const v1::TelemetryRecord& record : request->records()) steps.push_back(record.step());
    reports.push_back(steps);
    work_units.push_back(request->work_units());
    return grpc::Status::OK;
  }
  std::vector<int64_t> WorkUnits() {
    std::lock_guard<std::mutex> lock(mu);
    return work_units;
  }
  std::vector<std::vector<int64_t>> Reports() {
    std::lock_guard<std::mutex> lock(mu);
    return reports;
  }
  std::mutex mu;
  std::vector<std::vector<int64_t>> reports;
  std::vector<int64_t> work_units;  // Of each report.
};

// The first step's record goes out at once (the service shows a job's first step as soon as it
// is done); later ones wait for the flush interval, batched; the rest are sent at the end.
// Rank `rank`'s reporter to an in-process coordinator.
std::unique_ptr<TelemetryReporter> ReporterTo(grpc::Server* server, int rank, StopToken* stop,
                                              int64_t flush_interval_ms) {
  return std::make_unique<TelemetryReporter>(
      v1::WorkerControl::NewStub(server->InProcessChannel({})),
      RankIdentity{"job-0001", rank, 1, "secret"}, stop, flush_interval_ms);
}

TEST(TelemetryReporter, SendsTheFirstStepAtOnce_ThenBatches) {
  RecordingCoordinator coordinator;
  std::unique_ptr<grpc::Server> server = StartInProcess(&coordinator);
  StopToken stop;
  const auto start = std::chrono::steady_clock::now();
  {
    std::unique_ptr<TelemetryReporter> reporter =
        ReporterTo(server.get(), 0, &stop, /*flush_interval_ms=*/60'000);
    StepTelemetry step;
    step.step = 1;
    reporter->OnStep(1, &step);
    while (coordinator.Reports().empty() &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20))
        << "the first step waited for the flush interval";
    ASSERT_EQ(coordinator.Reports().size(), 1u);
    EXPECT_EQ(coordinator.Reports()[0], std::vector<int64_t>{1});
    for (int64_t s = 2; s <= 4; ++s) {
      step.step = s;
      reporter->OnStep(s, &step);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(coordinator.Reports().size(), 1u) << "later steps are batched";
  }  // Flushed: the rest in one report.
  const std::vector<std::vector<int64_t>> reports = coordinator.Reports();
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[1], (std::vector<int64_t>{2, 3, 4}));
  server->Shutdown();
}

// Evaluation batches and sampled tokens between steps travel with the reports (the coordinator
// counts them as progress), however many there were since the last one.
TEST(TelemetryReporter, ReportsCarryTheWorkUnitsSoFar) {
  RecordingCoordinator coordinator;
  std::unique_ptr<grpc::Server> server = StartInProcess(&coordinator);
  StopToken stop;
  {
    std::unique_ptr<TelemetryReporter> reporter =
        ReporterTo(server.get(), 1, &stop, /*flush_interval_ms=*/50);
    for (int i = 0; i < 7; ++i) reporter->OnWorkUnit();
    const auto start = std::chrono::steady_clock::now();
    while ((coordinator.WorkUnits().empty() || coordinator.WorkUnits().back() != 7) &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_FALSE(coordinator.WorkUnits().empty());
    EXPECT_EQ(coordinator.WorkUnits().back(), 7);
    reporter->OnWorkUnit();
  }  // Flushed.
  EXPECT_EQ(coordinator.WorkUnits().back(), 8);
  server->Shutdown();
}

}  // namespace
}  // namespace mptrain
