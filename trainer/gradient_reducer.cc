#include "trainer/gradient_reducer.h"

#include "common/status_macros.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<GradientReducer>> GradientReducer::Create(
    const ParameterLayout& layout, GradientAccumulator* accumulator, SpanReady on_span,
    int64_t bucket_bytes, int64_t chunk_bytes) {
  const size_t layers = layout.layers.size();
  if (layers == 0) return absl::InvalidArgumentError("gradient reducer: the model has no layers");
  std::unique_ptr<GradientReducer> reducer(
      new GradientReducer(layout, accumulator, std::move(on_span)));
  // Layers in the order the backward pass finishes them: the last first.
  std::vector<int64_t> sizes;
  for (size_t i = layers; i-- > 0;) {
    const LayerLayout& layer = layout.layers[i];
    sizes.push_back((layer.end() - layer.weight_offset) * 4);  // Linear and its norm
  }
  ASSIGN_OR_RETURN(std::vector<PlannedBucket> buckets, PlanBuckets(sizes, bucket_bytes));
  reducer->bucket_of_layer_.resize(layers);
  for (size_t b = 0; b < buckets.size(); ++b) {
    const size_t lowest = layers - 1 - buckets[b].last;
    const size_t highest = layers - 1 - buckets[b].first;
    reducer->bucket_first_layer_.push_back(lowest);
    reducer->bucket_end_.push_back(b == 0 ? layout.total + GradientAccumulator::kMetricSlots
                                          : layout.layers[highest].end());
    for (size_t layer = lowest; layer <= highest; ++layer) reducer->bucket_of_layer_[layer] = b;
  }
  // The first layer in row chunks when it is alone in the last bucket.
  const LayerLayout& first = layout.layers[0];
  const PlannedBucket& last = buckets.back();
  reducer->first_layer_chunks_ = {{0, first.out}};
  if (last.first == last.last) {
    ASSIGN_OR_RETURN(reducer->first_layer_chunks_,
                     PlanRowChunks(first.out, first.in * 4, chunk_bytes));
  }
  return reducer;
}

absl::Status GradientReducer::FinishSpan(int64_t offset, int64_t end) {
  RETURN_IF_ERROR(accumulator_->Finalize(offset, end - offset));
  if (!on_span_) return absl::OkStatus();
  return on_span_(accumulator_->grads().FlatView(offset, 1, end - offset));
}

absl::Status GradientReducer::FirstLayerRowsReady(RowRange rows) {
  const LayerLayout& layer = layout_.layers[0];
  const int64_t offset = layer.weight_offset + rows.first * layer.in;
  return FinishSpan(offset, offset + rows.count * layer.in);
}

absl::Status GradientReducer::LayerReady(size_t layer) {
  if (layer >= bucket_of_layer_.size()) {
    return absl::InvalidArgumentError("gradient reducer: no such layer");
  }
  const size_t bucket = bucket_of_layer_[layer];
  if (bucket_first_layer_[bucket] != layer) return absl::OkStatus();  // The bucket goes on.
  const LayerLayout& l = layout_.layers[layer];
  // In chunks, the weight rows went already: the biases, the norm's parameters (and the metric
  // slots) are left.
  const int64_t offset = layer == 0 && first_layer_chunks_.size() > 1 ? l.bias_offset
                                                                      : l.weight_offset;
  return FinishSpan(offset, bucket_end_[bucket]);
}

}  // namespace mptrain
