#include "worker/rank_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>

#include "gtest/gtest.h"

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

absl::StatusOr<std::string> GetThrough(RefusingCoordinator* coordinator, int64_t timeout_ms) {
  grpc::ServerBuilder builder;
  builder.RegisterService(coordinator);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
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

}  // namespace
}  // namespace mptrain
