#pragma once

// The training data of one rank, on the host: either the fixed synthetic batch of the original
// example or this rank's shard of .npy files.

#include "absl/status/statusor.h"
#include "io/npy.h"
#include "trainer/training_config.h"

namespace mptrain {

struct RankData {
  NpyMatrix features;  // [rows, input_dim]
  NpyMatrix targets;   // [rows, output_dim], or [rows, 1] class ids for cross_entropy
  int64_t total_rows = 0;  // Rows of the whole set (all ranks).
};

// synthetic: one batch of micro_batch_size rows, standard normal (cross_entropy: class ids
// uniform in [0, output_dim)), drawn from seed + rank.
// npy: rows [rank*N/W, (rank+1)*N/W) of both files, or, with data.shuffle, all N rows (the
// sampler picks this rank's); INVALID_ARGUMENT naming the file when its width does not match
// the model, a class id is outside [0, output_dim) (naming the row), the two files differ in
// rows, the shard is empty, or a shuffled file has more than kMaxShuffledRows rows.
inline constexpr int64_t kMaxShuffledRows = int64_t{1} << 24;
absl::StatusOr<RankData> LoadRankData(const TrainingConfig& config, int rank, int world_size);

// This rank's rows [rank*N/W, (rank+1)*N/W) of the eval set (possibly none), checked as above.
absl::StatusOr<RankData> LoadEvalShard(const TrainingConfig& config, int rank, int world_size);

// Class ids of a .npy label file (int64 or int32) as a [N, 1] float matrix; INVALID_ARGUMENT
// naming the file and the row when an id is outside [0, classes).
absl::StatusOr<NpyMatrix> ReadClassIds(const std::string& path, int64_t classes);

}  // namespace mptrain
