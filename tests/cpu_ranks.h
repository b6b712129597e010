#pragma once

// Ranks of one job as threads of a test, each on its own CPU backend, joined over gloo through
// an in-memory store on 127.0.0.1: the multi-rank training tests' harness.

#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gloo_collective.h"
#include "trainer/in_memory_store.h"
#include "trainer/train_loop.h"

namespace mptrain::testing {

// run(rank, backend) on `world` threads at once; result i is rank i's (a rank whose gloo
// connection failed gets that error). Returns when every rank has.
inline std::vector<absl::StatusOr<TrainingResult>> RunCpuRanksOverGloo(
    int world, const std::function<absl::StatusOr<TrainingResult>(int, Backend*)>& run) {
  InMemoryKeyValueStore store;
  std::vector<absl::StatusOr<TrainingResult>> results(world);
  std::vector<std::thread> ranks;
  ranks.reserve(world);
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      auto collective = GlooCollective::Connect(rank, world, "127.0.0.1", &store, 30'000);
      if (!collective.ok()) {
        results[rank] = collective.status();
        return;
      }
      CpuBackend backend(std::move(*collective));
      results[rank] = run(rank, &backend);
    });
  }
  for (std::thread& rank : ranks) rank.join();
  return results;
}

}  // namespace mptrain::testing
