#include "worker/coordinator_link.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

// Holds every poll until it is cancelled (a connection whose answers do not come back).
class HoldingCoordinator final : public v1::WorkerControl::Service {
 public:
  grpc::Status PollAssignments(grpc::ServerContext* context, const v1::PollAssignmentsRequest*,
                               v1::PollAssignmentsResponse*) override {
    polls.fetch_add(1);
    while (!context->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  }
  std::atomic<int> polls{0};
};

std::unique_ptr<grpc::Server> Serve(grpc::Service* service) {
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

std::shared_ptr<CoordinatorLink::Stub> StubOf(grpc::Server* server) {
  return v1::WorkerControl::NewStub(server->InProcessChannel({}));
}

TEST(CoordinatorLink, WithoutCandidates_TheFirstStubStays) {
  HoldingCoordinator coordinator;
  std::unique_ptr<grpc::Server> server = Serve(&coordinator);
  auto stub = StubOf(server.get());
  CoordinatorLink link(stub, nullptr);
  CoordinatorLink::Endpoint candidate = link.Candidate();
  EXPECT_EQ(candidate.stub, stub);
  link.Answered(candidate);
  EXPECT_EQ(link.Current().stub, stub);
  EXPECT_EQ(link.Current().generation, 0u);
  server->Shutdown(std::chrono::system_clock::now());
}

// A newer connection answered: a call waiting on the older one is cancelled and says so; the
// next calls use the newer one; an older one answering later changes nothing.
TEST(CoordinatorLink, ANewerConnectionAnswered_CancelsCallsOnOlderOnes) {
  HoldingCoordinator coordinator;
  std::unique_ptr<grpc::Server> server = Serve(&coordinator);
  auto first = StubOf(server.get());
  CoordinatorLink link(first, [&] { return StubOf(server.get()); });

  auto waiting = std::async(std::launch::async, [&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    CoordinatorLink::Call call(&link, &context);
    v1::PollAssignmentsRequest request;
    v1::PollAssignmentsResponse response;
    grpc::Status status = call->PollAssignments(&context, request, &response);
    return std::make_pair(status.error_code(), call.superseded());
  });
  for (int i = 0; i < 500 && coordinator.polls.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(coordinator.polls.load(), 1);

  CoordinatorLink::Endpoint older = link.Candidate();
  CoordinatorLink::Endpoint newer = link.Candidate();
  EXPECT_LT(older.generation, newer.generation);
  link.Answered(newer);
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the call on the replaced connection was not cancelled";
  auto [code, superseded] = waiting.get();
  EXPECT_EQ(code, grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(superseded);
  EXPECT_EQ(link.Current().stub, newer.stub);

  link.Answered(older);  // Late: stays with the newer.
  EXPECT_EQ(link.Current().stub, newer.stub);
  {
    grpc::ClientContext context;
    CoordinatorLink::Call call(&link, &context);
    EXPECT_EQ(call.endpoint().stub, newer.stub);
    EXPECT_FALSE(call.superseded());
  }
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace mptrain
