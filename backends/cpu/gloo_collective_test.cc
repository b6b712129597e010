#include "backends/cpu/gloo_collective.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "comm/peer_directory.h"
#include "comm/stop_token.h"
#include "gtest/gtest.h"
#include "tests/fake_collectives.h"

namespace mptrain {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Connects `world` ranks on loopback in parallel; each gets `options` with its own rank.
std::vector<std::unique_ptr<GlooCollective>> ConnectAll(int world, GlooCollectiveOptions options,
                                                        KeyValueStore* store,
                                                        std::vector<StopToken*> tokens = {}) {
  std::vector<std::unique_ptr<GlooCollective>> collectives(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank, options]() mutable {
      options.rank = rank;
      options.world_size = world;
      options.store = store;
      if (rank < static_cast<int>(tokens.size())) options.stop_token = tokens[rank];
      auto collective = GlooCollective::Connect(options);
      ASSERT_TRUE(collective.ok()) << collective.status();
      collectives[rank] = std::move(*collective);
    });
  }
  for (auto& thread : threads) thread.join();
  return collectives;
}

TEST(GlooCollective, ThreeRanks_AllReduceMean) {
  InMemoryKeyValueStore store;
  std::vector<float> buffers[3] = {{1, 10}, {2, 20}, {6, 60}};
  absl::Status statuses[3];
  std::thread ranks[3];
  for (int rank = 0; rank < 3; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      auto collective = GlooCollective::Connect(rank, 3, "127.0.0.1", &store, 20'000);
      if (!collective.ok()) {
        statuses[rank] = collective.status();
        return;
      }
      Tensor tensor{buffers[rank].data(), DType::kF32, 1, 2, 4};
      statuses[rank] = (*collective)->AllReduceMean(tensor);
    });
  }
  for (auto& rank : ranks) rank.join();
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(statuses[rank].ok()) << statuses[rank];
    EXPECT_FLOAT_EQ(buffers[rank][0], 3.0f);
    EXPECT_FLOAT_EQ(buffers[rank][1], 30.0f);
  }
}

TEST(GlooCollective, MissingPeer_TimesOutWithAnError) {
  InMemoryKeyValueStore store;
  auto collective = GlooCollective::Connect(0, 2, "127.0.0.1", &store, 300);
  EXPECT_FALSE(collective.ok());
}

std::string Where(int rank) {
  return "rank " + std::to_string(rank) + " on " + LocalPeerLocation("127.0.0.1").host_name +
         " (127.0.0.1)";
}

TEST(GlooCollective, PeerNeverCalls_FailsWithinTheCollectiveTimeout_NamingThePair) {
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.rendezvous_timeout_ms = 20'000;
  options.collective_timeout_ms = 1'000;
  auto collectives = ConnectAll(2, options, &store);
  ASSERT_TRUE(collectives[0] && collectives[1]);
  std::vector<float> values = {1, 2, 3};
  const auto start = Clock::now();
  absl::Status status = collectives[0]->AllReduceMean({values.data(), DType::kF32, 1, 3, 4});
  const double waited = SecondsSince(start);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_EQ(status.message(), "collective allreduce timed out after 1 s: " + Where(0) +
                                  " waited for " + Where(1));
  EXPECT_GE(waited, 0.9);
  EXPECT_LT(waited, 5.0) << "the 1 s collective timeout was not applied";
}

TEST(GlooCollective, ThreeRanks_OneNeverCalls_ItsRingPredecessorNamesIt) {
  // gloo's ring: rank r receives from r + 1. Rank 2 never calls: rank 1 waits for it.
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.rendezvous_timeout_ms = 20'000;
  options.collective_timeout_ms = 1'000;
  auto collectives = ConnectAll(3, options, &store);
  ASSERT_TRUE(collectives[0] && collectives[1] && collectives[2]);
  absl::Status statuses[2];
  std::vector<float> values[2] = {{1, 2, 3}, {4, 5, 6}};
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      statuses[rank] =
          collectives[rank]->AllReduceMean({values[rank].data(), DType::kF32, 1, 3, 4});
    });
  }
  const auto start = Clock::now();
  for (auto& thread : ranks) thread.join();
  EXPECT_LT(SecondsSince(start), 5.0);
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kDeadlineExceeded) << statuses[1];
  EXPECT_EQ(statuses[1].message(), "collective allreduce timed out after 1 s: " + Where(1) +
                                       " waited for " + Where(2));
  // Rank 0 waited for rank 1: it times out naming rank 1, or sees rank 1 close its connection.
  EXPECT_FALSE(statuses[0].ok());
}

TEST(GlooCollective, ThreeRanks_Broadcast_CopiesTheRootsBitsExactly) {
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.rendezvous_timeout_ms = 20'000;
  auto collectives = ConnectAll(3, options, &store);
  ASSERT_TRUE(collectives[0] && collectives[1] && collectives[2]);
  const std::vector<float> root_values = {-0.0f, 1e-42f /* denormal */, std::nanf("7"), 3.5f};
  std::vector<float> buffers[3];
  for (int rank = 0; rank < 3; ++rank) {
    buffers[rank] = rank == 1 ? root_values : std::vector<float>(4, float(rank));
  }
  absl::Status statuses[3];
  std::thread ranks[3];
  for (int rank = 0; rank < 3; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      statuses[rank] =
          collectives[rank]->Broadcast({buffers[rank].data(), DType::kF32, 1, 4, 4}, /*root=*/1);
    });
  }
  for (auto& thread : ranks) thread.join();
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(statuses[rank].ok()) << statuses[rank];
    EXPECT_EQ(std::memcmp(buffers[rank].data(), root_values.data(), 4 * sizeof(float)), 0)
        << "rank " << rank;
  }
  float value = 0;
  EXPECT_EQ(collectives[0]->Broadcast({&value, DType::kF32, 1, 1, 4}, 3).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlooCollective, Broadcast_RootNeverCalls_TheReceiverNamesTheRoot) {
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.rendezvous_timeout_ms = 20'000;
  options.collective_timeout_ms = 1'000;
  auto collectives = ConnectAll(2, options, &store);
  ASSERT_TRUE(collectives[0] && collectives[1]);
  std::vector<float> values = {1, 2};
  absl::Status status = collectives[1]->Broadcast({values.data(), DType::kF32, 1, 2, 4}, 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_EQ(status.message(), "collective broadcast timed out after 1 s: " + Where(1) +
                                  " waited for " + Where(0));
}

TEST(GlooCollective, Broadcast_FourRanks_ARankNamesItsParentInTheTree) {
  // gloo's binomial tree from root 0 over 4 ranks: 0 -> 1, 0 -> 2, 1 -> 3. Rank 1 never calls:
  // rank 3 waits to receive from it.
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.rendezvous_timeout_ms = 20'000;
  options.collective_timeout_ms = 1'000;
  auto collectives = ConnectAll(4, options, &store);
  for (auto& collective : collectives) ASSERT_TRUE(collective);
  absl::Status statuses[4];
  std::vector<float> buffers[4];
  std::vector<std::thread> threads;
  for (int rank : {0, 2, 3}) {
    buffers[rank] = {float(rank)};
    threads.emplace_back([&, rank] {
      statuses[rank] = collectives[rank]->Broadcast({buffers[rank].data(), DType::kF32, 1, 1, 4}, 0);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(statuses[2].ok()) << statuses[2];
  EXPECT_EQ(statuses[3].code(), absl::StatusCode::kDeadlineExceeded) << statuses[3];
  EXPECT_EQ(statuses[3].message(), "collective broadcast timed out after 1 s: " + Where(3) +
                                       " waited for " + Where(1));
}

TEST(GlooCollective, StopToken_AbortsABlockedAllReduceAtOnce_AndItsPeerFails) {
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.rendezvous_timeout_ms = 20'000;
  options.collective_timeout_ms = 60'000;  // Far longer than the test may take.
  StopToken token0, token1;
  auto collectives = ConnectAll(2, options, &store, {&token0, &token1});
  ASSERT_TRUE(collectives[0] && collectives[1]);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    token0.RequestStop("signal 15 (Terminated): the worker stopped this rank");
  });
  std::vector<float> values = {1, 2, 3};
  const auto start = Clock::now();
  absl::Status status = collectives[0]->AllReduceMean({values.data(), DType::kF32, 1, 3, 4});
  const double waited = SecondsSince(start);
  stopper.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_NE(std::string(status.message()).find("signal 15 (Terminated)"), std::string::npos)
      << status;
  EXPECT_LT(waited, 5.0);
  // The aborted rank closed its connections: its peer fails now instead of waiting 60 s.
  const auto peer_start = Clock::now();
  absl::Status peer = collectives[1]->AllReduceMean({values.data(), DType::kF32, 1, 3, 4});
  EXPECT_FALSE(peer.ok());
  EXPECT_LT(SecondsSince(peer_start), 5.0) << peer;
  // Every later collective of the aborted rank fails at once, with the same reason.
  absl::Status again = collectives[0]->AllReduceMean({values.data(), DType::kF32, 1, 3, 4});
  EXPECT_EQ(again.code(), absl::StatusCode::kAborted) << again;
}

TEST(GlooCollective, TokenTrippedBeforeConnect_AbortsTheFirstCollective) {
  InMemoryKeyValueStore store;
  StopToken token;
  token.RequestStop("the coordinator ended the job");
  GlooCollectiveOptions options;
  options.stop_token = &token;
  auto collective = GlooCollective::Connect(options);  // World of one.
  ASSERT_TRUE(collective.ok()) << collective.status();
  float value = 1;
  absl::Status status = (*collective)->AllReduceMean({&value, DType::kF32, 1, 1, 4});
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_NE(std::string(status.message()).find("the coordinator ended the job"),
            std::string::npos);
}

}  // namespace
}  // namespace mptrain
