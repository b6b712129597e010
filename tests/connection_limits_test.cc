// Issue 27 items 7 and 8 against a real coordinator with mutual TLS and tokens: connections
// that never handshake, from many loopback addresses, neither lock users (alice, bob) out of
// the HTTP or the gRPC port nor are held past their deadline.

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/local_cluster.h"
#include "tests/raw_connections.h"

namespace mptrain::testing {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MillisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

int PortOf(const std::string& address) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  return port;
}

grpc::Status ListJobs(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = v1::Coordinator::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  v1::ListJobsResponse response;
  return stub->ListJobs(&context, v1::ListJobsRequest(), &response);
}

TEST(ConnectionLimits, GrpcPort_UnhandshakenConnectionsCappedAndCut_UsersStillServed) {
  LocalCluster::Options options;
  options.workers = 1;
  // A handshake deadline of 3 s: well past the refusals' own time even on a loaded machine,
  // so a refused connection (closed at once) and a held one (closed at the deadline) stay
  // apart.
  options.coordinator_flags = {"--grpc_handshake_timeout_s=3", "--grpc_max_connections=64",
                               "--grpc_max_connections_per_address=48"};
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  const int port = PortOf(cluster.address());
  auto alice = cluster.Channel(cluster.SecurityFor("alice"));
  ASSERT_TRUE(ListJobs(alice).ok());

  // One address: 48 held, the 49th closed at once, before a byte (the TLS server would send
  // nothing anyway; a refused connection never reaches it).
  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < 48; ++i) {
    held.push_back(std::make_unique<RawConnection>(port, "127.0.9.1"));
    ASSERT_TRUE(held.back()->connected());
  }
  RawConnection one_too_many(port, "127.0.9.1");
  const auto start = Clock::now();
  EXPECT_TRUE(one_too_many.ClosedByServer(1'500)) << "the per-address cap was not kept";

  // Many addresses: of 64 more, only the places left of the 64 in all are taken.
  std::vector<std::unique_ptr<RawConnection>> more;
  for (const std::string& source : LoopbackSources(10, 1, 64)) {
    more.push_back(std::make_unique<RawConnection>(port, source));
  }
  // All of them watched together for up to 1.5 s from the first refusal: the held ones stay
  // open until the 3 s deadline.
  const auto watch_until = start + std::chrono::milliseconds(1'500);
  int refused = 0;
  for (auto& connection : more) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(watch_until -
                                                                            Clock::now());
    refused += connection->ClosedByServer(std::max<int>(10, left.count())) ? 1 : 0;
  }
  EXPECT_LT(MillisSince(start), 2'500) << "refused only at the handshake deadline";
  EXPECT_GE(refused, 64 - (64 - 48)) << "the cap in all was not kept";
  EXPECT_TRUE(ListJobs(alice).ok()) << "the established user lost her connection";

  // The held ones are cut at the deadline; then bob, a new client, gets in.
  for (auto& connection : held) {
    EXPECT_TRUE(connection->ClosedByServer(
        std::max<int>(10, static_cast<int>(7'000 - MillisSince(start)))));
  }
  EXPECT_LT(MillisSince(start), 7'000);
  auto bob = cluster.Channel(cluster.SecurityFor("bob"));
  grpc::Status bob_status;
  for (int attempt = 0; attempt < 10 && !(bob_status = ListJobs(bob)).ok(); ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(bob_status.ok()) << bob_status.error_message();
  // The worker's own connection lived through it all.
  grpc::ClientContext context;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(cluster.coordinator()->ListWorkers(&context, v1::ListWorkersRequest(), &workers)
                  .ok());
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).state(), v1::ALIVE);
}

TEST(ConnectionLimits, HttpPort_IdleFloodFromManyRanges_UsersStillAnswered) {
  const std::string http_port_file = TestTempDir() + "/http_port";
  LocalCluster::Options options;
  options.workers = 1;
  options.coordinator_flags = {"--http_listen=127.0.0.1:0",
                               "--http_port_file=" + http_port_file};
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  int http_port = 0;
  std::ifstream(http_port_file) >> http_port;
  ASSERT_GT(http_port, 0);

  // 400 connections from 5 /24s that never start TLS, reopened as soon as they are closed.
  IdleFlood flood(http_port, LoopbackSources(20, 5, 80));
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  while (flood.opened() < 400 && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(flood.opened(), 400);

  // alice and bob, each from a range of their own, across the flood's renewals (3 s).
  const std::string pki = cluster.pki();
  for (int probe = 0; probe < 6; ++probe) {
    const std::string user = probe % 2 == 0 ? "alice" : "bob";
    const CommandResult curl = RunCommand(absl::StrCat(
        "curl -s -o /dev/null -m 5 -w '%{http_code} %{time_total}' --interface 127.0.",
        30 + probe, ".1 --cacert ", pki, "/ca.pem --cert ", pki, "/client.pem --key ", pki,
        "/client.key -H \"Authorization: Bearer $(cat ", pki, "/", user, ".token)\" https://",
        "127.0.0.1:", http_port, "/metrics"));
    const std::vector<std::string> fields = absl::StrSplit(curl.output, ' ');
    double seconds = 99;
    ASSERT_EQ(fields.size(), 2u) << curl.output;
    EXPECT_EQ(fields[0], "200") << "probe " << probe << " (" << user << ")";
    EXPECT_TRUE(absl::SimpleAtod(fields[1], &seconds) && seconds < 2.0)
        << "probe " << probe << " (" << user << ") took " << fields[1] << " s";
    std::this_thread::sleep_for(std::chrono::milliseconds(700));  // Spread over the flood.
  }
}

}  // namespace
}  // namespace mptrain::testing
