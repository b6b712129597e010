#include "comm/peer_directory.h"

#include <chrono>

#include "gtest/gtest.h"
#include "trainer/in_memory_store.h"

namespace mptrain {
namespace {

TEST(PeerDirectory, EncodeDecode_RoundTrip) {
  PeerLocation location{"h2", "10.0.0.3"};
  auto decoded = PeerDirectory::Decode(PeerDirectory::Encode(location));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->host_name, "h2");
  EXPECT_EQ(decoded->address, "10.0.0.3");
}

TEST(PeerDirectory, Decode_RefusesMalformedValues) {
  EXPECT_EQ(PeerDirectory::Decode("h2 10.0.0.3").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PeerDirectory::Decode("h2\n10.0.0.3\nextra").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PeerDirectory::Decode(std::string(256, 'h') + "\n10.0.0.3").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PeerDirectory::Decode(std::string("h\0002\n1", 5)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PeerDirectory, Encode_CutsAndCleansFields) {
  const std::string value = PeerDirectory::Encode({"evil\nhost", std::string(300, 'a')});
  auto decoded = PeerDirectory::Decode(value);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->host_name, "evil?host");
  EXPECT_EQ(decoded->address.size(), PeerDirectory::kMaxFieldBytes);
}

TEST(PeerDirectory, Describe_NamesAPublishedPeer_AndFallsBackToTheRankNumber) {
  InMemoryKeyValueStore store;
  PeerDirectory rank0(&store, 0, 3);
  PeerDirectory rank1(&store, 1, 3);
  ASSERT_TRUE(rank0.Publish({"h1", "10.0.0.2"}).ok());
  ASSERT_TRUE(rank1.Publish({"h2", "10.0.0.3"}).ok());
  EXPECT_EQ(rank0.Describe(0), "rank 0 on h1 (10.0.0.2)");
  EXPECT_EQ(rank0.Describe(1), "rank 1 on h2 (10.0.0.3)");
  EXPECT_EQ(rank1.Describe(0), "rank 0 on h1 (10.0.0.2)");
  // Rank 2 never published: named by number, after a short bounded lookup.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(rank0.Describe(2, 100), "rank 2");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(rank0.Describe(7, 100), "rank 7");  // Not a rank of this job: no lookup.
}

// gloo names a peer it could not reach by address alone: the ranks behind it are named.
TEST(PeerDirectory, RanksNamedIn_NamesTheRanksBehindAnAddress) {
  InMemoryKeyValueStore store;
  PeerDirectory rank0(&store, 0, 4);
  PeerDirectory rank1(&store, 1, 4);
  PeerDirectory rank2(&store, 2, 4);
  ASSERT_TRUE(rank0.Publish({"h1", "10.0.0.2"}).ok());
  ASSERT_TRUE(rank1.Publish({"h2", "10.0.0.3"}).ok());
  ASSERT_TRUE(rank2.Publish({"h2", "10.0.0.3"}).ok());  // Two ranks on one worker.
  const std::string error = "[./gloo/transport/tcp/pair.cc:799] connect [10.0.0.3]:59792: "
                            "Connection timed out";
  EXPECT_EQ(rank0.RanksNamedIn(error, 64, 100),
            "rank 1 on h2 (10.0.0.3); rank 2 on h2 (10.0.0.3)");
  EXPECT_EQ(rank0.RanksNamedIn("connect [10.0.0.30]:1: refused", 64, 100), "")
      << "a longer address with the same start is another address";
  EXPECT_EQ(rank1.RanksNamedIn(error, 64, 100), "rank 2 on h2 (10.0.0.3)") << "never itself";
  EXPECT_EQ(rank0.RanksNamedIn(error, 2, 100), "rank 1 on h2 (10.0.0.3)") << "bounded";
}

TEST(PeerDirectory, Prefetch_KeepsLocationsForLaterWithoutTheStore) {
  InMemoryKeyValueStore store;
  PeerDirectory rank0(&store, 0, 2);
  PeerDirectory rank1(&store, 1, 2);
  ASSERT_TRUE(rank1.Publish({"h2", "10.0.0.3"}).ok());
  rank0.Prefetch({1}, 1'000);
  // A new value under the key cannot change what was learnt (the store is write-once anyway).
  ASSERT_TRUE(store.Set("peers/1", "other\n1.2.3.4").ok());
  EXPECT_EQ(rank0.Describe(1, 0), "rank 1 on h2 (10.0.0.3)");
}

TEST(RingNeighbours, OnePeerInAWorldOfTwo_TwoInLargerWorlds) {
  EXPECT_EQ(RingNeighbours(0, 1), std::vector<int>{});
  EXPECT_EQ(RingNeighbours(0, 2), std::vector<int>{1});
  EXPECT_EQ(RingNeighbours(1, 2), std::vector<int>{0});
  EXPECT_EQ(RingNeighbours(0, 3), (std::vector<int>{1, 2}));
  EXPECT_EQ(RingNeighbours(2, 4), (std::vector<int>{3, 1}));
}

TEST(CollectiveTimeoutMessage, NamesThePair) {
  InMemoryKeyValueStore store;
  PeerDirectory rank0(&store, 0, 2);
  PeerDirectory rank1(&store, 1, 2);
  ASSERT_TRUE(rank0.Publish({"h1", "10.0.0.2"}).ok());
  ASSERT_TRUE(rank1.Publish({"h2", "10.0.0.3"}).ok());
  EXPECT_EQ(CollectiveTimeoutMessage("allreduce", 60'000, &rank0, {1}),
            "collective allreduce timed out after 60 s: rank 0 on h1 (10.0.0.2) waited for "
            "rank 1 on h2 (10.0.0.3)");
  EXPECT_EQ(CollectiveTimeoutMessage("broadcast", 1'500, &rank1, {0}, "gloo: recv"),
            "collective broadcast timed out after 1.5 s: rank 1 on h2 (10.0.0.3) waited for "
            "rank 0 on h1 (10.0.0.2) (gloo: recv)");
}

}  // namespace
}  // namespace mptrain
