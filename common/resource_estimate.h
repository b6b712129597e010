#pragma once

// What one rank of a job needs in memory, estimated from the spec alone, so that a job no
// worker can hold is refused at submit (instead of dying of std::bad_alloc or cudaMalloc in a
// rank) and is never placed on a worker too small for it. The estimate follows the trainer's
// allocations (trainer/mlp.cc, trainer/train_loop.cc) and rounds up; a data set read from
// .npy files adds the rank's shard, which only the rank knows (it checks it when it loads it).

#include <cstdint>
#include <string>

#include "proto/mptrain.pb.h"

namespace mptrain {

struct RankMemoryEstimate {
  int64_t parameters = 0;   // fp32 master weights and their low-precision copy
  int64_t gradients = 0;    // fp32 gradients (+ per-micro-batch low-precision slots)
  int64_t optimizer = 0;    // momentum (SGD) or the two moments (Adam, AdamW)
  int64_t activations = 0;  // one micro-batch: inputs, outputs, pre-activations, their grads
  int64_t workspace = 0;    // GEMM workspace, CUDA context and communicator buffers
  int64_t total = 0;        // Saturates at INT64_MAX: absurd specs do not overflow.

  // "12.3 GiB (parameters 4.0 GiB, gradients ..., ...)".
  std::string Describe() const;
};

// The spec must have defaults applied and pass ValidateJobSpec's shape rules.
RankMemoryEstimate EstimateRankMemory(const v1::JobSpec& spec);

// "1.5 GiB", "512.0 MiB", "8.0 TiB".
std::string FormatBytes(int64_t bytes);

}  // namespace mptrain
