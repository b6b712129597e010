#include "backends/cpu/gloo_collective.h"

#include <thread>

#include "gtest/gtest.h"
#include "tests/fake_collectives.h"

namespace mptrain {
namespace {

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

}  // namespace
}  // namespace mptrain
