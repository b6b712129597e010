// CudaBackend's loss and metric primitives (Backend's "Losses" section): shape checks and
// dispatch to kernels.h.

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/loss_kernels.h"

namespace mptrain::cuda {

absl::Status CudaBackend::SumRowsToF32(Tensor rows, Tensor out) {
  if (out.numel() != rows.cols || out.dtype != DType::kF32) {
    return absl::InvalidArgumentError("SumRowsToF32: needs an f32 output of one row's size");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::SumRowsToF32(rows.data, rows.dtype, rows.rows, rows.cols,
                                                   rows.ld(), static_cast<float*>(out.data),
                                                   stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::ScaledDifference(Tensor a, Tensor b, float coef,
                                           StepStateBuffer step_state, float seed_divisor,
                                           Tensor out) {
  if (a.numel() != b.numel() || a.numel() != out.numel() || a.dtype != out.dtype ||
      b.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        "ScaledDifference: a and out must match in size and dtype, b must be f32");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::ScaledDifference(
      a.data, a.dtype, static_cast<const float*>(b.data), a.numel(), coef, step_state.data,
      seed_divisor, out.data, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::SumSquaredDifference(Tensor a, Tensor b, double divide_by,
                                               float then_divide, Tensor acc) {
  if (a.numel() != b.numel() || b.dtype != DType::kF32 || acc.dtype != DType::kF32) {
    return absl::InvalidArgumentError("SumSquaredDifference: sizes or dtypes do not match");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::SumSquaredDifference(
      a.data, a.dtype, static_cast<const float*>(b.data), a.numel(), divide_by, then_divide,
      static_cast<float*>(acc.data), partials_, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::SquaredErrorAndGradient(Tensor a, Tensor b, double divide_by,
                                                  float then_divide, Tensor acc, float coef,
                                                  StepStateBuffer step_state, float seed_divisor,
                                                  Tensor out) {
  if (a.numel() != b.numel() || a.numel() != out.numel() || a.dtype != out.dtype ||
      b.dtype != DType::kF32 || acc.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        "SquaredErrorAndGradient: a and out must match in size and dtype, b and acc be f32");
  }
  bool fused = false;
  CUDA_RETURN_IF_ERROR(mptrain::cuda::SquaredErrorAndGradient(
      a.data, a.dtype, static_cast<const float*>(b.data), a.numel(), divide_by, then_divide,
      static_cast<float*>(acc.data), coef, step_state.data, seed_divisor, out.data, partials_,
      stream_, &fused));
  if (fused) return absl::OkStatus();
  return Backend::SquaredErrorAndGradient(a, b, divide_by, then_divide, acc, coef, step_state,
                                          seed_divisor, out);
}

absl::Status CudaBackend::SumProduct(Tensor a, Tensor b, double divide_by, float then_divide,
                                     Tensor acc) {
  if (a.numel() != b.numel() || a.dtype != DType::kF32 || b.dtype != DType::kF32) {
    return absl::InvalidArgumentError("SumProduct: needs two f32 tensors of one size");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::SumProduct(
      static_cast<const float*>(a.data), static_cast<const float*>(b.data), a.numel(), divide_by,
      then_divide, static_cast<float*>(acc.data), partials_, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::LogSoftmaxRows(Tensor x, Tensor out) {
  if (x.numel() != out.numel() || out.dtype != DType::kF32) {
    return absl::InvalidArgumentError("LogSoftmaxRows: needs an f32 output of x's size");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::LogSoftmaxRows(x.data, x.dtype, x.rows, x.cols,
                                                     static_cast<float*>(out.data), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Exp(Tensor x, Tensor out) {
  if (x.numel() != out.numel() || x.dtype != DType::kF32 || out.dtype != DType::kF32) {
    return absl::InvalidArgumentError("Exp: needs two f32 tensors of one size");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::Exp(static_cast<const float*>(x.data),
                                          static_cast<float*>(out.data), x.numel(), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::SmoothedOneHot(Tensor ids, float on, float off, Tensor out) {
  if (ids.numel() != out.rows || out.dtype != DType::kF32) {
    return absl::InvalidArgumentError("SmoothedOneHot: needs one id per row and an f32 output");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::SmoothedOneHot(static_cast<const float*>(ids.data), on, off,
                                                     out.rows, out.cols,
                                                     static_cast<float*>(out.data), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CountArgmaxMatches(Tensor x, Tensor ids, Tensor acc) {
  if (ids.numel() != x.rows) {
    return absl::InvalidArgumentError("CountArgmaxMatches: needs one id per row");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::CountArgmaxMatches(
      x.data, x.dtype, x.rows, x.cols, static_cast<const float*>(ids.data),
      static_cast<float*>(acc.data), stream_));
  return absl::OkStatus();
}

}  // namespace mptrain::cuda
