#include "trainer/rank_data.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mptrain {
namespace {

// Standard normal samples by Box-Muller over mt19937_64: reproducible on every platform.
NpyMatrix NormalMatrix(int64_t rows, int64_t cols, std::mt19937_64* generator) {
  NpyMatrix matrix{rows, cols, std::vector<float>(rows * cols)};
  auto unit = [&] { return (static_cast<double>((*generator)() >> 11) + 0.5) * 0x1.0p-53; };
  for (size_t i = 0; i < matrix.values.size(); i += 2) {
    double radius = std::sqrt(-2.0 * std::log(unit()));
    double angle = 2.0 * M_PI * unit();
    matrix.values[i] = static_cast<float>(radius * std::cos(angle));
    if (i + 1 < matrix.values.size()) {
      matrix.values[i + 1] = static_cast<float>(radius * std::sin(angle));
    }
  }
  return matrix;
}

NpyMatrix Rows(const NpyMatrix& matrix, int64_t first, int64_t count) {
  NpyMatrix shard{count, matrix.cols, {}};
  shard.values.assign(matrix.values.begin() + first * matrix.cols,
                      matrix.values.begin() + (first + count) * matrix.cols);
  return shard;
}

}  // namespace

absl::StatusOr<NpyMatrix> ReadClassIds(const std::string& path, int64_t classes);

namespace {

// Both files whole, checked against the model and each other.
absl::StatusOr<RankData> LoadNpy(const TrainingConfig& config, const std::string& features_path,
                                 const std::string& targets_path) {
  const int64_t input_dim = config.model.input_dim();
  const int64_t output_dim = config.model.output_dim();
  const bool classes = config.loss.type == LossType::kCrossEntropy;
  RankData data;
  ASSIGN_OR_RETURN(data.features, ReadNpyMatrix(features_path));
  if (classes) {
    ASSIGN_OR_RETURN(data.targets, ReadClassIds(targets_path, output_dim));
  } else {
    ASSIGN_OR_RETURN(data.targets, ReadNpyMatrix(targets_path));
  }
  // The spec's numbers only, never the files' (a row or column count is their content, and a
  // file may be anyone's).
  if (data.features.cols != input_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        features_path, ": does not have model.input_dim (", input_dim, ") columns"));
  }
  if (!classes && data.targets.cols != output_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        targets_path, ": does not have model.output_dim (", output_dim, ") columns"));
  }
  if (data.features.rows != data.targets.rows) {
    return absl::InvalidArgumentError(absl::StrCat(features_path, " and ", targets_path,
                                                   " do not have the same number of rows"));
  }
  return data;
}

}  // namespace

absl::StatusOr<NpyMatrix> ReadClassIds(const std::string& path, int64_t classes) {
  ASSIGN_OR_RETURN(NpyLabels labels, ReadNpyLabels(path));
  NpyMatrix ids{labels.count, 1, std::vector<float>(labels.count)};
  for (int64_t i = 0; i < labels.count; ++i) {
    const int64_t id = labels.values[i];
    if (id < 0 || id >= classes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": row ", i,
                                                     " has a class outside [0, ", classes,
                                                     ") (model.output_dim)"));
    }
    ids.values[i] = static_cast<float>(id);  // Exact: output_dim <= 2^20.
  }
  return ids;
}

absl::StatusOr<RankData> LoadRankData(const TrainingConfig& config, int rank, int world_size) {
  const int64_t input_dim = config.model.input_dim();
  const int64_t output_dim = config.model.output_dim();
  const bool classes = config.loss.type == LossType::kCrossEntropy;
  RankData data;
  if (config.data.source == DataConfig::Source::kSynthetic) {
    std::mt19937_64 generator(static_cast<uint64_t>(config.data.synthetic_seed) + rank);
    data.features = NormalMatrix(config.micro_batch_size, input_dim, &generator);
    if (classes) {
      data.targets = {config.micro_batch_size, 1, std::vector<float>(config.micro_batch_size)};
      for (float& id : data.targets.values) {
        id = static_cast<float>(generator() % static_cast<uint64_t>(output_dim));
      }
    } else {
      data.targets = NormalMatrix(config.micro_batch_size, output_dim, &generator);
    }
    return data;
  }
  ASSIGN_OR_RETURN(RankData all, LoadNpy(config, config.data.features_path,
                                          config.data.targets_path));
  if (config.data.shuffle) {
    if (all.features.rows > kMaxShuffledRows) {
      return absl::InvalidArgumentError(absl::StrCat(
          config.data.features_path, ": more rows than data.npy.shuffle allows (",
          kMaxShuffledRows, ")"));
    }
    all.total_rows = all.features.rows;
    return all;
  }
  const int64_t rows = all.features.rows;
  const int64_t first = rank * rows / world_size;
  const int64_t last = (rank + 1) * rows / world_size;
  if (last <= first) {
    return absl::InvalidArgumentError(absl::StrCat(config.data.features_path,
                                                   ": too few rows to give rank ", rank, " of ",
                                                   world_size, " any"));
  }
  data.features = Rows(all.features, first, last - first);
  data.targets = Rows(all.targets, first, last - first);
  data.total_rows = rows;
  return data;
}

absl::StatusOr<RankData> LoadEvalShard(const TrainingConfig& config, int rank, int world_size) {
  ASSIGN_OR_RETURN(RankData all,
                   LoadNpy(config, config.eval.features_path, config.eval.targets_path));
  const int64_t rows = all.features.rows;
  const int64_t first = rank * rows / world_size;
  const int64_t last = (rank + 1) * rows / world_size;
  RankData shard;
  shard.features = Rows(all.features, first, last - first);
  shard.targets = Rows(all.targets, first, last - first);
  shard.total_rows = rows;
  return shard;
}

}  // namespace mptrain
