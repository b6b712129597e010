// CudaBackend's language-model primitives (Backend's "Language models" and fused loss
// sections): shape checks and dispatch to language_model_kernels.h, cross_entropy_kernels.h and
// cudnn_attention.h.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cross_entropy_kernels.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/language_model_kernels.h"
#include "common/job_spec.h"

namespace mptrain::cuda {
namespace {

static_assert(kMaxFp32AttentionSeq == kMaxCudaFp32AttentionContext,
              "the job spec's validation and the fp32 attention kernel disagree");

float* Fp(Tensor t) { return static_cast<float*>(t.data); }

absl::Status CheckContiguous(const char* op, std::initializer_list<Tensor> tensors) {
  for (const Tensor& t : tensors) {
    if (!t.empty() && t.ld() != t.cols) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": a tensor is strided"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckEmbeddingShapes(const char* op, Tensor ids, int64_t seq_len, Tensor table,
                                  Tensor positions, Tensor rows) {
  if (ids.cols != 1 || ids.dtype != DType::kF32 || seq_len < 1 || seq_len > positions.rows ||
      ids.rows % seq_len != 0 || rows.rows != ids.rows || rows.cols != table.cols ||
      positions.cols != table.cols || table.rows < 1 || table.dtype != DType::kF32 ||
      positions.dtype != DType::kF32 || rows.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": shapes do not match"));
  }
  return CheckContiguous(op, {ids, table, positions, rows});
}

struct AttentionShape {
  int64_t seq = 0, width = 0, head = 0;
};

absl::StatusOr<AttentionShape> CheckAttentionShapes(const char* op, Tensor qkv, int64_t batch,
                                                    int64_t heads, Tensor y) {
  if (batch < 1 || heads < 1 || qkv.rows % batch != 0 || qkv.cols % 3 != 0 ||
      (qkv.cols / 3) % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": qkv does not split into ", batch,
                                                   " sequences of ", heads, " heads"));
  }
  const AttentionShape shape{qkv.rows / batch, qkv.cols / 3, qkv.cols / 3 / heads};
  if (y.rows != qkv.rows || y.cols != shape.width || y.dtype != qkv.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": y does not match qkv"));
  }
  if (qkv.dtype == DType::kF32 && shape.seq > kMaxFp32AttentionSeq) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": fp32 attention is limited to ",
                                                   kMaxFp32AttentionSeq, " positions, got ",
                                                   shape.seq));
  }
  // cuDNN's fused SDPA (job_spec.h: the job spec's validation refuses the same shapes).
  if (qkv.dtype != DType::kF32 &&
      (shape.head % kCudaFusedAttentionHeadSizeMultiple != 0 ||
       shape.head > kMaxCudaFusedAttentionHeadSize || shape.seq < kMinCudaFusedAttentionContext)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": cuDNN's fused attention takes a head size that is a multiple of ",
        kCudaFusedAttentionHeadSizeMultiple, " up to ", kMaxCudaFusedAttentionHeadSize,
        " and at least ", kMinCudaFusedAttentionContext, " positions, got head size ",
        shape.head, " and ", shape.seq, " positions"));
  }
  if (absl::Status s = CheckContiguous(op, {qkv, y}); !s.ok()) return s;
  return shape;
}

}  // namespace

absl::Status CudaBackend::Add(Tensor a, Tensor b, Tensor out) {
  if (a.numel() != out.numel() || b.numel() != out.numel()) {
    return absl::InvalidArgumentError("Add: sizes do not match");
  }
  if (absl::Status s = CheckContiguous("Add", {a, b, out}); !s.ok()) return s;
  CUDA_RETURN_IF_ERROR(
      AddMixed(a.data, a.dtype, b.data, b.dtype, out.data, out.dtype, out.numel(), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::EmbeddingForward(Tensor ids, Tensor wte, Tensor wpe, int64_t seq_len,
                                           Tensor out) {
  if (absl::Status s = CheckEmbeddingShapes("EmbeddingForward", ids, seq_len, wte, wpe, out);
      !s.ok()) {
    return s;
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::EmbeddingForward(Fp(ids), Fp(wte), wte.rows, Fp(wpe),
                                                       seq_len, out.rows, out.cols, Fp(out),
                                                       stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::EmbeddingBackward(Tensor ids, Tensor dout, int64_t seq_len,
                                            Tensor dwte_acc, Tensor dwpe_acc, bool overwrite_wte,
                                            bool overwrite_wpe) {
  if (absl::Status s =
          CheckEmbeddingShapes("EmbeddingBackward", ids, seq_len, dwte_acc, dwpe_acc, dout);
      !s.ok()) {
    return s;
  }
  const int64_t rows = ids.rows;
  if (rows >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("EmbeddingBackward: more than 2^31 tokens");
  }
  // Four int arrays of `rows` (keys and row numbers, before and after the sort), 16-byte
  // aligned each, and cub's temporary storage.
  const int64_t stride = (rows * 4 + 15) / 16 * 16;
  if (absl::Status s =
          Reserve(&embedding_keys_, &embedding_keys_bytes_, 4 * stride, "the embedding's sort");
      !s.ok()) {
    return s;
  }
  size_t temp_bytes = 0;
  CUDA_RETURN_IF_ERROR(EmbeddingSortTempBytes(rows, &temp_bytes));
  if (absl::Status s = Reserve(&embedding_sort_.sort_temp, &embedding_temp_bytes_,
                               static_cast<int64_t>(temp_bytes), "the embedding's sort");
      !s.ok()) {
    return s;
  }
  char* base = static_cast<char*>(embedding_keys_);
  embedding_sort_.keys_in = reinterpret_cast<int*>(base);
  embedding_sort_.keys_out = reinterpret_cast<int*>(base + stride);
  embedding_sort_.rows_in = reinterpret_cast<int*>(base + 2 * stride);
  embedding_sort_.rows_out = reinterpret_cast<int*>(base + 3 * stride);
  embedding_sort_.sort_temp_bytes = static_cast<size_t>(embedding_temp_bytes_);
  CUDA_RETURN_IF_ERROR(mptrain::cuda::EmbeddingBackward(
      Fp(ids), Fp(dout), seq_len, rows, dout.cols, Fp(dwte_acc), dwte_acc.rows, Fp(dwpe_acc),
      overwrite_wte, overwrite_wpe, embedding_sort_, stream_));
  return absl::OkStatus();
}

std::pair<int64_t, int64_t> CudaBackend::AttentionSavedShape(DType dtype, int64_t batch,
                                                             int64_t heads,
                                                             int64_t seq_len) const {
  if (dtype == DType::kF32) return {batch * heads * seq_len, seq_len};
  return {batch * heads * seq_len, 1};
}

absl::StatusOr<CudnnAttention*> CudaBackend::Attention() {
  if (attention_ == nullptr) {
    auto created = CudnnAttention::Create(stream_, device_);
    if (!created.ok()) return created.status();
    attention_ = std::move(*created);
  }
  return attention_.get();
}

absl::Status CudaBackend::CausalAttentionForward(Tensor qkv, int64_t batch, int64_t heads,
                                                 Tensor saved, Tensor y) {
  auto shape = CheckAttentionShapes("CausalAttentionForward", qkv, batch, heads, y);
  if (!shape.ok()) return shape.status();
  const auto [rows, cols] = AttentionSavedShape(qkv.dtype, batch, heads, shape->seq);
  if (saved.rows != rows || saved.cols != cols || saved.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("CausalAttentionForward: saved must be f32 [", rows, ", ", cols, "]"));
  }
  if (qkv.dtype == DType::kF32) {
    CUDA_RETURN_IF_ERROR(CausalAttentionForwardF32(Fp(qkv), batch, shape->seq, heads,
                                                   shape->head, Fp(saved), Fp(y), stream_));
    return absl::OkStatus();
  }
  auto attention = Attention();
  if (!attention.ok()) return attention.status();
  absl::Status status = (*attention)->Forward(qkv.data, qkv.dtype, batch, shape->seq, heads,
                                              shape->head, deterministic_, y.data, Fp(saved));
  if ((*attention)->TakeWorkspaceChanged()) ++buffer_generation_;
  return status;
}

absl::Status CudaBackend::CausalAttentionBackward(Tensor qkv, Tensor saved, Tensor y, Tensor dy,
                                                  int64_t batch, int64_t heads, Tensor dqkv) {
  auto shape = CheckAttentionShapes("CausalAttentionBackward", qkv, batch, heads, y);
  if (!shape.ok()) return shape.status();
  const auto [rows, cols] = AttentionSavedShape(qkv.dtype, batch, heads, shape->seq);
  if (saved.rows != rows || saved.cols != cols || saved.dtype != DType::kF32 ||
      dy.rows != y.rows || dy.cols != y.cols || dy.dtype != y.dtype || dqkv.rows != qkv.rows ||
      dqkv.cols != qkv.cols || dqkv.dtype != qkv.dtype) {
    return absl::InvalidArgumentError("CausalAttentionBackward: shapes do not match");
  }
  if (absl::Status s = CheckContiguous("CausalAttentionBackward", {dy, dqkv}); !s.ok()) return s;
  if (qkv.dtype == DType::kF32) {
    CUDA_RETURN_IF_ERROR(CausalAttentionBackwardF32(Fp(qkv), Fp(saved), Fp(dy), batch,
                                                    shape->seq, heads, shape->head, Fp(dqkv),
                                                    stream_));
    return absl::OkStatus();
  }
  auto attention = Attention();
  if (!attention.ok()) return attention.status();
  absl::Status status =
      (*attention)->Backward(qkv.data, y.data, dy.data, Fp(saved), qkv.dtype, batch, shape->seq,
                             heads, shape->head, deterministic_, dqkv.data);
  if ((*attention)->TakeWorkspaceChanged()) ++buffer_generation_;
  return status;
}

absl::Status CudaBackend::SoftmaxCrossEntropy(Tensor x, Tensor ids, float on, float off,
                                              double divide_by, float then_divide,
                                              Tensor metrics, float coef,
                                              StepStateBuffer step_state, float seed_divisor,
                                              Tensor d_logits) {
  if (ids.rows != x.rows || ids.cols != 1 || ids.dtype != DType::kF32 || metrics.numel() < 2 ||
      metrics.dtype != DType::kF32 || x.cols < 1 ||
      (!d_logits.empty() && (d_logits.rows != x.rows || d_logits.cols != x.cols)) ||
      (!d_logits.empty() && step_state.empty())) {
    return absl::InvalidArgumentError("SoftmaxCrossEntropy: shapes do not match");
  }
  // x and d_logits may be column views (a padded vocabulary's first columns); ids may not.
  if (absl::Status s = CheckContiguous("SoftmaxCrossEntropy", {ids}); !s.ok()) return s;
  if (!d_logits.empty() && d_logits.data == x.data && d_logits.ld() != x.ld()) {
    return absl::InvalidArgumentError("SoftmaxCrossEntropy: in place with different strides");
  }
  if (absl::Status s = Reserve(&row_losses_, &row_losses_bytes_, std::max<int64_t>(1, x.rows) * 8,
                               "the cross-entropy's row losses");
      !s.ok()) {
    return s;
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::SoftmaxCrossEntropy(
      x.data, x.dtype, x.ld(), Fp(ids), x.rows, x.cols, on, off, divide_by, then_divide,
      Fp(metrics), coef, step_state.data, seed_divisor, d_logits.data,
      d_logits.empty() ? x.dtype : d_logits.dtype, d_logits.empty() ? x.cols : d_logits.ld(),
      static_cast<double*>(row_losses_), stream_));
  return absl::OkStatus();
}

}  // namespace mptrain::cuda
