#pragma once

// torch.utils.data.DistributedSampler's indices, bit for bit: each epoch a permutation of the N
// rows drawn as torch.randperm(N, generator=torch.Generator().manual_seed(seed + epoch)) does
// (mt19937 seeded with the low 32 bits, then a Fisher-Yates pass taking random() % (N - i)),
// padded by repeating its head to a multiple of the world size (drop_last=False), and rank r
// takes every world-th index from r: equal shards of ceil(N / W) rows.

#include <cstdint>
#include <vector>

namespace mptrain {

// torch.randperm(n, generator seeded with `seed`) on the CPU (PyTorch 1.13 and 2.x).
std::vector<int64_t> TorchRandperm(int64_t n, uint64_t seed);

// The indices rank `rank` of `world_size` visits in epoch `epoch` (shuffled as above).
std::vector<int64_t> DistributedSamplerIndices(int64_t n, int world_size, int rank, uint64_t seed,
                                               int64_t epoch);

// Rows per rank and epoch: ceil(n / world_size).
inline int64_t DistributedSamplerLength(int64_t n, int world_size) {
  return (n + world_size - 1) / world_size;
}

}  // namespace mptrain
