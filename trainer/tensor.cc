#include "trainer/backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "trainer/normal_draws.h"

namespace mptrain {

Tensor Tensor::RowSlice(int64_t first, int64_t count) const {
  Tensor view = *this;
  view.data = static_cast<char*>(data) + first * ld() * element_bytes;
  view.rows = count;
  return view;
}

Tensor Tensor::FlatView(int64_t offset, int64_t view_rows, int64_t view_cols) const {
  Tensor view = *this;
  view.data = static_cast<char*>(data) + offset * element_bytes;
  view.rows = view_rows;
  view.cols = view_cols;
  view.row_stride = 0;
  return view;
}

Tensor Tensor::ColumnSlice(int64_t first, int64_t count) const {
  Tensor view = *this;
  view.data = static_cast<char*>(data) + first * element_bytes;
  view.row_stride = ld();
  view.cols = count;
  return view;
}

}  // namespace mptrain

namespace mptrain {
namespace {

absl::Status NoNorm(const Backend& backend, const char* op) {
  return absl::UnimplementedError(
      absl::StrCat("model.norm: the ", backend.Name(), " backend does not implement ", op,
                   " (normalization layers); use model.norm none or another backend"));
}

}  // namespace

absl::Status Collective::AllGather(Tensor, Tensor) {
  return absl::UnimplementedError(
      "model.norm sync_batch_norm: this collective has no AllGather");
}

absl::Status Collective::AllReduceSum(Tensor) {
  return absl::UnimplementedError(
      "model.norm sync_batch_norm: this collective has no AllReduceSum");
}

absl::Status Backend::SquaredErrorAndGradient(Tensor a, Tensor b, double divide_by,
                                              float then_divide, Tensor acc, float coef,
                                              StepStateBuffer step_state, float seed_divisor,
                                              Tensor out) {
  absl::Status value = SumSquaredDifference(a, b, divide_by, then_divide, acc);
  if (!value.ok()) return value;
  return ScaledDifference(a, b, coef, step_state, seed_divisor, out);
}

absl::Status Backend::LinearBackwardThroughActivation(Tensor x, Tensor w, Tensor dy,
                                                      ActivationKind act, Tensor pre,
                                                      Tensor d_act, Tensor d_pre, Tensor dw_acc,
                                                      Tensor db_acc, bool overwrite_grads) {
  absl::Status linear = LinearBackward(x, w, dy, d_act, dw_acc, db_acc, overwrite_grads);
  if (!linear.ok()) return linear;
  return ActivationBackward(act, pre, d_act, d_pre);
}

absl::Status Backend::ActivationForward(ActivationKind, Tensor, Tensor) {
  return NoNorm(*this, "ActivationForward");
}
absl::Status Backend::BatchNormStatistics(Tensor, float, Tensor) {
  return NoNorm(*this, "BatchNormStatistics");
}
absl::Status Backend::BatchNormCombineStatistics(Tensor, float, float, Tensor, Tensor) {
  return NoNorm(*this, "BatchNormCombineStatistics");
}
absl::Status Backend::BatchNormRunningStatistics(Tensor, float, Tensor) {
  return NoNorm(*this, "BatchNormRunningStatistics");
}
absl::Status Backend::BatchNormApply(Tensor, Tensor, Tensor, Tensor, Tensor) {
  return NoNorm(*this, "BatchNormApply");
}
absl::Status Backend::BatchNormBackwardReduce(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                              bool) {
  return NoNorm(*this, "BatchNormBackwardReduce");
}
absl::Status Backend::BatchNormBackwardInput(Tensor, Tensor, Tensor, Tensor, Tensor, double,
                                             Tensor) {
  return NoNorm(*this, "BatchNormBackwardInput");
}
absl::Status Backend::LayerNormForward(Tensor, Tensor, Tensor, float, Tensor, Tensor) {
  return NoNorm(*this, "LayerNormForward");
}
absl::Status Backend::LayerNormBackward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                        bool) {
  return NoNorm(*this, "LayerNormBackward");
}

namespace {
absl::Status NoLanguageModelOp(const Backend& backend, const char* op) {
  return absl::UnimplementedError(absl::StrCat("the ", backend.Name(), " backend has no ", op,
                                               " (model.gpt)"));
}
}  // namespace

absl::Status Backend::Add(Tensor, Tensor, Tensor) { return NoLanguageModelOp(*this, "Add"); }

absl::Status Backend::AddLayerNormForward(Tensor a, Tensor b, Tensor sum, Tensor weight,
                                          Tensor bias, float eps, Tensor row_stats, Tensor y) {
  if (absl::Status added = Add(a, b, sum); !added.ok()) return added;
  return LayerNormForward(sum, weight, bias, eps, row_stats, y);
}

absl::Status Backend::LayerNormBackwardIntoResidual(Tensor dy, Tensor x, Tensor row_stats,
                                                    Tensor weight, Tensor scratch,
                                                    Tensor d_residual, Tensor d_residual_low,
                                                    Tensor dweight_acc, Tensor dbias_acc,
                                                    Tensor low_bias_acc, bool overwrite_grads) {
  if (!low_bias_acc.empty() && d_residual_low.empty()) {
    return absl::InvalidArgumentError(
        "LayerNormBackwardIntoResidual: a bias gradient of the branch needs its low copy");
  }
  absl::Status status = LayerNormBackward(dy, x, row_stats, weight, scratch, dweight_acc,
                                          dbias_acc, overwrite_grads);
  if (status.ok()) status = Add(d_residual, scratch, d_residual);
  if (status.ok() && !d_residual_low.empty()) status = Cast(d_residual, d_residual_low);
  if (status.ok() && !low_bias_acc.empty()) {
    status = BiasGradient(d_residual_low, low_bias_acc, overwrite_grads);
  }
  return status;
}
absl::Status Backend::EmbeddingForward(Tensor, Tensor, Tensor, int64_t, Tensor) {
  return NoLanguageModelOp(*this, "EmbeddingForward");
}
absl::Status Backend::EmbeddingBackward(Tensor, Tensor, int64_t, Tensor, Tensor, bool, bool) {
  return NoLanguageModelOp(*this, "EmbeddingBackward");
}
absl::Status Backend::CausalAttentionForward(Tensor, int64_t, int64_t, Tensor, Tensor) {
  return NoLanguageModelOp(*this, "CausalAttentionForward");
}
absl::Status Backend::CausalAttentionBackward(Tensor, Tensor, Tensor, Tensor, int64_t, int64_t,
                                              Tensor) {
  return NoLanguageModelOp(*this, "CausalAttentionBackward");
}
absl::Status Backend::SoftmaxCrossEntropy(Tensor, Tensor, float, float, double, float, Tensor,
                                          float, StepStateBuffer, float, Tensor) {
  return absl::UnimplementedError(
      absl::StrCat("the ", Name(), " backend has no fused SoftmaxCrossEntropy"));
}

absl::Status CheckFillNormal(Tensor out, int64_t first_index, double std) {
  if (out.dtype != DType::kF32 || out.ld() != out.cols) {
    return absl::InvalidArgumentError("FillNormal: out must be a contiguous f32 tensor");
  }
  if (first_index < 0 || !std::isfinite(std) || std < 0) {
    return absl::InvalidArgumentError(absl::StrCat("FillNormal: first_index ", first_index,
                                                   " and std ", std,
                                                   " must be >= 0 (std finite)"));
  }
  if (first_index > std::numeric_limits<int64_t>::max() - out.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FillNormal: first_index ", first_index, " + ", out.numel(), " values overflows int64"));
  }
  return absl::OkStatus();
}

void FillNormalOnHost(uint64_t seed, int64_t first_index, double std, float* out, int64_t n) {
  // Chunks of 2^18 values over the host's cores (at most 16): each value is a function of its
  // index alone, so the split does not change them.
  constexpr int64_t kChunk = int64_t{1} << 18;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t c = next++; c < chunks; c = next++) {
      // Both values of each pair from one draw; a chunk's first or last value may be half of
      // a pair (an odd first_index, an odd end).
      const int64_t begin = c * kChunk, end = std::min(n, (c + 1) * kChunk);
      int64_t i = begin;
      if (((first_index + i) & 1) != 0) {
        out[i] = NormalParameterValue(seed, static_cast<uint64_t>(first_index + i), std);
        ++i;
      }
      for (; i + 1 < end; i += 2) {
        const NormalPair pair =
            StandardNormalPair(seed, static_cast<uint64_t>(first_index + i) >> 1);
        out[i] = static_cast<float>(std * pair.even);
        out[i + 1] = static_cast<float>(std * pair.odd);
      }
      if (i < end) {
        out[i] = NormalParameterValue(seed, static_cast<uint64_t>(first_index + i), std);
      }
    }
  };
  const int64_t threads =
      std::min<int64_t>(chunks, std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 16));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
}

absl::Status Backend::FillNormal(Tensor out, uint64_t seed, int64_t first_index, double std) {
  if (absl::Status valid = CheckFillNormal(out, first_index, std); !valid.ok()) return valid;
  std::vector<float> host(static_cast<size_t>(out.numel()));
  FillNormalOnHost(seed, first_index, std, host.data(), out.numel());
  return Upload(host.data(), out);
}

}  // namespace mptrain
