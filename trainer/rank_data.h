#pragma once

// The training data of one rank, on the host: either the fixed synthetic batch of the original
// example or this rank's shard of .npy files.

#include "absl/status/statusor.h"
#include "io/npy.h"
#include "trainer/training_config.h"

namespace mptrain {

struct RankData {
  NpyMatrix features;  // [rows, input_dim]
  NpyMatrix targets;   // [rows, output_dim]
};

// synthetic: one batch of micro_batch_size rows, standard normal, drawn from seed + rank.
// npy: rows [rank*N/W, (rank+1)*N/W) of both files; INVALID_ARGUMENT naming the file when its
// width does not match the model, the two files differ in rows, or the shard is empty.
absl::StatusOr<RankData> LoadRankData(const TrainingConfig& config, int rank, int world_size);

}  // namespace mptrain
