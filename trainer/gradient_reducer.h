#pragma once

// DDP's gradient reduction on the stepping micro-batch: the backward pass tells the reducer
// when a layer's gradients are final (LayerGradientObserver); the reducer makes each complete
// bucket (planned once by bucket_planner.h) final in the accumulator and hands it to the
// allreduce, so that it overlaps the rest of the backward pass. A first layer that is alone in
// the last bucket and large is computed and reduced in row chunks, so that only a small
// allreduce is left after the backward pass.

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/bucket_planner.h"
#include "trainer/gradient_accumulator.h"
#include "trainer/model/parameter_table.h"

namespace mptrain {

// What the backward pass tells on the micro-batch whose gradients are reduced.
class LayerGradientObserver {
 public:
  virtual ~LayerGradientObserver() = default;
  // Row ranges (output features) in which the first layer's weight gradient is computed, one
  // after the other (it is the only layer whose input gradient is not needed, so its output
  // gradient may be sliced). One range of every row: computed whole.
  virtual std::vector<RowRange> FirstLayerRowChunks() const = 0;
  // Those rows of the first layer's weight gradient are computed (more than one chunk only).
  virtual absl::Status FirstLayerRowsReady(RowRange rows) = 0;
  // All of gradient group `layer`'s gradients are computed (ParameterTable::groups(): an MLP
  // layer, a transformer block). Groups arrive last first.
  virtual absl::Status LayerReady(size_t layer) = 0;
};

class GradientReducer final : public LayerGradientObserver {
 public:
  // DDP's default bucket cap.
  static constexpr int64_t kBucketBytes = 25 << 20;
  // A first layer above this many gradient bytes is reduced in chunks of about this size.
  static constexpr int64_t kChunkBytes = 64 << 20;

  // `on_span(span)` receives each final span of accumulator->grads() in backward order; the
  // spans cover every gradient and the metric slots (in the first bucket) exactly once.
  // Buckets are cut along `table`'s gradient groups. `first_weight_in_row_chunks`: the model
  // computes its first group's leading weight (a [rows, cols] matrix) in the row chunks
  // FirstLayerRowChunks() gives (the MLP's first Linear); else that is one chunk.
  using SpanReady = std::function<absl::Status(Tensor span)>;
  static absl::StatusOr<std::unique_ptr<GradientReducer>> Create(
      const ParameterTable& table, GradientAccumulator* accumulator, SpanReady on_span,
      int64_t bucket_bytes = kBucketBytes, int64_t chunk_bytes = kChunkBytes,
      bool first_weight_in_row_chunks = true);

  size_t bucket_count() const { return bucket_first_layer_.size(); }

  std::vector<RowRange> FirstLayerRowChunks() const override { return first_layer_chunks_; }
  absl::Status FirstLayerRowsReady(RowRange rows) override;
  absl::Status LayerReady(size_t layer) override;

 private:
  GradientReducer(std::vector<GradientGroup> groups, GradientAccumulator* accumulator,
                  SpanReady on_span)
      : groups_(std::move(groups)), accumulator_(accumulator), on_span_(std::move(on_span)) {}
  absl::Status FinishSpan(int64_t offset, int64_t end);

  std::vector<GradientGroup> groups_;
  // The first group's leading weight, as rows of first_cols_ (one row of the whole parameter
  // when it is no matrix).
  int64_t first_rows_ = 1;
  int64_t first_cols_ = 0;
  GradientAccumulator* accumulator_;
  SpanReady on_span_;
  // bucket_first_layer_[b]: the lowest group of bucket b (buckets last group first);
  // bucket_end_[b]: one past its last element of grads() (the metric slots are in bucket 0).
  std::vector<size_t> bucket_first_layer_;
  std::vector<int64_t> bucket_end_;
  std::vector<size_t> bucket_of_layer_;
  std::vector<RowRange> first_layer_chunks_;
};

}  // namespace mptrain
