// CudaBackend's normalization layers (Backend's BatchNorm and LayerNorm sections): shape
// checks and dispatch to kernels.h (batch norm) and layer_norm_kernels.h.

#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/batch_norm_kernels.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/layer_norm_kernels.h"

namespace mptrain::cuda {
namespace {

absl::Status CheckNorm(const char* op, Tensor x, std::initializer_list<Tensor> same,
                       std::initializer_list<std::pair<Tensor, int64_t>> per_feature) {
  for (const Tensor& t : same) {
    if (t.rows != x.rows || t.cols != x.cols || t.ld() != t.cols) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": shapes do not match"));
    }
  }
  for (const auto& [t, numel] : per_feature) {
    if (t.numel() != numel || t.dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": an f32 tensor of ", numel,
                                                     " elements was expected, got ", t.numel()));
    }
  }
  if (x.ld() != x.cols) return absl::InvalidArgumentError(absl::StrCat(op, ": x is strided"));
  return absl::OkStatus();
}

float* Fp(Tensor t) { return static_cast<float*>(t.data); }

}  // namespace

absl::Status CudaBackend::BatchNormStatistics(Tensor x, float eps, Tensor stats) {
  if (auto s = CheckNorm("BatchNormStatistics", x, {}, {{stats, 2 * x.cols + 1}}); !s.ok()) {
    return s;
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::BatchNormStatistics(x.data, x.dtype, x.rows, x.cols, eps,
                                                          Fp(stats), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::BatchNormCombineStatistics(Tensor gathered, float eps, float momentum,
                                                     Tensor running, Tensor mean_invstd) {
  const int64_t cols = running.numel() / 2;
  if (gathered.cols != 2 * cols + 1 || gathered.dtype != DType::kF32 ||
      mean_invstd.numel() != 2 * cols) {
    return absl::InvalidArgumentError("BatchNormCombineStatistics: shapes do not match");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::BatchNormCombineStatistics(
      Fp(gathered), gathered.rows, cols, eps, momentum, Fp(running), Fp(mean_invstd), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::BatchNormRunningStatistics(Tensor running, float eps,
                                                     Tensor mean_invstd) {
  const int64_t cols = running.numel() / 2;
  if (mean_invstd.numel() != 2 * cols) {
    return absl::InvalidArgumentError("BatchNormRunningStatistics: shapes do not match");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::BatchNormRunningStatistics(Fp(running), cols, eps,
                                                                 Fp(mean_invstd), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::BatchNormApply(Tensor x, Tensor mean_invstd, Tensor weight, Tensor bias,
                                         Tensor y) {
  const int64_t cols = x.cols;
  if (auto s = CheckNorm("BatchNormApply", x, {y},
                         {{mean_invstd, 2 * cols}, {weight, cols}, {bias, cols}});
      !s.ok()) {
    return s;
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::BatchNormApply(x.data, x.dtype, x.rows, cols,
                                                     Fp(mean_invstd), Fp(weight), Fp(bias),
                                                     y.data, y.dtype, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::BatchNormBackwardReduce(Tensor dy, Tensor x, Tensor mean_invstd,
                                                  Tensor sums, Tensor dweight_acc,
                                                  Tensor dbias_acc, bool overwrite_grads) {
  const int64_t cols = x.cols;
  if (auto s = CheckNorm("BatchNormBackwardReduce", x, {dy},
                         {{mean_invstd, 2 * cols},
                          {sums, 2 * cols},
                          {dweight_acc, cols},
                          {dbias_acc, cols}});
      !s.ok()) {
    return s;
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::BatchNormBackwardReduce(
      dy.data, dy.dtype, x.data, x.dtype, x.rows, cols, Fp(mean_invstd), Fp(sums),
      Fp(dweight_acc), Fp(dbias_acc), overwrite_grads, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::BatchNormBackwardInput(Tensor dy, Tensor x, Tensor mean_invstd,
                                                 Tensor weight, Tensor sums, double count,
                                                 Tensor dx) {
  const int64_t cols = x.cols;
  if (auto s = CheckNorm("BatchNormBackwardInput", x, {dy, dx},
                         {{mean_invstd, 2 * cols}, {weight, cols}, {sums, 2 * cols}});
      !s.ok()) {
    return s;
  }
  if (!(count > 0)) return absl::InvalidArgumentError("BatchNormBackwardInput: count <= 0");
  CUDA_RETURN_IF_ERROR(mptrain::cuda::BatchNormBackwardInput(
      dy.data, dy.dtype, x.data, x.dtype, x.rows, cols, Fp(mean_invstd), Fp(weight), Fp(sums),
      count, dx.data, dx.dtype, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerNormForward(Tensor x, Tensor weight, Tensor bias, float eps,
                                           Tensor row_stats, Tensor y) {
  const int64_t cols = x.cols;
  if (auto s = CheckNorm("LayerNormForward", x, {y},
                         {{weight, cols}, {bias, cols}, {row_stats, 2 * x.rows}});
      !s.ok()) {
    return s;
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::LayerNormForward(x.data, x.dtype, x.rows, cols, Fp(weight),
                                                       Fp(bias), eps, Fp(row_stats), y.data,
                                                       y.dtype, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerNormBackward(Tensor dy, Tensor x, Tensor row_stats, Tensor weight,
                                            Tensor dx, Tensor dweight_acc, Tensor dbias_acc,
                                            bool overwrite_grads) {
  const int64_t cols = x.cols;
  if (auto s = CheckNorm("LayerNormBackward", x, {dy, dx},
                         {{weight, cols},
                          {row_stats, 2 * x.rows},
                          {dweight_acc, cols},
                          {dbias_acc, cols}});
      !s.ok()) {
    return s;
  }
  return LaunchLayerNormBackward(dy, x, row_stats, weight, dx, dweight_acc, dbias_acc,
                                 overwrite_grads, Tensor{}, Tensor{});
}

absl::Status CudaBackend::LaunchLayerNormBackward(Tensor dy, Tensor x, Tensor row_stats,
                                                  Tensor weight, Tensor dx, Tensor dweight_acc,
                                                  Tensor dbias_acc, bool overwrite_grads,
                                                  Tensor d_residual, Tensor d_residual_low,
                                                  float* d_low_bias) {
  if (absl::Status s = Reserve(&layer_norm_partials_, &layer_norm_partials_bytes_,
                               mptrain::cuda::LayerNormParamPartialsBytes(x.rows, x.cols),
                               "the layer norm's partial sums");
      !s.ok()) {
    return s;
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::LayerNormBackward(
      dy.data, dy.dtype, x.data, x.dtype, x.rows, x.cols, Fp(row_stats), Fp(weight), dx.data,
      dx.empty() ? DType::kF32 : dx.dtype, Fp(dweight_acc), Fp(dbias_acc), overwrite_grads,
      static_cast<float*>(layer_norm_partials_), stream_, Fp(d_residual),
      d_residual_low.empty() ? nullptr : d_residual_low.data,
      d_residual_low.empty() ? DType::kF32 : d_residual_low.dtype, d_low_bias));
  return absl::OkStatus();
}

absl::Status CudaBackend::AddLayerNormForward(Tensor a, Tensor b, Tensor sum, Tensor weight,
                                              Tensor bias, float eps, Tensor row_stats, Tensor y) {
  const int64_t cols = sum.cols;
  if (sum.dtype != DType::kF32 || a.rows != sum.rows || a.cols != cols || b.rows != sum.rows ||
      b.cols != cols) {
    return absl::InvalidArgumentError("AddLayerNormForward: a, b and an f32 sum of one shape");
  }
  if (auto s = CheckNorm("AddLayerNormForward", sum, {a, b, y},
                         {{weight, cols}, {bias, cols}, {row_stats, 2 * sum.rows}});
      !s.ok()) {
    return s;
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::AddLayerNormForward(
      a.data, a.dtype, b.data, b.dtype, Fp(sum), sum.rows, cols, Fp(weight), Fp(bias), eps,
      Fp(row_stats), y.data, y.dtype, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerNormBackwardIntoResidual(Tensor dy, Tensor x, Tensor row_stats,
                                                        Tensor weight, Tensor /*scratch*/,
                                                        Tensor d_residual, Tensor d_residual_low,
                                                        Tensor dweight_acc, Tensor dbias_acc,
                                                        Tensor low_bias_acc, bool overwrite_grads) {
  const int64_t cols = x.cols;
  if (d_residual.dtype != DType::kF32) {
    return absl::InvalidArgumentError("LayerNormBackwardIntoResidual: an f32 residual gradient");
  }
  if (!low_bias_acc.empty() && (d_residual_low.empty() || low_bias_acc.numel() != cols)) {
    return absl::InvalidArgumentError(
        "LayerNormBackwardIntoResidual: a bias gradient of the branch needs its low copy and "
        "one value per column");
  }
  if (auto s = CheckNorm("LayerNormBackwardIntoResidual", x,
                         {dy, d_residual, d_residual_low.empty() ? d_residual : d_residual_low},
                         {{weight, cols},
                          {row_stats, 2 * x.rows},
                          {dweight_acc, cols},
                          {dbias_acc, cols}});
      !s.ok()) {
    return s;
  }
  // The branch's bias gradient in the same pass where the fused kernel runs (an f32 target);
  // otherwise a pass of its own over the low copy.
  const bool sum_in_pass = !low_bias_acc.empty() && low_bias_acc.dtype == DType::kF32 &&
                           mptrain::cuda::LayerNormBackwardSumsLowCopy(
                               dy.data, x.data, x.dtype, cols, Fp(weight), Fp(d_residual),
                               d_residual_low.data) &&
                           FusedLayerNormBiasGradients();
  absl::Status status = LaunchLayerNormBackward(
      dy, x, row_stats, weight, Tensor{}, dweight_acc, dbias_acc, overwrite_grads, d_residual,
      d_residual_low, sum_in_pass ? Fp(low_bias_acc) : nullptr);
  if (!status.ok() || low_bias_acc.empty() || sum_in_pass) return status;
  return BiasGradient(d_residual_low, low_bias_acc, overwrite_grads);
}

}  // namespace mptrain::cuda
