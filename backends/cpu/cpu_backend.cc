#include "backends/cpu/cpu_backend.h"

#include <cblas.h>

#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "trainer/activation_math.h"

namespace mptrain {
namespace {

float* F(Tensor t) { return static_cast<float*>(t.data); }

absl::Status CheckSameSize(const char* op, Tensor a, Tensor b) {
  if (a.numel() != b.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": size mismatch ", a.numel(), " vs ", b.numel()));
  }
  return absl::OkStatus();
}

}  // namespace

CpuBackend::CpuBackend(std::unique_ptr<Collective> collective)
    : collective_(std::move(collective)) {}

absl::StatusOr<Tensor> CpuBackend::Allocate(DType dtype, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) return absl::InvalidArgumentError("negative tensor shape");
  const int64_t count = rows * cols;
  auto memory = std::make_unique<double[]>((count + 1) / 2 + 1);  // Zero-initialised.
  Tensor tensor{memory.get(), dtype, rows, cols, 4};
  allocations_.push_back(std::move(memory));
  return tensor;
}

absl::Status CpuBackend::Upload(const float* host, Tensor dst) {
  float* out = F(dst);
  for (int64_t i = 0; i < dst.numel(); ++i) out[i] = RoundTo(dst.dtype, host[i]);
  return absl::OkStatus();
}

absl::Status CpuBackend::Download(Tensor src, float* host) {
  std::memcpy(host, src.data, src.numel() * sizeof(float));
  return absl::OkStatus();
}

absl::Status CpuBackend::Zero(Tensor tensor) {
  std::memset(tensor.data, 0, tensor.numel() * sizeof(float));
  return absl::OkStatus();
}

absl::Status CpuBackend::Cast(Tensor src, Tensor dst) {
  if (auto status = CheckSameSize("Cast", src, dst); !status.ok()) return status;
  const float* in = F(src);
  float* out = F(dst);
  for (int64_t i = 0; i < src.numel(); ++i) out[i] = RoundTo(dst.dtype, in[i]);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyRowsWrapping(Tensor src, int64_t first, Tensor dst) {
  if (src.cols != dst.cols || src.rows == 0) {
    return absl::InvalidArgumentError("CopyRowsWrapping: column mismatch or empty source");
  }
  for (int64_t row = 0; row < dst.rows; ++row) {
    const int64_t from = (first + row) % src.rows;
    std::memcpy(F(dst) + row * dst.cols, F(src) + from * src.cols, src.cols * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::LinearForward(Tensor x, Tensor w, Tensor b, ActivationKind act,
                                       Tensor pre, Tensor y) {
  const int64_t m = x.rows, k = x.cols, n = w.rows;
  if (w.cols != k || b.numel() != n || y.rows != m || y.cols != n || pre.numel() != y.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("LinearForward: shapes x[", m, ",", k, "] w[",
                                                   w.rows, ",", w.cols, "] y[", y.rows, ",",
                                                   y.cols, "] do not match"));
  }
  // pre = x · wᵀ with fp32 accumulation, then + b and one rounding, as the GEMM epilogue does.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, F(x), k, F(w), k, 0.0f,
              F(pre), n);
  const float* bias = F(b);
  float* p = F(pre);
  float* out = F(y);
  for (int64_t row = 0; row < m; ++row) {
    for (int64_t col = 0; col < n; ++col) {
      const int64_t i = row * n + col;
      p[i] = RoundTo(pre.dtype, p[i] + bias[col]);
      out[i] = RoundTo(y.dtype, ActivationForward(act, p[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::ActivationBackward(ActivationKind act, Tensor pre, Tensor dy,
                                            Tensor d_pre) {
  if (auto status = CheckSameSize("ActivationBackward", pre, dy); !status.ok()) return status;
  const float* p = F(pre);
  const float* g = F(dy);
  float* out = F(d_pre);
  for (int64_t i = 0; i < pre.numel(); ++i) {
    out[i] = RoundTo(d_pre.dtype, ActivationGradient(act, p[i], g[i]));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::LinearBackward(Tensor x, Tensor w, Tensor dy, Tensor dx, Tensor dw_acc,
                                        Tensor db_acc, bool overwrite_grads) {
  const int64_t m = x.rows, k = x.cols, n = w.rows, ld = dy.ld();
  if (dy.rows != m || dy.cols != n || dw_acc.numel() != n * k || db_acc.numel() != n) {
    return absl::InvalidArgumentError("LinearBackward: shapes do not match");
  }
  if (!dx.empty() && ld != n) {
    return absl::InvalidArgumentError("LinearBackward: a strided dy needs an empty dx");
  }
  if (!dx.empty()) {
    // dx = round(dy · w)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, F(dy), n, F(w), k,
                0.0f, F(dx), k);
    float* d = F(dx);
    for (int64_t i = 0; i < m * k; ++i) d[i] = RoundTo(dx.dtype, d[i]);
  }
  // dw = round(dyᵀ · x) in the compute dtype, accumulated into the fp32 gradient.
  scratch_.resize(n * k);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, F(dy), ld, F(x), k, 0.0f,
              scratch_.data(), k);
  // An f32 target accumulates; a low-precision one receives the rounded gradient itself.
  const bool store = dw_acc.dtype != DType::kF32;
  if (store && !overwrite_grads) {
    return absl::InvalidArgumentError("LinearBackward: low-precision targets need overwrite");
  }
  float* dw = F(dw_acc);
  for (int64_t i = 0; i < n * k; ++i) {
    dw[i] = (overwrite_grads ? 0.0f : dw[i]) + RoundTo(dy.dtype, scratch_[i]);
  }
  float* db = F(db_acc);
  const float* g = F(dy);
  for (int64_t col = 0; col < n; ++col) {
    float sum = 0;
    for (int64_t row = 0; row < m; ++row) sum += g[row * ld + col];
    db[col] = (overwrite_grads ? 0.0f : db[col]) + RoundTo(dy.dtype, sum);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::SumRowsToF32(Tensor rows, Tensor out) {
  if (out.numel() != rows.cols) return absl::InvalidArgumentError("SumRowsToF32: size mismatch");
  const float* in = F(rows);
  float* sums = F(out);
  const int64_t ld = rows.ld();
  for (int64_t c = 0; c < rows.cols; ++c) {
    float sum = 0.0f;
    for (int64_t r = 0; r < rows.rows; ++r) sum += in[r * ld + c];
    sums[c] = sum;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::MseLossBackward(Tensor pred, Tensor target, int64_t accumulation_steps,
                                         StepStateBuffer step_state, Tensor loss_acc,
                                         Tensor d_pred) {
  if (auto status = CheckSameSize("MseLossBackward", pred, target); !status.ok()) return status;
  const int64_t numel = pred.numel();
  const float* p = F(pred);
  const float* t = F(target);
  float* d = F(d_pred);
  double sum = 0;
  for (int64_t i = 0; i < numel; ++i) {
    const float diff = p[i] - t[i];
    sum += static_cast<double>(diff) * diff;
  }
  const float accumulation = static_cast<float>(accumulation_steps);
  F(loss_acc)[0] += static_cast<float>(sum / numel) / accumulation;
  // The chain PyTorch runs: (loss / A) * scale -> d loss = scale / A -> mse backward.
  const float upstream = step_state.data->scale / accumulation;
  const float norm = static_cast<float>(2.0 / numel);
  for (int64_t i = 0; i < numel; ++i) {
    d[i] = RoundTo(d_pred.dtype, norm * (p[i] - t[i]) * upstream);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::OptimizerStep(const StepConfig& config, Tensor params, Tensor grads,
                                       Tensor momentum, StepStateBuffer step_state,
                                       Tensor params_low) {
  const int64_t n = params.numel();
  if (grads.numel() != n + 1 || momentum.numel() != n) {
    return absl::InvalidArgumentError("OptimizerStep: buffer sizes do not match");
  }
  StepState* state = step_state.data;
  float* g = F(grads);
  float* p = F(params);
  float* m = F(momentum);
  // Phase 1: unscale in place (as GradScaler.unscale_), inf/NaN check, squared norm.
  const float inv_scale = InverseScale(state->scale);
  int32_t found_inf = 0;
  double sum_squares = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(g[i])) found_inf = 1;
    g[i] *= inv_scale;
    sum_squares += static_cast<double>(g[i]) * g[i];
  }
  state->found_inf = found_inf;
  state->sum_squares = sum_squares;
  // Phase 2: skip or step, clip coefficient, scale update.
  FinalizeStep(config, g[n], state);
  // Phase 3: the SGD update, unless the step is skipped; then zero the gradients.
  if (!state->skipped) {
    for (int64_t i = 0; i < n; ++i) SgdUpdate(config, g[i], state->clip_coef, &p[i], &m[i]);
    if (!params_low.empty()) {
      float* low = F(params_low);
      for (int64_t i = 0; i < n; ++i) low[i] = RoundTo(params_low.dtype, p[i]);
    }
  }
  g[n] = 0.0f;  // The loss slot; the next first micro-batch writes over the gradients.
  return absl::OkStatus();
}

absl::StatusOr<StepStateBuffer> CpuBackend::AllocateStepState(const StepState& initial) {
  step_states_.push_back(std::make_unique<StepState>(initial));
  return StepStateBuffer{step_states_.back().get()};
}

absl::StatusOr<StepState> CpuBackend::ReadStepState(StepStateBuffer step_state) {
  return *step_state.data;
}

absl::Status CpuBackend::SnapshotStats(StepStateBuffer step_state, int slot) {
  stats_ring_[slot].state = *step_state.data;
  auto now = NowMs();
  if (!now.ok()) return now.status();
  stats_ring_[slot].completed_ms = *now;
  return absl::OkStatus();
}

absl::StatusOr<StepStats> CpuBackend::ReadStats(int slot) { return stats_ring_[slot]; }

absl::StatusOr<double> CpuBackend::NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace mptrain
