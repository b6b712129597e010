#include "backends/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer/activation_math.h"
#include "trainer/norm_math.h"

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
  allocated_bytes_ += count * 4;
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

absl::Status CpuBackend::CompressGradients(Tensor src, float divisor, Tensor dst) {
  if (auto status = CheckSameSize("CompressGradients", src, dst); !status.ok()) return status;
  if (dst.dtype == DType::kF32) {
    return absl::InvalidArgumentError("CompressGradients: the destination must be f16 or bf16");
  }
  const float* in = F(src);
  float* out = F(dst);
  for (int64_t i = 0; i < src.numel(); ++i) {
    out[i] = RoundTo(dst.dtype, RoundTo(dst.dtype, in[i]) / divisor);
  }
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

absl::Status CpuBackend::GatherRows(Tensor src, Tensor indices, Tensor dst) {
  if (src.cols != dst.cols || indices.numel() != dst.rows) {
    return absl::InvalidArgumentError("GatherRows: column or index count mismatch");
  }
  for (int64_t row = 0; row < dst.rows; ++row) {
    const int64_t from = static_cast<int64_t>(F(indices)[row]);
    if (from < 0 || from >= src.rows) {
      return absl::InvalidArgumentError(absl::StrCat("GatherRows: row ", from, " outside [0, ",
                                                     src.rows, ")"));
    }
    std::memcpy(F(dst) + row * dst.cols, F(src) + from * src.cols, src.cols * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::LinearForward(Tensor x, Tensor w, Tensor b, ActivationKind act,
                                       Tensor pre, Tensor y) {
  const int64_t m = x.rows, k = x.cols, n = w.rows;
  if (w.cols != k || (!b.empty() && b.numel() != n) || y.rows != m || y.cols != n ||
      pre.numel() != y.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("LinearForward: shapes x[", m, ",", k, "] w[",
                                                   w.rows, ",", w.cols, "] y[", y.rows, ",",
                                                   y.cols, "] do not match"));
  }
  // pre = x · wᵀ with fp32 accumulation, then + b and one rounding, as the GEMM epilogue does.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, F(x), k, F(w), k, 0.0f,
              F(pre), n);
  const float* bias = b.empty() ? nullptr : F(b);
  float* p = F(pre);
  float* out = F(y);
  for (int64_t row = 0; row < m; ++row) {
    for (int64_t col = 0; col < n; ++col) {
      const int64_t i = row * n + col;
      p[i] = RoundTo(pre.dtype, bias == nullptr ? p[i] : p[i] + bias[col]);
      out[i] = RoundTo(y.dtype, mptrain::ActivationForward(act, p[i]));
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
  if (dy.rows != m || dy.cols != n || dw_acc.numel() != n * k ||
      (!db_acc.empty() && db_acc.numel() != n)) {
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
  if (db_acc.empty()) return absl::OkStatus();  // No bias (the LM head).
  return BiasGradient(dy, db_acc, overwrite_grads);
}

absl::Status CpuBackend::BiasGradient(Tensor dy, Tensor db_acc, bool overwrite_grads) {
  const int64_t m = dy.rows, n = dy.cols, ld = dy.ld();
  if (db_acc.numel() != n) return absl::InvalidArgumentError("BiasGradient: shapes do not match");
  if (db_acc.dtype != DType::kF32 && !overwrite_grads) {
    return absl::InvalidArgumentError("BiasGradient: low-precision targets need overwrite");
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

// ---- Normalization layers ----

namespace {

// Shapes of a norm operation: x [R, C] and every per-feature tensor of C (or k·C) elements.
absl::Status CheckNormShapes(const char* op, Tensor x, std::initializer_list<Tensor> same,
                             std::initializer_list<std::pair<Tensor, int64_t>> per_feature) {
  for (const Tensor& t : same) {
    if (t.rows != x.rows || t.cols != x.cols || t.ld() != t.cols) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": a [", t.rows, ", ", t.cols,
                                                     "] tensor where [", x.rows, ", ", x.cols,
                                                     "] was expected"));
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

}  // namespace

absl::Status CpuBackend::ActivationForward(ActivationKind act, Tensor x, Tensor y) {
  RETURN_IF_ERROR(CheckSameSize("ActivationForward", x, y));
  const float* in = F(x);
  float* out = F(y);
  for (int64_t i = 0; i < x.numel(); ++i) {
    out[i] = RoundTo(y.dtype, mptrain::ActivationForward(act, in[i]));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::BatchNormStatistics(Tensor x, float eps, Tensor stats) {
  const int64_t rows = x.rows, cols = x.cols;
  RETURN_IF_ERROR(CheckNormShapes("BatchNormStatistics", x, {}, {{stats, 2 * cols + 1}}));
  const float* in = F(x);
  float* out = F(stats);
  for (int64_t c = 0; c < cols; ++c) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) sum += in[r * cols + c];
    const double mean = sum / rows;
    double squares = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double d = in[r * cols + c] - mean;
      squares += d * d;
    }
    out[c] = static_cast<float>(mean);
    out[cols + c] = InverseStd(squares / rows, eps);
  }
  out[2 * cols] = static_cast<float>(rows);
  return absl::OkStatus();
}

absl::Status CpuBackend::BatchNormCombineStatistics(Tensor gathered, float eps, float momentum,
                                                    Tensor running, Tensor mean_invstd) {
  const int64_t cols = running.numel() / 2;
  if (gathered.cols != 2 * cols + 1 || gathered.dtype != DType::kF32) {
    return absl::InvalidArgumentError("BatchNormCombineStatistics: shapes do not match");
  }
  RETURN_IF_ERROR(CheckNormShapes("BatchNormCombineStatistics", gathered, {},
                                  {{running, 2 * cols}, {mean_invstd, 2 * cols}}));
  const float* g = F(gathered);
  float* run = F(running);
  float* out = F(mean_invstd);
  const int64_t width = 2 * cols + 1;
  for (int64_t c = 0; c < cols; ++c) {
    BatchStatisticsCombination combined;
    for (int64_t w = 0; w < gathered.rows; ++w) {
      combined.Add(g[w * width + c], g[w * width + cols + c], g[w * width + 2 * cols], eps);
    }
    out[c] = static_cast<float>(combined.avg);
    out[cols + c] = InverseStd(combined.BiasedVariance(), eps);
    run[c] = RunningUpdate(run[c], combined.avg, momentum);
    run[cols + c] = RunningUpdate(run[cols + c], combined.UnbiasedVariance(), momentum);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::BatchNormRunningStatistics(Tensor running, float eps,
                                                    Tensor mean_invstd) {
  const int64_t cols = running.numel() / 2;
  if (mean_invstd.numel() != 2 * cols) {
    return absl::InvalidArgumentError("BatchNormRunningStatistics: shapes do not match");
  }
  const float* run = F(running);
  float* out = F(mean_invstd);
  for (int64_t c = 0; c < cols; ++c) {
    out[c] = run[c];
    out[cols + c] = InverseStd(run[cols + c], eps);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::BatchNormApply(Tensor x, Tensor mean_invstd, Tensor weight, Tensor bias,
                                        Tensor y) {
  const int64_t rows = x.rows, cols = x.cols;
  RETURN_IF_ERROR(CheckNormShapes("BatchNormApply", x, {y},
                                  {{mean_invstd, 2 * cols}, {weight, cols}, {bias, cols}}));
  const float* in = F(x);
  const float* stats = F(mean_invstd);
  const float* w = F(weight);
  const float* b = F(bias);
  float* out = F(y);
  for (int64_t c = 0; c < cols; ++c) {
    const float a = stats[cols + c] * w[c];
    const float shift = b[c] - stats[c] * a;
    for (int64_t r = 0; r < rows; ++r) {
      out[r * cols + c] = RoundTo(y.dtype, in[r * cols + c] * a + shift);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::BatchNormBackwardReduce(Tensor dy, Tensor x, Tensor mean_invstd,
                                                 Tensor sums, Tensor dweight_acc,
                                                 Tensor dbias_acc, bool overwrite_grads) {
  const int64_t rows = x.rows, cols = x.cols;
  RETURN_IF_ERROR(CheckNormShapes(
      "BatchNormBackwardReduce", x, {dy},
      {{mean_invstd, 2 * cols}, {sums, 2 * cols}, {dweight_acc, cols}, {dbias_acc, cols}}));
  const float* g = F(dy);
  const float* in = F(x);
  const float* stats = F(mean_invstd);
  float* out = F(sums);
  float* dw = F(dweight_acc);
  float* db = F(dbias_acc);
  for (int64_t c = 0; c < cols; ++c) {
    double sum_dy = 0, sum_dy_xmu = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double d = g[r * cols + c];
      sum_dy += d;
      sum_dy_xmu += d * (static_cast<double>(in[r * cols + c]) - stats[c]);
    }
    out[c] = static_cast<float>(sum_dy);
    out[cols + c] = static_cast<float>(sum_dy_xmu);
    const float grad_weight = static_cast<float>(sum_dy_xmu * stats[cols + c]);
    dw[c] = (overwrite_grads ? 0.0f : dw[c]) + grad_weight;
    db[c] = (overwrite_grads ? 0.0f : db[c]) + static_cast<float>(sum_dy);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::BatchNormBackwardInput(Tensor dy, Tensor x, Tensor mean_invstd,
                                                Tensor weight, Tensor sums, double count,
                                                Tensor dx) {
  const int64_t rows = x.rows, cols = x.cols;
  RETURN_IF_ERROR(CheckNormShapes("BatchNormBackwardInput", x, {dy, dx},
                                  {{mean_invstd, 2 * cols}, {weight, cols}, {sums, 2 * cols}}));
  if (!(count > 0)) return absl::InvalidArgumentError("BatchNormBackwardInput: count <= 0");
  const float* g = F(dy);
  const float* in = F(x);
  const float* stats = F(mean_invstd);
  const float* w = F(weight);
  const float* s = F(sums);
  float* out = F(dx);
  for (int64_t c = 0; c < cols; ++c) {
    const float mean = stats[c], invstd = stats[cols + c];
    const float mean_dy = static_cast<float>(s[c] / count);
    const float k = static_cast<float>(s[cols + c] / count) * invstd * invstd;
    const float scale = invstd * w[c];
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r * cols + c;
      out[i] = RoundTo(dx.dtype, (g[i] - mean_dy - (in[i] - mean) * k) * scale);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormForward(Tensor x, Tensor weight, Tensor bias, float eps,
                                          Tensor row_stats, Tensor y) {
  const int64_t rows = x.rows, cols = x.cols;
  RETURN_IF_ERROR(CheckNormShapes("LayerNormForward", x, {y},
                                  {{weight, cols}, {bias, cols}, {row_stats, 2 * rows}}));
  const float* in = F(x);
  const float* w = F(weight);
  const float* b = F(bias);
  float* stats = F(row_stats);
  float* out = F(y);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * cols;
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += row[c];
    const double mean = sum / cols;
    double squares = 0;
    for (int64_t c = 0; c < cols; ++c) squares += (row[c] - mean) * (row[c] - mean);
    const float mean_f = static_cast<float>(mean);
    const float rstd = InverseStd(squares / cols, eps);
    stats[2 * r] = mean_f;
    stats[2 * r + 1] = rstd;
    for (int64_t c = 0; c < cols; ++c) {
      out[r * cols + c] = RoundTo(y.dtype, (row[c] - mean_f) * rstd * w[c] + b[c]);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormBackward(Tensor dy, Tensor x, Tensor row_stats, Tensor weight,
                                           Tensor dx, Tensor dweight_acc, Tensor dbias_acc,
                                           bool overwrite_grads) {
  const int64_t rows = x.rows, cols = x.cols;
  RETURN_IF_ERROR(CheckNormShapes(
      "LayerNormBackward", x, {dy, dx},
      {{weight, cols}, {row_stats, 2 * rows}, {dweight_acc, cols}, {dbias_acc, cols}}));
  const float* g = F(dy);
  const float* in = F(x);
  const float* stats = F(row_stats);
  const float* w = F(weight);
  float* out = F(dx);
  std::vector<double> dweight(cols, 0.0), dbias(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float mean = stats[2 * r], rstd = stats[2 * r + 1];
    double sum_g = 0, sum_gx = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const float xhat = (in[i] - mean) * rstd;
      const double gw = static_cast<double>(g[i]) * w[c];
      sum_g += gw;
      sum_gx += gw * xhat;
      dweight[c] += static_cast<double>(g[i]) * xhat;
      dbias[c] += g[i];
    }
    const float mean_g = static_cast<float>(sum_g / cols);
    const float mean_gx = static_cast<float>(sum_gx / cols);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const float xhat = (in[i] - mean) * rstd;
      out[i] = RoundTo(dx.dtype, rstd * (g[i] * w[c] - mean_g - xhat * mean_gx));
    }
  }
  float* dw = F(dweight_acc);
  float* db = F(dbias_acc);
  for (int64_t c = 0; c < cols; ++c) {
    dw[c] = (overwrite_grads ? 0.0f : dw[c]) + static_cast<float>(dweight[c]);
    db[c] = (overwrite_grads ? 0.0f : db[c]) + static_cast<float>(dbias[c]);
  }
  return absl::OkStatus();
}

// ---- Language models ----

absl::Status CpuBackend::Add(Tensor a, Tensor b, Tensor out) {
  RETURN_IF_ERROR(CheckSameSize("Add", a, b));
  RETURN_IF_ERROR(CheckSameSize("Add", a, out));
  const float* x = F(a);
  const float* y = F(b);
  float* z = F(out);
  for (int64_t i = 0; i < out.numel(); ++i) z[i] = RoundTo(out.dtype, x[i] + y[i]);
  return absl::OkStatus();
}

namespace {

// ids [R, 1] with R a multiple of seq_len in 1..positions, rows of `cols` columns.
absl::Status CheckEmbeddingShapes(const char* op, Tensor ids, int64_t seq_len, int64_t vocab_rows,
                                  int64_t positions, int64_t cols, Tensor rows) {
  if (ids.cols != 1 || seq_len < 1 || seq_len > positions || ids.rows % seq_len != 0 ||
      rows.rows != ids.rows || rows.cols != cols || vocab_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": shapes do not match"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> TokenId(const char* op, const float* ids, int64_t row,
                                int64_t vocab_rows) {
  const float id = ids[row];
  if (!(id >= 0 && id < static_cast<float>(vocab_rows)) || id != std::floor(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the token id of row ", row, " is not in [0, ", vocab_rows, ")"));
  }
  return static_cast<int64_t>(id);
}

}  // namespace

absl::Status CpuBackend::EmbeddingForward(Tensor ids, Tensor wte, Tensor wpe, int64_t seq_len,
                                          Tensor out) {
  RETURN_IF_ERROR(CheckEmbeddingShapes("EmbeddingForward", ids, seq_len, wte.rows, wpe.rows,
                                       wte.cols, out));
  if (wpe.cols != wte.cols) return absl::InvalidArgumentError("EmbeddingForward: widths differ");
  const int64_t cols = out.cols;
  for (int64_t r = 0; r < ids.rows; ++r) {
    ASSIGN_OR_RETURN(const int64_t id, TokenId("EmbeddingForward", F(ids), r, wte.rows));
    const float* token = F(wte) + id * cols;
    const float* position = F(wpe) + (r % seq_len) * cols;
    float* row = F(out) + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] = token[c] + position[c];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::EmbeddingBackward(Tensor ids, Tensor dout, int64_t seq_len,
                                           Tensor dwte_acc, Tensor dwpe_acc, bool overwrite_wte,
                                           bool overwrite_wpe) {
  RETURN_IF_ERROR(CheckEmbeddingShapes("EmbeddingBackward", ids, seq_len, dwte_acc.rows,
                                       dwpe_acc.rows, dwte_acc.cols, dout));
  if (dwpe_acc.cols != dwte_acc.cols) {
    return absl::InvalidArgumentError("EmbeddingBackward: widths differ");
  }
  const int64_t cols = dout.cols;
  // Every id is checked before anything is written.
  for (int64_t r = 0; r < ids.rows; ++r) {
    RETURN_IF_ERROR(TokenId("EmbeddingBackward", F(ids), r, dwte_acc.rows).status());
  }
  if (overwrite_wte) RETURN_IF_ERROR(Zero(dwte_acc));
  for (int64_t r = 0; r < ids.rows; ++r) {
    float* token = F(dwte_acc) + static_cast<int64_t>(F(ids)[r]) * cols;
    const float* g = F(dout) + r * cols;
    for (int64_t c = 0; c < cols; ++c) token[c] += g[c];
  }
  // Positions beyond seq_len (a shorter context than wpe's) get no gradient.
  if (overwrite_wpe) RETURN_IF_ERROR(Zero(dwpe_acc));
  for (int64_t t = 0; t < seq_len; ++t) {
    float* position = F(dwpe_acc) + t * cols;
    for (int64_t c = 0; c < cols; ++c) {
      float sum = 0.0f;
      for (int64_t r = t; r < ids.rows; r += seq_len) sum += F(dout)[r * cols + c];
      position[c] += sum;
    }
  }
  return absl::OkStatus();
}

namespace {

struct AttentionShape {
  int64_t seq = 0, width = 0, head = 0;
};

absl::StatusOr<AttentionShape> CheckAttentionShapes(const char* op, Tensor qkv, int64_t batch,
                                                    int64_t heads, Tensor probs, Tensor y) {
  if (batch < 1 || heads < 1 || qkv.rows % batch != 0 || qkv.cols % 3 != 0 ||
      (qkv.cols / 3) % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": qkv does not split into ", batch,
                                                   " sequences of ", heads, " heads"));
  }
  AttentionShape shape{qkv.rows / batch, qkv.cols / 3, qkv.cols / 3 / heads};
  if (probs.rows != batch * heads * shape.seq || probs.cols != shape.seq || y.rows != qkv.rows ||
      y.cols != shape.width || probs.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": shapes do not match"));
  }
  return shape;
}

void RoundMatrix(DType dtype, float* data, int64_t rows, int64_t cols, int64_t ld) {
  if (dtype == DType::kF32) return;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) data[r * ld + c] = RoundTo(dtype, data[r * ld + c]);
  }
}

}  // namespace

absl::Status CpuBackend::CausalAttentionForward(Tensor qkv, int64_t batch, int64_t heads,
                                                Tensor probs, Tensor y) {
  ASSIGN_OR_RETURN(const AttentionShape shape,
                   CheckAttentionShapes("CausalAttentionForward", qkv, batch, heads, probs, y));
  const int64_t T = shape.seq, C = shape.width, hs = shape.head;
  const DType dtype = qkv.dtype;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  attention_scratch_.resize(2 * T * T);
  float* scores = attention_scratch_.data();
  float* rounded = scores + T * T;
  for (int64_t b = 0; b < batch; ++b) {
    const float* base = F(qkv) + b * T * 3 * C;
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = base + h * hs;
      const float* k = base + C + h * hs;
      const float* v = base + 2 * C + h * hs;
      // s = q · kᵀ (fp32 sums), rounded; then the scale in fp32, rounded.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, q, 3 * C, k, 3 * C,
                  0.0f, scores, T);
      float* p = F(probs) + (b * heads + h) * T * T;
      for (int64_t t = 0; t < T; ++t) {
        float* row = scores + t * T;
        float max = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          row[s] = RoundTo(dtype, RoundTo(dtype, row[s]) * scale);
          max = std::max(max, row[s]);
        }
        float sum = 0.0f;
        for (int64_t s = 0; s <= t; ++s) {
          p[t * T + s] = std::exp(row[s] - max);
          sum += p[t * T + s];
        }
        const float inverse = 1.0f / sum;
        for (int64_t s = 0; s < T; ++s) {
          p[t * T + s] = s <= t ? p[t * T + s] * inverse : 0.0f;
          rounded[t * T + s] = RoundTo(dtype, p[t * T + s]);
        }
      }
      // y = round(p) · v, rounded.
      float* out = F(y) + b * T * C + h * hs;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, rounded, T, v,
                  3 * C, 0.0f, out, C);
      RoundMatrix(y.dtype, out, T, hs, C);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CausalAttentionBackward(Tensor qkv, Tensor probs, Tensor /*y*/, Tensor dy,
                                                 int64_t batch, int64_t heads, Tensor dqkv) {
  ASSIGN_OR_RETURN(const AttentionShape shape,
                   CheckAttentionShapes("CausalAttentionBackward", qkv, batch, heads, probs, dy));
  if (dqkv.rows != qkv.rows || dqkv.cols != qkv.cols) {
    return absl::InvalidArgumentError("CausalAttentionBackward: dqkv does not match qkv");
  }
  const int64_t T = shape.seq, C = shape.width, hs = shape.head;
  const DType dtype = dqkv.dtype;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  attention_scratch_.resize(2 * T * T);
  float* rounded = attention_scratch_.data();
  float* d_att = rounded + T * T;
  for (int64_t b = 0; b < batch; ++b) {
    const float* base = F(qkv) + b * T * 3 * C;
    float* d_base = F(dqkv) + b * T * 3 * C;
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = base + h * hs;
      const float* k = base + C + h * hs;
      const float* v = base + 2 * C + h * hs;
      const float* g = F(dy) + b * T * C + h * hs;
      const float* p = F(probs) + (b * heads + h) * T * T;
      for (int64_t i = 0; i < T * T; ++i) rounded[i] = RoundTo(dtype, p[i]);
      // da = dy · vᵀ, dv = round(p)ᵀ · dy, each rounded.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, g, C, v, 3 * C, 0.0f,
                  d_att, T);
      float* dv = d_base + 2 * C + h * hs;
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, rounded, T, g, C,
                  0.0f, dv, 3 * C);
      RoundMatrix(dtype, dv, T, hs, 3 * C);
      // Softmax's backward in fp32 on its fp32 output, then the scale's: d_att becomes ds.
      for (int64_t t = 0; t < T; ++t) {
        float* row = d_att + t * T;
        const float* prow = p + t * T;
        float dot = 0.0f;
        for (int64_t s = 0; s <= t; ++s) {
          row[s] = RoundTo(dtype, row[s]);
          dot += row[s] * prow[s];
        }
        for (int64_t s = 0; s < T; ++s) {
          row[s] = s <= t ? RoundTo(dtype, RoundTo(dtype, prow[s] * (row[s] - dot)) * scale)
                          : 0.0f;
        }
      }
      // dq = ds · k, dk = dsᵀ · q, each rounded.
      float* dq = d_base + h * hs;
      float* dk = d_base + C + h * hs;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, d_att, T, k, 3 * C,
                  0.0f, dq, 3 * C);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, d_att, T, q, 3 * C,
                  0.0f, dk, 3 * C);
      RoundMatrix(dtype, dq, T, hs, 3 * C);
      RoundMatrix(dtype, dk, T, hs, 3 * C);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::ScaledDifference(Tensor a, Tensor b, float coef,
                                          StepStateBuffer step_state, float seed_divisor,
                                          Tensor out) {
  if (auto status = CheckSameSize("ScaledDifference", a, b); !status.ok()) return status;
  if (auto status = CheckSameSize("ScaledDifference", a, out); !status.ok()) return status;
  const float seed = step_state.data->scale / seed_divisor;
  const float* x = F(a);
  const float* y = F(b);
  float* d = F(out);
  for (int64_t i = 0; i < a.numel(); ++i) d[i] = RoundTo(out.dtype, coef * (x[i] - y[i]) * seed);
  return absl::OkStatus();
}

absl::Status CpuBackend::SumSquaredDifference(Tensor a, Tensor b, double divide_by,
                                              float then_divide, Tensor acc) {
  if (auto status = CheckSameSize("SumSquaredDifference", a, b); !status.ok()) return status;
  const float* x = F(a);
  const float* y = F(b);
  double sum = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float diff = x[i] - y[i];
    sum += static_cast<double>(diff) * diff;
  }
  F(acc)[0] += static_cast<float>(sum / divide_by) / then_divide;
  return absl::OkStatus();
}

absl::Status CpuBackend::SumProduct(Tensor a, Tensor b, double divide_by, float then_divide,
                                    Tensor acc) {
  if (auto status = CheckSameSize("SumProduct", a, b); !status.ok()) return status;
  const float* x = F(a);
  const float* y = F(b);
  double sum = 0;
  for (int64_t i = 0; i < a.numel(); ++i) sum += static_cast<double>(x[i]) * y[i];
  F(acc)[0] += static_cast<float>(sum / divide_by) / then_divide;
  return absl::OkStatus();
}

absl::Status CpuBackend::LogSoftmaxRows(Tensor x, Tensor out) {
  if (auto status = CheckSameSize("LogSoftmaxRows", x, out); !status.ok()) return status;
  const int64_t cols = x.cols;
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* in = F(x) + r * cols;
    float* o = F(out) + r * cols;
    float max = in[0];
    for (int64_t c = 1; c < cols; ++c) max = std::max(max, in[c]);
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(in[c] - max));
    const float log_sum = static_cast<float>(std::log(sum));
    for (int64_t c = 0; c < cols; ++c) o[c] = in[c] - max - log_sum;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Exp(Tensor x, Tensor out) {
  if (auto status = CheckSameSize("Exp", x, out); !status.ok()) return status;
  for (int64_t i = 0; i < x.numel(); ++i) F(out)[i] = std::exp(F(x)[i]);
  return absl::OkStatus();
}

absl::Status CpuBackend::SmoothedOneHot(Tensor ids, float on, float off, Tensor out) {
  if (ids.numel() != out.rows) return absl::InvalidArgumentError("SmoothedOneHot: ids size");
  for (int64_t r = 0; r < out.rows; ++r) {
    const float id = F(ids)[r];
    for (int64_t c = 0; c < out.cols; ++c) {
      F(out)[r * out.cols + c] = (static_cast<float>(c) == id ? on : 0.0f) + off;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CountArgmaxMatches(Tensor x, Tensor ids, Tensor acc) {
  if (ids.numel() != x.rows) return absl::InvalidArgumentError("CountArgmaxMatches: ids size");
  float count = 0;
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* row = F(x) + r * x.cols;
    int64_t best = 0;
    for (int64_t c = 1; c < x.cols; ++c) {
      if (row[c] > row[best]) best = c;
    }
    if (static_cast<float>(best) == F(ids)[r]) count += 1;
  }
  F(acc)[0] += count;
  return absl::OkStatus();
}

absl::Status CpuBackend::GradientStatistics(Tensor grads, StepStateBuffer step_state) {
  StepState* state = step_state.data;
  const float* g = F(grads);
  const float inv_scale = InverseScale(state->scale);
  int32_t found_inf = 0;
  double sum_squares = 0;
  for (int64_t i = 0; i < grads.numel(); ++i) {
    if (!std::isfinite(g[i])) found_inf = 1;
    const float u = g[i] * inv_scale;
    sum_squares += static_cast<double>(u) * u;
  }
  state->found_inf = found_inf;
  state->sum_squares = sum_squares;
  return absl::OkStatus();
}

absl::Status CpuBackend::FinalizeStep(const StepConfig& config, Tensor metrics,
                                      StepStateBuffer step_state) {
  if (metrics.numel() != 2) return absl::InvalidArgumentError("FinalizeStep: needs 2 metrics");
  mptrain::FinalizeStep(config, F(metrics)[0], step_state.data);
  step_state.data->last_correct = F(metrics)[1];
  return absl::OkStatus();
}

absl::Status CpuBackend::UpdateParameters(const UpdateRule& rule, Tensor params, Tensor grads,
                                          Tensor slot_a, Tensor slot_b,
                                          StepStateBuffer step_state, Tensor params_low) {
  const int64_t n = params.numel();
  auto fits = [n](Tensor t) { return t.empty() || t.numel() == n; };
  if (grads.numel() != n || !fits(slot_a) || !fits(slot_b) || !fits(params_low)) {
    return absl::InvalidArgumentError("UpdateParameters: buffer sizes do not match");
  }
  const StepState& state = *step_state.data;
  if (state.skipped) return absl::OkStatus();
  const UpdateCoefficients coefficients = PrepareUpdate(rule, state);
  // The gradients as unscale_ leaves them (g * inv_scale), times clip_grad_norm_'s coefficient.
  const float inv_scale = InverseScale(state.last_scale);
  const float clip_coef = state.clip_coef;
  float* p = F(params);
  const float* g = F(grads);
  float unused = 0;
  float* a = slot_a.empty() ? nullptr : F(slot_a);
  float* b = slot_b.empty() ? nullptr : F(slot_b);
  for (int64_t i = 0; i < n; ++i) {
    ApplyUpdate(rule, coefficients, g[i] * inv_scale * clip_coef, &p[i],
                a != nullptr ? &a[i] : &unused, b != nullptr ? &b[i] : &unused);
  }
  if (!params_low.empty()) {
    float* low = F(params_low);
    for (int64_t i = 0; i < n; ++i) low[i] = RoundTo(params_low.dtype, p[i]);
  }
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
