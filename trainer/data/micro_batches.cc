#include "trainer/data/micro_batches.h"

#include <algorithm>
#include <vector>

#include "common/status_macros.h"
#include "trainer/data/sampler.h"

namespace mptrain {

absl::StatusOr<MicroBatches> MicroBatches::Create(Backend* backend, const RankData& data,
                                                  int64_t batch, const Shuffling& shuffling) {
  MicroBatches batches;
  batches.backend_ = backend;
  batches.shuffling_ = shuffling;
  ASSIGN_OR_RETURN(batches.features_,
                   backend->Allocate(DType::kF32, data.features.rows, data.features.cols));
  ASSIGN_OR_RETURN(batches.targets_,
                   backend->Allocate(DType::kF32, data.targets.rows, data.targets.cols));
  RETURN_IF_ERROR(backend->Upload(data.features.values.data(), batches.features_));
  RETURN_IF_ERROR(backend->Upload(data.targets.values.data(), batches.targets_));
  batches.batch_ = batch;
  if (!batches.in_place()) {
    ASSIGN_OR_RETURN(batches.x_, backend->Allocate(DType::kF32, batch, data.features.cols));
    ASSIGN_OR_RETURN(batches.y_, backend->Allocate(DType::kF32, batch, data.targets.cols));
  }
  if (shuffling.enabled) {
    batches.epoch_rows_ = DistributedSamplerLength(data.features.rows, shuffling.world_size);
    for (Tensor& indices : batches.epoch_indices_) {
      ASSIGN_OR_RETURN(indices, backend->Allocate(DType::kF32, 1, batches.epoch_rows_));
    }
  }
  return batches;
}

absl::Status MicroBatches::IndicesOfEpoch(int64_t epoch, Tensor* indices) {
  const int buffer = static_cast<int>(epoch % 2);
  if (indices_epoch_[buffer] != epoch) {
    const std::vector<int64_t> rows =
        DistributedSamplerIndices(features_.rows, shuffling_.world_size, shuffling_.rank,
                                  shuffling_.seed, epoch);
    std::vector<float> values(rows.begin(), rows.end());  // Exact: at most 2^24 rows.
    // Ordered after the work that read this buffer two epochs ago.
    RETURN_IF_ERROR(backend_->Upload(values.data(), epoch_indices_[buffer]));
    indices_epoch_[buffer] = epoch;
  }
  *indices = epoch_indices_[buffer];
  return absl::OkStatus();
}

absl::Status MicroBatches::Next(Tensor* x, Tensor* y) {
  if (in_place()) {
    *x = features_;
    *y = targets_;
    return absl::OkStatus();
  }
  if (served_ < staged_) {
    *x = staged_x_[served_];
    *y = staged_y_[served_];
    ++served_;
    return absl::OkStatus();
  }
  *x = x_;
  *y = y_;
  return Fill(x_, y_);
}

absl::Status MicroBatches::Stage(int64_t count) {
  if (in_place()) return absl::OkStatus();
  while (static_cast<int64_t>(staged_x_.size()) < count) {
    ASSIGN_OR_RETURN(Tensor x, backend_->Allocate(DType::kF32, batch_, features_.cols));
    ASSIGN_OR_RETURN(Tensor y, backend_->Allocate(DType::kF32, batch_, targets_.cols));
    staged_x_.push_back(x);
    staged_y_.push_back(y);
  }
  for (int64_t i = 0; i < count; ++i) RETURN_IF_ERROR(Fill(staged_x_[i], staged_y_[i]));
  staged_ = count;
  served_ = 0;
  return absl::OkStatus();
}

int64_t MicroBatches::StagingBytes(int64_t count) const {
  if (in_place()) return 0;
  return count * batch_ * (features_.cols + targets_.cols) * static_cast<int64_t>(sizeof(float));
}

absl::Status MicroBatches::Fill(Tensor x, Tensor y) {
  if (!shuffling_.enabled) {
    RETURN_IF_ERROR(backend_->CopyRowsWrapping(features_, cursor_, x));
    RETURN_IF_ERROR(backend_->CopyRowsWrapping(targets_, cursor_, y));
    cursor_ = (cursor_ + batch_) % features_.rows;
    return absl::OkStatus();
  }
  // The next batch rows of the sampler's stream, across epoch ends.
  for (int64_t done = 0; done < batch_;) {
    const int64_t take = std::min(batch_ - done, epoch_rows_ - cursor_);
    Tensor indices;
    RETURN_IF_ERROR(IndicesOfEpoch(epoch_, &indices));
    const Tensor slice = indices.FlatView(cursor_, 1, take);
    RETURN_IF_ERROR(backend_->GatherRows(features_, slice, x.RowSlice(done, take)));
    RETURN_IF_ERROR(backend_->GatherRows(targets_, slice, y.RowSlice(done, take)));
    done += take;
    cursor_ += take;
    if (cursor_ == epoch_rows_) {
      cursor_ = 0;
      ++epoch_;
    }
  }
  return absl::OkStatus();
}

int64_t MicroBatches::cursor() const { return cursor_; }

void MicroBatches::SeekToStep(int64_t steps_done, int64_t accumulation) {
  staged_ = served_ = 0;
  if (shuffling_.enabled) {
    // 128 bits: steps · A · B may pass 2^63.
    const __int128 position = static_cast<__int128>(steps_done) * accumulation * batch_;
    epoch_ = static_cast<int64_t>(position / epoch_rows_);
    cursor_ = static_cast<int64_t>(position % epoch_rows_);
    return;
  }
  // 128 bits: both factors are below `rows`, whose square may pass 2^63.
  const int64_t rows = features_.rows;
  cursor_ = static_cast<int64_t>(static_cast<__int128>(steps_done % rows) *
                                 (accumulation * batch_ % rows) % rows);
}

}  // namespace mptrain
