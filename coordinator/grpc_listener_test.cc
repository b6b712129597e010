// The gRPC port's caps and handshake deadline against raw TCP connections that never
// handshake, over real loopback sockets, with a real gRPC server (its health service).

#include "coordinator/grpc_listener.h"

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "tests/raw_connections.h"

namespace mptrain {
namespace {

using mptrain::testing::RawConnection;
using Clock = std::chrono::steady_clock;

int64_t MillisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// Waits (at most 5 s) until `done` holds; false if it never did.
template <typename Condition>
bool Await(Condition done) {
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (Clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

class GrpcListenerTest : public ::testing::Test {
 protected:
  void Start(GrpcConnectionLimits limits, int handshake_timeout_ms) {
    grpc::EnableDefaultHealthCheckService(true);
    auto bound = GrpcListener::Bind("127.0.0.1:0", limits);
    ASSERT_TRUE(bound.ok()) << bound.status();
    listener_ = *std::move(bound);
    grpc::ServerBuilder builder;
    acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        grpc::InsecureServerCredentials());
    builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, handshake_timeout_ms);
    builder.RegisterCallbackGenericService(&unimplemented_);  // A server needs one service.
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    listener_->Start(acceptor_.get());
  }
  void TearDown() override {
    listener_.reset();
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    }
  }

  // A health check (an empty HealthCheckRequest, as raw bytes) on `channel`: true when it
  // answers SERVING (field 1 = 1) within 2 s.
  static bool Serving(const std::shared_ptr<grpc::Channel>& channel) {
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::ByteBuffer request(nullptr, 0);
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                   &response, [&done](grpc::Status status) { done.set_value(status); });
    if (!done.get_future().get().ok()) return false;
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    std::string bytes;
    for (const grpc::Slice& part : slices) {
      bytes.append(reinterpret_cast<const char*>(part.begin()), part.size());
    }
    return bytes == std::string("\x08\x01", 2);
  }

  int port() const { return listener_->port(); }

  grpc::CallbackGenericService unimplemented_;
  std::unique_ptr<GrpcListener> listener_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::unique_ptr<grpc::Server> server_;
};

// Issue 27: 3,000 connections that never handshook were held 40 s (gRPC's default: 120 s).
TEST_F(GrpcListenerTest, ConnectionsThatNeverHandshake_AreClosedAtTheDeadline) {
  Start(GrpcConnectionLimits{}, 1'000);
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int host = 1; host <= 20; ++host) {
    idle.push_back(std::make_unique<RawConnection>(port(), absl::StrCat("127.0.8.", host)));
    ASSERT_TRUE(idle.back()->connected());
  }
  const auto start = Clock::now();
  ASSERT_TRUE(Await([&] { return listener_->open_connections() == 20; }))
      << listener_->open_connections();
  for (auto& connection : idle) {
    EXPECT_TRUE(connection->ClosedByServer(4'000)) << "held past the handshake deadline";
  }
  EXPECT_GE(MillisSince(start), 700);
  EXPECT_LT(MillisSince(start), 3'000);
  EXPECT_TRUE(Await([&] { return listener_->open_connections() == 0; }))
      << listener_->open_connections() << " closed connections still counted";
}

TEST_F(GrpcListenerTest, BeyondTheCaps_Refused_AnEstablishedClientStillServed) {
  GrpcConnectionLimits limits;
  limits.max_connections = 10;
  limits.max_connections_per_address = 4;
  Start(limits, 3'000);
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port()),
                                     grpc::InsecureChannelCredentials());
  ASSERT_TRUE(Serving(channel));
  ASSERT_EQ(listener_->open_connections(), 1u);

  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<RawConnection>(port(), "127.0.5.1"));
  }
  ASSERT_TRUE(Await([&] { return listener_->open_connections() == 5; }));
  const auto start = Clock::now();
  RawConnection fifth_from_one_address(port(), "127.0.5.1");
  size_t received = 0;
  EXPECT_TRUE(fifth_from_one_address.ClosedByServer(1'000, &received))
      << "per-address cap not kept";
  EXPECT_EQ(received, 0u) << "a refused connection reached the server";
  for (int host = 1; host <= 5; ++host) {
    held.push_back(std::make_unique<RawConnection>(port(), absl::StrCat("127.0.6.", host)));
  }
  ASSERT_TRUE(Await([&] { return listener_->open_connections() == 10; }));
  RawConnection eleventh(port(), "127.0.7.1");
  EXPECT_TRUE(eleventh.ClosedByServer(1'000, &received)) << "total cap not kept";
  EXPECT_EQ(received, 0u) << "a refused connection reached the server";
  EXPECT_LT(MillisSince(start), 2'000) << "refused only at the handshake deadline";
  EXPECT_TRUE(Serving(channel)) << "the established client lost its connection";

  // Once the held ones are cut at their deadline, there is room again.
  for (auto& connection : held) EXPECT_TRUE(connection->ClosedByServer(5'000));
  ASSERT_TRUE(Await([&] { return listener_->open_connections() == 1; }))
      << listener_->open_connections();
  RawConnection later(port(), "127.0.7.1");
  EXPECT_FALSE(later.ClosedByServer(500)) << "refused although there is room";
  EXPECT_TRUE(Serving(channel));
}

}  // namespace
}  // namespace mptrain
