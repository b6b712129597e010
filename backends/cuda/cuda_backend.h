#pragma once

// The CUDA backend: cuBLAS GEMMs in fp16/bf16 with fp32 accumulation (CUBLAS_COMPUTE_32F), our
// kernels for everything else (kernels.cu), and a Collective (NCCL in production). All work
// goes to one non-blocking compute stream; the host never waits inside a step: it only waits,
// by polling with a timeout, in Download(), ReadStats() and NowMs().

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <functional>
#include <map>
#include <tuple>
#include <memory>
#include <optional>
#include <vector>

#include "backends/cuda/cudnn_attention.h"
#include "backends/cuda/language_model_kernels.h"
#include "trainer/backend.h"

namespace mptrain::cuda {

class CudaBackend final : public Backend {
 public:
  // Makes `device` current and creates the stream and cuBLAS handle. `make_collective` is
  // called with the compute stream (the collective orders itself against it).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      int device,
      const std::function<absl::StatusOr<std::unique_ptr<Collective>>(cudaStream_t)>&
          make_collective,
      int64_t wait_timeout_ms);
  ~CudaBackend() override;

  std::string Name() const override { return "cuda"; }
  void SetDeterministic(bool deterministic) override { deterministic_ = deterministic; }
  absl::StatusOr<Tensor> Allocate(DType dtype, int64_t rows, int64_t cols) override;
  absl::Status Upload(const float* host, Tensor dst) override;
  absl::Status Download(Tensor src, float* host) override;
  absl::Status Zero(Tensor tensor) override;
  // One kernel (init_kernels.h), queued: GPT-2 350M's draws in milliseconds.
  absl::Status FillNormal(Tensor out, uint64_t seed, int64_t first_index, double std) override;
  absl::Status Cast(Tensor src, Tensor dst) override;
  absl::Status CopyRowsWrapping(Tensor src, int64_t first, Tensor dst) override;
  absl::Status GatherRows(Tensor src, Tensor indices, Tensor dst) override;
  absl::Status LinearForward(Tensor x, Tensor w, Tensor b, ActivationKind act, Tensor pre,
                             Tensor y) override;
  absl::Status ActivationBackward(ActivationKind act, Tensor pre, Tensor dy,
                                  Tensor d_pre) override;
  absl::Status LinearBackward(Tensor x, Tensor w, Tensor dy, Tensor dx, Tensor dw_acc,
                              Tensor db_acc, bool overwrite_grads) override;
  // kGeluTanh in fp16/bf16: the input gradient's GEMM with cuBLASLt's DGELU epilogue (pre as
  // its auxiliary input), then the weight and bias gradients as LinearBackward; other cases
  // compose the two calls (Backend's default).
  absl::Status LinearBackwardThroughActivation(Tensor x, Tensor w, Tensor dy, ActivationKind act,
                                               Tensor pre, Tensor d_act, Tensor d_pre,
                                               Tensor dw_acc, Tensor db_acc,
                                               bool overwrite_grads) override;
  absl::Status BiasGradient(Tensor dy, Tensor db_acc, bool overwrite_grads) override;
  absl::Status SumRowsToF32(Tensor rows, Tensor out) override;
  absl::Status ActivationForward(ActivationKind act, Tensor x, Tensor y) override;
  absl::Status BatchNormStatistics(Tensor x, float eps, Tensor stats) override;
  absl::Status BatchNormCombineStatistics(Tensor gathered, float eps, float momentum,
                                          Tensor running, Tensor mean_invstd) override;
  absl::Status BatchNormRunningStatistics(Tensor running, float eps, Tensor mean_invstd) override;
  absl::Status BatchNormApply(Tensor x, Tensor mean_invstd, Tensor weight, Tensor bias,
                              Tensor y) override;
  absl::Status BatchNormBackwardReduce(Tensor dy, Tensor x, Tensor mean_invstd, Tensor sums,
                                       Tensor dweight_acc, Tensor dbias_acc,
                                       bool overwrite_grads) override;
  absl::Status BatchNormBackwardInput(Tensor dy, Tensor x, Tensor mean_invstd, Tensor weight,
                                      Tensor sums, double count, Tensor dx) override;
  absl::Status LayerNormForward(Tensor x, Tensor weight, Tensor bias, float eps, Tensor row_stats,
                                Tensor y) override;
  absl::Status LayerNormBackward(Tensor dy, Tensor x, Tensor row_stats, Tensor weight, Tensor dx,
                                 Tensor dweight_acc, Tensor dbias_acc,
                                 bool overwrite_grads) override;
  absl::Status AddLayerNormForward(Tensor a, Tensor b, Tensor sum, Tensor weight, Tensor bias,
                                   float eps, Tensor row_stats, Tensor y) override;
  absl::Status LayerNormBackwardIntoResidual(Tensor dy, Tensor x, Tensor row_stats, Tensor weight,
                                             Tensor scratch, Tensor d_residual,
                                             Tensor d_residual_low, Tensor dweight_acc,
                                             Tensor dbias_acc, Tensor low_bias_acc,
                                             bool overwrite_grads) override;
  // ---- Language models (cuda_language_model_ops.cc) ----
  absl::Status Add(Tensor a, Tensor b, Tensor out) override;
  absl::Status EmbeddingForward(Tensor ids, Tensor wte, Tensor wpe, int64_t seq_len,
                                Tensor out) override;
  absl::Status EmbeddingBackward(Tensor ids, Tensor dout, int64_t seq_len, Tensor dwte_acc,
                                 Tensor dwpe_acc, bool overwrite_wte, bool overwrite_wpe) override;
  // fp16/bf16: cuDNN's fused attention, the rows' log-sum-exp kept; fp32: our kernels with the
  // probabilities kept (the CPU reference's layout).
  std::pair<int64_t, int64_t> AttentionSavedShape(DType dtype, int64_t batch, int64_t heads,
                                                  int64_t seq_len) const override;
  absl::Status CausalAttentionForward(Tensor qkv, int64_t batch, int64_t heads, Tensor saved,
                                      Tensor y) override;
  absl::Status CausalAttentionBackward(Tensor qkv, Tensor saved, Tensor y, Tensor dy,
                                       int64_t batch, int64_t heads, Tensor dqkv) override;
  bool HasFusedSoftmaxCrossEntropy() const override { return true; }
  // Not cuDNN's (fp16/bf16): replayed from a CUDA graph, its deterministic SDPA backward (the
  // dP-in-workspace kernels) wrote 16-byte vectors past the end of a buffer (compute-sanitizer
  // memcheck on the H200, cuDNN 9 from PyTorch 2.11's wheels, 2026-12-02; op by op it runs
  // clean), and the replays' training then differed from op by op. The fused (default) backward
  // recorded ran clean under memcheck (H100, 2026-12-06) but was no faster: GPT-2 124M bf16
  // 132.7 against 132.3 ms at 16 x 4, 128.9 against 127.7 at 32 x 2 (the host stays ahead of
  // kernels this long). Such steps are issued op by op.
  bool CanRecordAttention(DType dtype) const override { return dtype == DType::kF32; }
  absl::Status SoftmaxCrossEntropy(Tensor x, Tensor ids, float on, float off, double divide_by,
                                   float then_divide, Tensor metrics, float coef,
                                   StepStateBuffer step_state, float seed_divisor,
                                   Tensor d_logits) override;
  absl::Status ScaledDifference(Tensor a, Tensor b, float coef, StepStateBuffer step_state,
                                float seed_divisor, Tensor out) override;
  absl::Status SumSquaredDifference(Tensor a, Tensor b, double divide_by, float then_divide,
                                    Tensor acc) override;
  absl::Status SquaredErrorAndGradient(Tensor a, Tensor b, double divide_by, float then_divide,
                                       Tensor acc, float coef, StepStateBuffer step_state,
                                       float seed_divisor, Tensor out) override;
  absl::Status SumProduct(Tensor a, Tensor b, double divide_by, float then_divide,
                          Tensor acc) override;
  absl::Status LogSoftmaxRows(Tensor x, Tensor out) override;
  absl::Status Exp(Tensor x, Tensor out) override;
  absl::Status SmoothedOneHot(Tensor ids, float on, float off, Tensor out) override;
  absl::Status CountArgmaxMatches(Tensor x, Tensor ids, Tensor acc) override;
  absl::Status CompressGradients(Tensor src, float divisor, Tensor dst) override;
  absl::Status GradientStatistics(Tensor grads, StepStateBuffer step_state) override;
  absl::Status FinalizeStep(const StepConfig& config, Tensor metrics,
                            StepStateBuffer step_state) override;
  absl::Status UpdateParameters(const UpdateRule& rule, Tensor params, Tensor grads,
                                Tensor slot_a, Tensor slot_b, StepStateBuffer step_state,
                                Tensor params_low) override;
  absl::StatusOr<StepStateBuffer> AllocateStepState(const StepState& initial) override;
  absl::StatusOr<StepState> ReadStepState(StepStateBuffer step_state) override;
  absl::Status SnapshotStats(StepStateBuffer step_state, int slot) override;
  absl::StatusOr<StepStats> ReadStats(int slot) override;
  absl::StatusOr<double> NowMs() override;
  Collective* collective() override { return collective_.get(); }
  // Steps recorded as a CUDA graph (stream capture of the compute stream, the collective's
  // streams joining through its events) and replayed with cudaGraphLaunch.
  bool CanRecordSteps() const override { return true; }
  absl::Status BeginStepRecording() override;
  absl::Status EndStepRecording() override;
  absl::Status ReplayStep(double lr) override;

 private:
  CudaBackend(int device, int64_t wait_timeout_ms)
      : device_(device), wait_timeout_ms_(wait_timeout_ms) {}
  // Polls `event` until done, checking the collective for asynchronous errors; on error or
  // timeout aborts the collective. Never blocks forever.
  absl::Status WaitFor(cudaEvent_t event, const char* what);
  absl::Status WaitForStream(const char* what);
  // Whether the last replayed step, collectives inside, has not completed (for timeouts).
  bool ReplayPending();
  // Ends a recording in progress, abandoning it; waits on nothing (runs before the collective's
  // abort: NcclCollective::SetAbortHooks).
  void EndRecordingInProgress();
  // Also destroys the recorded step, which was seen to wait for its replay: runs during the
  // collective's abort (NCCL's abort waits until the graphs that captured the communicator are
  // destroyed, and a replay waiting on a dead peer ends only once the abort has begun).
  void DropRecordedStep();
  absl::StatusOr<void*> Scratch(size_t bytes);  // Reused buffer for dW and staging.
  // `*buffer` holds at least `bytes` (grown after the stream drains, which invalidates a
  // recorded step: buffer_generation_). FAILED_PRECONDITION naming `what` while recording.
  absl::Status Reserve(void** buffer, int64_t* capacity, int64_t bytes, const char* what);
  absl::StatusOr<CudnnAttention*> Attention();
  absl::Status Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                    const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c,
                    int64_t ldc, DType dtype);
  // Column-major D[m, n] = op(A) · op(B) (+ bias per row of D, then ReLU, by the epilogue)
  // through cuBLASLt with a workspace, its algorithm chosen once per shape. UNIMPLEMENTED when
  // cuBLASLt has no algorithm (the caller falls back to cublasGemmEx).
  struct LtShape {
    bool transpose_a, transpose_b;
    int64_t m, n, k, lda, ldb, ldd;
    DType dtype;
    cublasLtEpilogue_t epilogue;
    std::vector<int64_t> Values() const;
    bool operator<(const LtShape& other) const {
      return std::tie(transpose_a, transpose_b, m, n, k, lda, ldb, ldd, dtype, epilogue) <
             std::tie(other.transpose_a, other.transpose_b, other.m, other.n, other.k, other.lda,
                      other.ldb, other.ldd, other.dtype, other.epilogue);
    }
  };
  // LayerNormBackward and LayerNormBackwardIntoResidual after their checks: the partial sums'
  // scratch, then the kernels (dx written, or d_residual added to when it is given).
  absl::Status LaunchLayerNormBackward(Tensor dy, Tensor x, Tensor row_stats, Tensor weight,
                                       Tensor dx, Tensor dweight_acc, Tensor dbias_acc,
                                       bool overwrite_grads, Tensor d_residual,
                                       Tensor d_residual_low, float* d_low_bias = nullptr);
  // `aux`: the epilogue's auxiliary matrix (DGELU's pre-activation), m x n with leading
  // dimension shape.m, in shape.dtype.
  absl::Status LtMatmul(const LtShape& shape, const void* a, const void* b, void* d,
                        const void* bias, const void* aux = nullptr);
  // A ones vector of at least `rows` elements of `dtype` (for bias gradients by GEMM).
  absl::StatusOr<const void*> Ones(DType dtype, int64_t rows);

  struct LtPlan {
    cublasLtMatmulDesc_t operation = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo;
    bool available = false;
    // cuBLASLt's candidates, best first by its heuristic; `algo` is the first until the plan
    // is tuned (TuneAlgorithm: each timed on the operands of its first call), then the fastest.
    std::vector<cublasLtMatmulAlgo_t> candidates;
    bool tuned = false;
  };
  // Times plan's candidates on these operands (not while recording; the stream drained) and
  // keeps the fastest in plan->algo. Returns OK with the heuristic's choice kept when nothing
  // can be timed.
  absl::Status TuneAlgorithm(LtPlan* plan, const void* a, const void* b, void* d);
  // Whether LinearBackwardThroughActivation may fuse (MPTRAIN_FUSED_DGELU=0: never, for A/B).
  static bool FusedActivationGradients();
  // Whether a GELU Linear's forward applies GELU in the GEMM's epilogue (GELU_AUX_BIAS: pre as
  // its auxiliary output; MPTRAIN_FUSED_GELU=0: a pass of its own after the GEMM, for A/B).
  static bool FusedActivationForward();
  // Whether LayerNormBackwardIntoResidual sums the branch's bias gradient in its pass
  // (MPTRAIN_FUSED_LN_BIAS=0: a pass of its own, for A/B).
  static bool FusedLayerNormBiasGradients();
  // bias_scratch_ with room for `elements` f32 values.
  absl::Status ReserveBiasScratch(int64_t elements);
  // How many of cuBLASLt's heuristic candidates a shape's first call times
  // (MPTRAIN_LT_CANDIDATES, 1 to kMaxLtCandidates; default kDefaultLtCandidates).
  static constexpr int kMaxLtCandidates = 32;
  static constexpr int kDefaultLtCandidates = 8;
  static int LtCandidates();
  static std::optional<cublasLtMatmulAlgo_t> FindTunedAlgorithm(int device, const LtShape& shape);
  static void KeepTunedAlgorithm(int device, const LtShape& shape,
                                 const cublasLtMatmulAlgo_t& algo);
  absl::StatusOr<LtPlan*> Plan(const LtShape& shape);

  int device_;
  int64_t wait_timeout_ms_;
  bool deterministic_ = false;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublas_lt_ = nullptr;
  void* lt_workspace_ = nullptr;
  static constexpr size_t kLtWorkspaceBytes = 64 << 20;
  std::map<LtShape, LtPlan> lt_plans_;
  void* ones_ = nullptr;  // Low-precision ones (fp16, bf16 and fp32 copies side by side).
  int64_t ones_rows_ = 0;
  void* bias_scratch_ = nullptr;
  int64_t bias_scratch_elements_ = 0;
  // The language model's lazily sized scratch.
  std::unique_ptr<CudnnAttention> attention_;
  EmbeddingSortScratch embedding_sort_;
  void* embedding_keys_ = nullptr;  // The four int arrays of embedding_sort_, side by side.
  int64_t embedding_keys_bytes_ = 0;
  int64_t embedding_temp_bytes_ = 0;
  void* row_losses_ = nullptr;
  int64_t row_losses_bytes_ = 0;
  // Upload's pinned staging: small f32 uploads (a language model's token ids and targets, every
  // micro-batch) are copied into the next slot and sent asynchronously, so that the host does
  // not wait for the GPU to drain before each micro-batch; a slot is reused once its copy is
  // done. Larger uploads (parameters, datasets) wait, as before. Bounded: kUploadSlots slots of
  // at most kMaxAsyncUploadBytes.
  static constexpr int kUploadSlots = 32;
  static constexpr size_t kMaxAsyncUploadBytes = size_t{4} << 20;
  struct UploadSlot {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t copied = nullptr;
  };
  UploadSlot upload_slots_[kUploadSlots];
  int next_upload_slot_ = 0;
  // LinearBackward's bias gradients' per-chunk column sums (bias_gradient_kernels.h).
  void* bias_partials_ = nullptr;
  int64_t bias_partials_bytes_ = 0;
  // LayerNormBackward's per-chunk column sums (layer_norm_kernels.h).
  void* layer_norm_partials_ = nullptr;
  int64_t layer_norm_partials_bytes_ = 0;
  std::unique_ptr<Collective> collective_;
  std::vector<void*> allocations_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  double* partials_ = nullptr;  // Reduction scratch (kReductionBlocks doubles).
  int* inf_flags_ = nullptr;
  StepState* stats_ring_ = nullptr;  // Pinned host memory, kStatsSlots entries.
  StepState* readback_ = nullptr;    // Pinned host memory for step state uploads and reads.
  cudaEvent_t stats_events_[kStatsSlots] = {};
  cudaEvent_t base_event_ = nullptr;
  cudaEvent_t now_event_ = nullptr;
  cudaEvent_t sync_event_ = nullptr;
  // The recorded step. A reallocation of a lazily grown buffer (scratch, ones, bias scratch)
  // bumps buffer_generation_: a recording that used the old one must not be replayed.
  cudaGraphExec_t step_graph_ = nullptr;
  bool recording_ = false;
  uint64_t buffer_generation_ = 0;
  uint64_t recorded_generation_ = 0;
  double* lr_device_ = nullptr;  // The learning rate a replayed UpdateParameters reads.
  // Pinned host copies of each replay's learning rate: the copy to lr_device_ is queued, so a
  // value must outlive it; a slot is reused once its copy's event has completed (long since,
  // as the loop reads the stats of earlier steps).
  double* lr_ring_ = nullptr;
  cudaEvent_t lr_copied_[kStatsSlots] = {};
  int lr_slot_ = 0;
  cudaEvent_t replay_done_ = nullptr;  // Recorded after each replay.
};

}  // namespace mptrain::cuda
