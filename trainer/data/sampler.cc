#include "trainer/data/sampler.h"

#include <random>
#include <utility>

namespace mptrain {

std::vector<int64_t> TorchRandperm(int64_t n, uint64_t seed) {
  std::vector<int64_t> permutation(n);
  for (int64_t i = 0; i < n; ++i) permutation[i] = i;
  // at::mt19937(seed) keeps the low 32 bits; CPUGeneratorImpl::random() is one 32-bit draw.
  std::mt19937 generator(static_cast<uint32_t>(seed));
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t z = static_cast<int64_t>(generator() % static_cast<uint64_t>(n - i));
    std::swap(permutation[i], permutation[z + i]);
  }
  return permutation;
}

std::vector<int64_t> DistributedSamplerIndices(int64_t n, int world_size, int rank, uint64_t seed,
                                               int64_t epoch) {
  std::vector<int64_t> all = TorchRandperm(n, seed + static_cast<uint64_t>(epoch));
  const int64_t per_rank = DistributedSamplerLength(n, world_size);
  const int64_t total = per_rank * world_size;
  std::vector<int64_t> mine;
  mine.reserve(per_rank);
  // indices += indices[:padding] (repeated as often as needed), then indices[rank::world].
  for (int64_t i = rank; i < total; i += world_size) mine.push_back(all[i % n]);
  return mine;
}

}  // namespace mptrain
