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

// Polls the link's connection in use on another thread until the poll ends: its status and
// whether it was superseded.
std::future<std::pair<grpc::StatusCode, bool>> PollAsync(CoordinatorLink* link) {
  return std::async(std::launch::async, [link] {
    CoordinatorLink::Call call(link, std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::PollAssignmentsRequest request;
    v1::PollAssignmentsResponse response;
    grpc::Status status = call->PollAssignments(call.context(), request, &response);
    return std::make_pair(status.error_code(), call.SendAgain(status));
  });
}

void WaitForPolls(const HoldingCoordinator& coordinator, int count) {
  for (int i = 0; i < 500 && coordinator.polls.load() < count; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(coordinator.polls.load(), count);
}

// A newer connection answered: a call waiting on the older one is cancelled and says so; the
// next calls use the newer one. Candidates made before it answered (an outage's earlier
// tries, answered later) change nothing: the call sent again on it is not cancelled again.
TEST(CoordinatorLink, ANewerConnectionAnswered_CancelsCallsOnOlderOnesOnce) {
  HoldingCoordinator coordinator;
  std::unique_ptr<grpc::Server> server = Serve(&coordinator);
  auto first = StubOf(server.get());
  CoordinatorLink link(first, [&] { return StubOf(server.get()); });

  auto waiting = PollAsync(&link);
  WaitForPolls(coordinator, 1);
  CoordinatorLink::Endpoint one = link.Candidate();
  CoordinatorLink::Endpoint two = link.Candidate();
  CoordinatorLink::Endpoint three = link.Candidate();
  EXPECT_LT(one.generation, two.generation);
  link.Answered(two);
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the call on the replaced connection was not cancelled";
  auto [code, superseded] = waiting.get();
  EXPECT_EQ(code, grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(superseded);
  EXPECT_EQ(link.Current().stub, two.stub);

  auto again = PollAsync(&link);  // Sent again, on `two`.
  WaitForPolls(coordinator, 2);
  link.Answered(one);    // Older: stays with `two`.
  link.Answered(three);  // Newer, but made before `two` answered.
  EXPECT_EQ(link.Current().stub, two.stub);
  EXPECT_EQ(again.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "the call sent again on the new connection was cancelled again";
  server->Shutdown(std::chrono::system_clock::now());
  EXPECT_FALSE(again.get().second);
}

// The connection in use answers (late: a slow coordinator) after a candidate was made: the
// candidate's answer is no reason to move.
TEST(CoordinatorLink, TheConnectionInUseAnsweredSinceTheCandidate_Stays) {
  HoldingCoordinator coordinator;
  std::unique_ptr<grpc::Server> server = Serve(&coordinator);
  auto first = StubOf(server.get());
  CoordinatorLink link(first, [&] { return StubOf(server.get()); });
  CoordinatorLink::Endpoint candidate = link.Candidate();
  link.Answered(link.Current());
  link.Answered(candidate);
  EXPECT_EQ(link.Current().stub, first);
  // A candidate made after that answer does replace it.
  CoordinatorLink::Endpoint later = link.Candidate();
  link.Answered(later);
  EXPECT_EQ(link.Current().stub, later.stub);
  server->Shutdown(std::chrono::system_clock::now());
}

TEST(CoordinatorLink, RefusalsAreAnswers_TransportFailuresAreNot) {
  EXPECT_TRUE(CoordinatorLink::IsAnswer(grpc::Status::OK));
  EXPECT_TRUE(CoordinatorLink::IsAnswer(grpc::Status(grpc::StatusCode::NOT_FOUND, "")));
  EXPECT_TRUE(CoordinatorLink::IsAnswer(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "")));
  EXPECT_FALSE(CoordinatorLink::IsAnswer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "")));
  EXPECT_FALSE(
      CoordinatorLink::IsAnswer(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "")));
  EXPECT_FALSE(CoordinatorLink::IsAnswer(grpc::Status(grpc::StatusCode::CANCELLED, "")));
}

// Any call's answer counts for its connection, not only a heartbeat's: a candidate made before
// it is not needed. A call that ended unanswered and was not superseded is not sent again.
TEST(CoordinatorLink, AnyCallsAnswerCounts_ACallUnansweredButNotSupersededIsNotSentAgain) {
  HoldingCoordinator coordinator;
  std::unique_ptr<grpc::Server> server = Serve(&coordinator);
  auto first = StubOf(server.get());
  CoordinatorLink link(first, [&] { return StubOf(server.get()); });
  CoordinatorLink::Endpoint candidate = link.Candidate();
  {
    CoordinatorLink::Call call(&link, std::chrono::system_clock::now());
    EXPECT_FALSE(call.SendAgain(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown job")));
  }
  link.Answered(candidate);
  EXPECT_EQ(link.Current().stub, first) << "replaced although the connection in use answered";
  {
    CoordinatorLink::Call call(&link, std::chrono::system_clock::now());
    EXPECT_FALSE(call.SendAgain(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down")));
  }
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace mptrain
