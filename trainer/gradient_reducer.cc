#include "trainer/gradient_reducer.h"

#include "common/status_macros.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<GradientReducer>> GradientReducer::Create(
    const ParameterTable& table, GradientAccumulator* accumulator, SpanReady on_span,
    int64_t bucket_bytes, int64_t chunk_bytes, bool first_weight_in_row_chunks) {
  const std::vector<GradientGroup>& groups = table.groups();
  const size_t count = groups.size();
  if (count == 0) return absl::InvalidArgumentError("gradient reducer: the model has no layers");
  std::unique_ptr<GradientReducer> reducer(
      new GradientReducer(groups, accumulator, std::move(on_span)));
  // Groups in the order the backward pass finishes them: the last first.
  std::vector<int64_t> sizes;
  for (size_t i = count; i-- > 0;) sizes.push_back((groups[i].end - groups[i].begin) * 4);
  ASSIGN_OR_RETURN(std::vector<PlannedBucket> buckets, PlanBuckets(sizes, bucket_bytes));
  reducer->bucket_of_layer_.resize(count);
  for (size_t b = 0; b < buckets.size(); ++b) {
    const size_t lowest = count - 1 - buckets[b].last;
    const size_t highest = count - 1 - buckets[b].first;
    reducer->bucket_first_layer_.push_back(lowest);
    reducer->bucket_end_.push_back(b == 0 ? table.total() + GradientAccumulator::kMetricSlots
                                          : groups[highest].end);
    for (size_t group = lowest; group <= highest; ++group) reducer->bucket_of_layer_[group] = b;
  }
  // The first group's leading weight [rows, cols] (the MLP's first Linear) in row chunks when
  // the model computes it so and it is alone in the last bucket.
  const ParameterSpec& first = table.parameters().front();
  const bool matrix = first.shape.size() == 2 && first.offset == groups[0].begin;
  reducer->first_rows_ = matrix ? first.shape[0] : 1;
  reducer->first_cols_ = matrix ? first.shape[1] : first.numel;
  reducer->first_layer_chunks_ = {{0, reducer->first_rows_}};
  const PlannedBucket& last = buckets.back();
  if (first_weight_in_row_chunks && matrix && last.first == last.last) {
    ASSIGN_OR_RETURN(reducer->first_layer_chunks_,
                     PlanRowChunks(reducer->first_rows_, reducer->first_cols_ * 4, chunk_bytes));
  }
  return reducer;
}

absl::Status GradientReducer::FinishSpan(int64_t offset, int64_t end) {
  RETURN_IF_ERROR(accumulator_->Finalize(offset, end - offset));
  if (!on_span_) return absl::OkStatus();
  return on_span_(accumulator_->grads().FlatView(offset, 1, end - offset));
}

absl::Status GradientReducer::FirstLayerRowsReady(RowRange rows) {
  const int64_t offset = groups_[0].begin + rows.first * first_cols_;
  return FinishSpan(offset, offset + rows.count * first_cols_);
}

absl::Status GradientReducer::LayerReady(size_t layer) {
  if (layer >= bucket_of_layer_.size()) {
    return absl::InvalidArgumentError("gradient reducer: no such layer");
  }
  const size_t bucket = bucket_of_layer_[layer];
  if (bucket_first_layer_[bucket] != layer) return absl::OkStatus();  // The bucket goes on.
  // In chunks, the weight rows went already: the rest of the group (the biases, the norm's
  // parameters) and the metric slots are left.
  const int64_t offset = layer == 0 && first_layer_chunks_.size() > 1
                             ? groups_[0].begin + first_rows_ * first_cols_
                             : groups_[layer].begin;
  return FinishSpan(offset, bucket_end_[bucket]);
}

}  // namespace mptrain
