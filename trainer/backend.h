#pragma once

// The compute backend interface. The training loop (train_loop.cc) and the model (mlp.cc) are
// written once against it; the CPU backend (BLAS + gloo) and the CUDA backend (cuBLAS, our
// kernels, NCCL) implement it. A backend is chosen once at start-up (backend_registry.h).
//
// All operations are asynchronous with respect to the host on backends that can be (CUDA: one
// compute stream); only Download() and ReadStats() wait. Tensors are non-owning views of memory
// the backend allocated; shapes are row-major [rows, cols].

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/backend_types.h"
#include "trainer/optim/update_math.h"
#include "trainer/precision.h"
#include "trainer/step_math.h"

namespace mptrain {

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  // Bytes per element in memory: 2 for f16/bf16 on the GPU; the CPU backend keeps
  // low-precision values in 4-byte floats (exactly representable, see precision.h).
  int64_t element_bytes = 4;
  // Elements from one row to the next; 0 means cols (contiguous). Only LinearBackward's dy
  // accepts a strided tensor (a column slice); every other operation needs contiguous ones.
  int64_t row_stride = 0;

  int64_t ld() const { return row_stride != 0 ? row_stride : cols; }
  int64_t numel() const { return rows * cols; }
  bool empty() const { return data == nullptr; }
  // Rows [first, first + count) of this tensor (a view; no copy).
  Tensor RowSlice(int64_t first, int64_t count) const;
  // `count` elements starting at element `offset`, viewed as [rows, cols].
  Tensor FlatView(int64_t offset, int64_t rows, int64_t cols) const;
  // Columns [first, first + count) of every row (a strided view).
  Tensor ColumnSlice(int64_t first, int64_t count) const;
};

// The one collective the loop uses. Counting calls through this interface is how the tests
// prove that non-stepping micro-batches issue no gradient allreduce (AllReduceMean*); the
// normalization layers' small collectives (AllGather, AllReduceSum) and the buffer Broadcast
// are separate methods, counted separately.
class Collective {
 public:
  virtual ~Collective() = default;
  // In-place mean over ranks of an f32 buffer in the backend's memory, ordered after all work
  // issued before it and before all work issued after it.
  virtual absl::Status AllReduceMean(Tensor buffer) = 0;
  // The same, ordered after the work issued before it but free to overlap work issued after it
  // until JoinAllReduces(), which orders all later work after every pending allreduce. The loop
  // uses these to reduce one gradient bucket while the backward pass computes the next.
  virtual absl::Status AllReduceMeanAsync(Tensor buffer) { return AllReduceMean(buffer); }
  virtual absl::Status JoinAllReduces() { return absl::OkStatus(); }
  // In-place sum over ranks of an f16 or bf16 buffer (compressed gradients: DDP's fp16/bf16
  // compress hooks), summed in that dtype, every addition rounded to it, as NCCL and gloo do;
  // ordered like AllReduceMeanAsync and joined by JoinAllReduces(). UNIMPLEMENTED where a
  // collective has none.
  virtual absl::Status AllReduceSumCompressedAsync(Tensor buffer) {
    return absl::UnimplementedError("this collective has no compressed allreduce");
  }
  // In-place copy of rank `root`'s f32 buffer (in the backend's memory) to every rank, bit for
  // bit, ordered like AllReduceMean. Every rank calls it with the same root and element count.
  // INVALID_ARGUMENT for a root outside the world; otherwise the errors of AllReduceMean.
  virtual absl::Status Broadcast(Tensor buffer, int root) = 0;
  // sync_batch_norm's forward: recv row r = rank r's `send`, bit for bit. send [1, k] f32,
  // recv [world_size, k] f32, both in the backend's memory, ordered like AllReduceMean. Every
  // rank calls it with the same k. INVALID_ARGUMENT for mismatched shapes; otherwise the
  // errors of AllReduceMean. Default: UNIMPLEMENTED.
  virtual absl::Status AllGather(Tensor send, Tensor recv);
  // sync_batch_norm's backward: in-place sum over ranks of a small f32 buffer in the backend's
  // memory, ordered like AllReduceMean. Default: UNIMPLEMENTED.
  virtual absl::Status AllReduceSum(Tensor buffer);
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Thread-safe and idempotent: a collective in progress and every later one return ABORTED
  // naming `reason` promptly instead of waiting for peers (gloo: the pairs are closed, so the
  // peers fail too; NCCL: the waiting thread calls ncclCommAbort). Collectives built with a
  // StopToken (comm/stop_token.h) call it when the token trips.
  virtual void Abort(const std::string& reason) = 0;
};

// The StepState (step_math.h) in backend memory (device memory on CUDA): a typed handle, so that
// it is never read or written as a tensor of floats.
struct StepStateBuffer {
  StepState* data = nullptr;
  bool empty() const { return data == nullptr; }
};

// What ReadStats returns for one optimizer step.
struct StepStats {
  StepState state;
  double completed_ms = 0;  // When the step finished, on the backend's clock (ms).
};

// FillNormal's arguments checked (INVALID_ARGUMENT naming what is wrong), for its overrides.
absl::Status CheckFillNormal(Tensor out, int64_t first_index, double std);
// FillNormal's values for out[0, n) on the host's cores.
void FillNormalOnHost(uint64_t seed, int64_t first_index, double std, float* out, int64_t n);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string Name() const = 0;

  // The job's JobSpec.deterministic (torch.use_deterministic_algorithms): on, every op takes an
  // algorithm whose result does not depend on timing (CUDA: cuDNN's deterministic attention
  // backward, cuBLASLt's heuristic GEMM algorithm instead of the fastest one timed); off, the
  // fastest (atomics in the attention backward's dQ). Set before a job's first op; a backend
  // that is always deterministic (the CPU's) ignores it.
  virtual void SetDeterministic(bool /*deterministic*/) {}

  // Zero-filled memory owned by the backend until it is destroyed.
  virtual absl::StatusOr<Tensor> Allocate(DType dtype, int64_t rows, int64_t cols) = 0;
  // Host fp32 -> tensor (rounded to its dtype).
  virtual absl::Status Upload(const float* host, Tensor dst) = 0;
  // Tensor -> host fp32. Waits for the work that produces it.
  virtual absl::Status Download(Tensor src, float* host) = 0;
  virtual absl::Status Zero(Tensor tensor) = 0;
  // dst = src rounded to dst's dtype (same element count). src is f32, or, when dst is f32, any
  // dtype (widening is exact).
  virtual absl::Status Cast(Tensor src, Tensor dst) = 0;
  // out[i] = float(std · StandardNormalDraw(seed, first_index + i)) (trainer/normal_draws.h):
  // a parameter's initial values as a function of the seed and their index, generated where
  // the tensor lives. out is a contiguous f32 tensor; first_index >= 0, std finite and >= 0.
  // The default draws them on the host's cores and uploads them.
  virtual absl::Status FillNormal(Tensor out, uint64_t seed, int64_t first_index, double std);
  // dst rows = src rows [first, first + dst.rows), wrapping around the end of src.
  virtual absl::Status CopyRowsWrapping(Tensor src, int64_t first, Tensor dst) = 0;
  // dst row i = src row indices[i], f32; indices [1, dst.rows] f32 holding row numbers in
  // [0, src.rows) (exact below 2^24).
  virtual absl::Status GatherRows(Tensor src, Tensor indices, Tensor dst) = 0;

  // Autocast Linear: pre = round(x · wᵀ + b), y = round(act(pre)), products accumulated in
  // fp32. x [M, K], w [N, K], b [1, N] (or empty: no bias, the GPT's LM head), pre and y
  // [M, N], all in the compute dtype. With
  // kNone or kRelu, pre may alias y (ReLU commutes with rounding, and its derivative is taken
  // from the output, as PyTorch's threshold_backward does).
  virtual absl::Status LinearForward(Tensor x, Tensor w, Tensor b, ActivationKind act, Tensor pre,
                                     Tensor y) = 0;
  // d_pre = round(dy * act'(pre)).
  virtual absl::Status ActivationBackward(ActivationKind act, Tensor pre, Tensor dy,
                                          Tensor d_pre) = 0;
  // dx = round(dy · w) unless dx is empty; dw_acc += f32(round(dyᵀ · x));
  // db_acc += f32(round(Σ_rows dy)). dw_acc [N, K] and db_acc [1, N] are f32, or, with
  // `overwrite_grads`, written instead of added to. dw_acc and db_acc may instead be in the
  // compute dtype: then they receive round(dyᵀ · x) and round(Σ_rows dy) themselves (and
  // overwrite_grads must be set). When dx is empty, dy may be a column slice (strided): the
  // gradients of some output features only.
  virtual absl::Status LinearBackward(Tensor x, Tensor w, Tensor dy, Tensor dx, Tensor dw_acc,
                                      Tensor db_acc, bool overwrite_grads = false) = 0;
  // A Linear whose input is act(pre) (the GPT's mlp.c_proj after GELU), backward through both:
  // LinearBackward(x, w, dy, d_act, dw_acc, db_acc, overwrite_grads) and then
  // ActivationBackward(act, pre, d_act, d_pre): d_act [M, K] is scratch for that (the default
  // does exactly those two calls). A backend may fuse the activation's derivative into the
  // input gradient's GEMM (CUDA: cuBLASLt's DGELU epilogue for kGeluTanh in fp16/bf16), which
  // rounds once, d_pre = round(f32(dy · w) · act'(pre)), where the two calls round dy · w first
  // (as PyTorch's eager autograd does; torch.compile fuses such chains likewise): one rounding
  // of the compute dtype apart.
  virtual absl::Status LinearBackwardThroughActivation(Tensor x, Tensor w, Tensor dy,
                                                       ActivationKind act, Tensor pre,
                                                       Tensor d_act, Tensor d_pre,
                                                       Tensor dw_acc, Tensor db_acc,
                                                       bool overwrite_grads);
  // db_acc += f32(round(Σ_rows dy)) (or, with overwrite_grads, =): a Linear's bias gradient alone,
  // as LinearBackward computes it. dy [M, N] in the compute dtype (may be a strided column
  // slice), db_acc [1, N] f32, or in the compute dtype (then written, overwrite_grads set).
  virtual absl::Status BiasGradient(Tensor dy, Tensor db_acc, bool overwrite_grads) = 0;
  // out[c] = Σ_r f32(rows[r, c]) summed in row order; rows [R, C] in the compute dtype (may be a
  // strided column slice), out [1, C] f32.
  virtual absl::Status SumRowsToF32(Tensor rows, Tensor out) = 0;
  // ---- Elementwise and reductions for losses (trainer/loss/) ----
  // out = round(coef · (f32(a) − b) · seed), where seed = step_state.scale / seed_divisor is read
  // on the backend (no host synchronisation). a [R, C] in any dtype, b [R, C] f32, out [R, C].
  virtual absl::Status ScaledDifference(Tensor a, Tensor b, float coef, StepStateBuffer step_state,
                                        float seed_divisor, Tensor out) = 0;
  // acc[0] += f32(Σ (f32(a) − b)² / divide_by) / then_divide, the sum in double. a [R, C] in any
  // dtype, b [R, C] f32, acc [1, 1] f32.
  virtual absl::Status SumSquaredDifference(Tensor a, Tensor b, double divide_by,
                                            float then_divide, Tensor acc) = 0;
  // MSE's value and gradient at once: exactly SumSquaredDifference(a, b, divide_by, then_divide,
  // acc) then ScaledDifference(a, b, coef, step_state, seed_divisor, out), bit for bit; a
  // backend may read a and b once for both (CUDA, for a 16-bit a). The default makes the calls.
  virtual absl::Status SquaredErrorAndGradient(Tensor a, Tensor b, double divide_by,
                                               float then_divide, Tensor acc, float coef,
                                               StepStateBuffer step_state, float seed_divisor,
                                               Tensor out);
  // acc[0] += f32(Σ a · b / divide_by) / then_divide, the sum in double; a, b [R, C] f32.
  virtual absl::Status SumProduct(Tensor a, Tensor b, double divide_by, float then_divide,
                                  Tensor acc) = 0;
  // Row-wise log-softmax in fp32: out[r, c] = f32(x[r, c]) − max_r − log Σ_c exp(f32(x[r, c]) −
  // max_r), the sum in double. x [R, C] in any dtype, out [R, C] f32.
  virtual absl::Status LogSoftmaxRows(Tensor x, Tensor out) = 0;
  // out = exp(x), elementwise, f32.
  virtual absl::Status Exp(Tensor x, Tensor out) = 0;
  // out[r, c] = (c == ids[r] ? on : 0) + off, f32 [R, C]; ids [R, 1] f32 holding integers in
  // [0, C) (out of range: no `on` entry).
  virtual absl::Status SmoothedOneHot(Tensor ids, float on, float off, Tensor out) = 0;
  // acc[0] += the rows r of x [R, C] (any dtype) whose first maximum is at column ids[r].
  virtual absl::Status CountArgmaxMatches(Tensor x, Tensor ids, Tensor acc) = 0;

  // ---- Compressed gradient communication (trainer/gradient_communicator.h) ----
  // dst = round(round(src) / divisor), both roundings to dst's dtype (f16 or bf16), the division
  // in fp32: DDP's compress hooks' `bucket.buffer().to(dtype).div_(world_size)`. src [R, C] f32,
  // dst the same element count.
  virtual absl::Status CompressGradients(Tensor src, float divisor, Tensor dst) = 0;

  // ---- Normalization layers (trainer/mlp.cc; formulas in trainer/norm_math.h) ----
  // Rows are samples, columns features: x [R, C]. PyTorch's dtypes under autocast: batch norm
  // runs in x's dtype (it is on no autocast list) with fp32 statistics and fp32 affine
  // parameters; layer norm is on the fp32 list (x upcast, output fp32). Statistics, sums and
  // parameter gradients are f32; every sum is taken in double. The defaults return
  // UNIMPLEMENTED naming model.norm, for a backend without them.
  //
  // An activation alone: y = round_y(act(f32(x))). x and y [R, C], any dtypes (after a norm).
  virtual absl::Status ActivationForward(ActivationKind act, Tensor x, Tensor y);
  // torch.batch_norm_stats: stats [1, 2C + 1] f32 = [mean[C], invstd[C], R] of x (any dtype)
  // with invstd = 1 / sqrt(biased variance + eps).
  virtual absl::Status BatchNormStatistics(Tensor x, float eps, Tensor stats);
  // torch.batch_norm_gather_stats_with_counts over gathered [W, 2C + 1] rows of
  // BatchNormStatistics (one per rank; W = 1 for a local batch norm): the combined mean and
  // biased variance (Chan's parallel formula, in the order of the rows), into mean_invstd
  // [2, C] f32 = [mean; 1 / sqrt(var + eps)], and running [2, C] f32 = [running_mean;
  // running_var] updated as (1 − momentum) · old + momentum · new with the unbiased variance.
  virtual absl::Status BatchNormCombineStatistics(Tensor gathered, float eps, float momentum,
                                                  Tensor running, Tensor mean_invstd);
  // Evaluation: mean_invstd = [running_mean; 1 / sqrt(running_var + eps)], from running [2, C].
  virtual absl::Status BatchNormRunningStatistics(Tensor running, float eps, Tensor mean_invstd);
  // y = round_y(f32(x) · a + b') per feature, a = invstd · weight, b' = bias − mean · a.
  // x, y [R, C] (y in x's dtype under autocast); mean_invstd [2, C], weight, bias [1, C] f32.
  virtual absl::Status BatchNormApply(Tensor x, Tensor mean_invstd, Tensor weight, Tensor bias,
                                      Tensor y);
  // torch.batch_norm_backward_reduce: sums [2, C] f32 = [Σ_r dy; Σ_r dy · (x − mean)] over this
  // rank's rows, and the affine gradients dweight_acc += f32(Σ dy · (x − mean) · invstd),
  // dbias_acc += f32(Σ dy) ([1, C] f32; written instead with `overwrite_grads`). dy and x
  // [R, C], any dtypes.
  virtual absl::Status BatchNormBackwardReduce(Tensor dy, Tensor x, Tensor mean_invstd,
                                               Tensor sums, Tensor dweight_acc, Tensor dbias_acc,
                                               bool overwrite_grads);
  // torch.batch_norm_backward_elemt: dx = round_dx((dy − Σdy / N − (x − mean) · invstd² ·
  // Σdy(x − mean) / N) · invstd · weight), with `sums` as BatchNormBackwardReduce left them
  // (summed over ranks for sync_batch_norm) and N the rows they cover (all ranks').
  virtual absl::Status BatchNormBackwardInput(Tensor dy, Tensor x, Tensor mean_invstd,
                                              Tensor weight, Tensor sums, double count,
                                              Tensor dx);
  // torch.nn.functional.layer_norm in fp32: per row, mean and rstd = 1 / sqrt(biased var +
  // eps) into row_stats [R, 2] f32, y [R, C] f32 = (f32(x) − mean) · rstd · weight + bias.
  virtual absl::Status LayerNormForward(Tensor x, Tensor weight, Tensor bias, float eps,
                                        Tensor row_stats, Tensor y);
  // Its backward: with x̂ = (x − mean) · rstd and g = dy · weight, dx = round_dx(rstd · (g −
  // mean_c(g) − x̂ · mean_c(g · x̂))); dweight_acc += f32(Σ_r dy · x̂), dbias_acc += f32(Σ_r dy)
  // ([1, C] f32; written instead with `overwrite_grads`). dy [R, C] f32, x [R, C] any dtype.
  virtual absl::Status LayerNormBackward(Tensor dy, Tensor x, Tensor row_stats, Tensor weight,
                                         Tensor dx, Tensor dweight_acc, Tensor dbias_acc,
                                         bool overwrite_grads);
  // A transformer's residual step and the LayerNorm after it, fused where a backend can (one
  // pass fewer over the residual stream), the same values as the composed ops bit for bit:
  // sum = Add(a, b) (f32), then LayerNormForward(sum, ...).
  virtual absl::Status AddLayerNormForward(Tensor a, Tensor b, Tensor sum, Tensor weight,
                                           Tensor bias, float eps, Tensor row_stats, Tensor y);
  // LayerNormBackward into `scratch` (f32, like x), then d_residual (f32) += scratch and, unless
  // empty, d_residual_low = round(d_residual) (Cast): the residual stream's gradient and its
  // copy in the compute dtype for the branch below. A fused backend may leave scratch unused.
  // With low_bias_acc (may be empty; needs d_residual_low), also
  // BiasGradient(d_residual_low, low_bias_acc, overwrite_grads): the bias gradient of the Linear
  // whose output is that branch's (the GPT's c_proj biases), which a backend may sum in the same
  // pass (CUDA), so that Linear's backward is called without it.
  virtual absl::Status LayerNormBackwardIntoResidual(Tensor dy, Tensor x, Tensor row_stats,
                                                     Tensor weight, Tensor scratch,
                                                     Tensor d_residual, Tensor d_residual_low,
                                                     Tensor dweight_acc, Tensor dbias_acc,
                                                     Tensor low_bias_acc, bool overwrite_grads);

  // ---- Language models (trainer/model/gpt_model.cc; dtypes as parity/gpt_reference.py) ----
  // The defaults return UNIMPLEMENTED naming the op, for a backend without them.
  //
  // out = round_out(f32(a) + f32(b)), elementwise (the residual stream: F + B -> F). out may
  // alias a or b.
  virtual absl::Status Add(Tensor a, Tensor b, Tensor out);
  // Token + position embedding in fp32: out[r] = wte[ids[r]] + wpe[r mod seq_len]. ids [R, 1]
  // f32 holding token ids in [0, wte.rows) (INVALID_ARGUMENT naming the row otherwise), R a
  // multiple of seq_len <= wpe.rows; wte [Vp, C], wpe [T, C], out [R, C], all f32.
  virtual absl::Status EmbeddingForward(Tensor ids, Tensor wte, Tensor wpe, int64_t seq_len,
                                        Tensor out);
  // Its backward, f32: dwte_acc[ids[r]] += dout[r] in row order (added to, or, with
  // `overwrite_wte`, written over: rows no id names become 0); dwpe_acc[t] = Σ_b dout[b·T + t]
  // added to dwpe_acc, or written with `overwrite_wpe`.
  virtual absl::Status EmbeddingBackward(Tensor ids, Tensor dout, int64_t seq_len,
                                         Tensor dwte_acc, Tensor dwpe_acc, bool overwrite_wte,
                                         bool overwrite_wpe);
  // What CausalAttentionForward keeps for its backward, as the [rows, cols] of an f32 tensor
  // the model allocates: by default the softmax probabilities [B·H·T, T] (row (b·H + h)·T + t;
  // the CPU reference, and CUDA in fp32); a flash-style backend keeps each row's log-sum-exp
  // instead, [B·H·T, 1] (CUDA in fp16/bf16, cuDNN's fused attention): no T×T matrix in memory.
  // Whether a step holding CausalAttentionForward/Backward in `dtype` may be recorded
  // (BeginStepRecording) and replayed.
  virtual bool CanRecordAttention(DType /*dtype*/) const { return true; }
  virtual std::pair<int64_t, int64_t> AttentionSavedShape(DType dtype, int64_t batch,
                                                          int64_t heads, int64_t seq_len) const {
    return {batch * heads * seq_len, seq_len};
  }
  // Causal self-attention over the packed qkv [B·T, 3C] (q, k, v side by side, head h at
  // columns h·hs..(h+1)·hs−1 of each; hs = C / heads), in the compute dtype of qkv:
  //   s = round(q·kᵀ) (fp32 sums), s = round(f32(s) · (1/sqrt(hs))), masked above the diagonal,
  //   p = softmax(f32(s)) in fp32,
  //   y = round(round(p) · v) into y [B·T, C] (heads side by side),
  // and `saved` [AttentionSavedShape] what its backward reads. That is the CPU reference's
  // rounding (PyTorch's math attention, written out in parity/gpt_reference.py); a fused
  // backend keeps s and p in fp32 on chip (PyTorch's flash/cuDNN SDPA does the same) and
  // rounds only y.
  virtual absl::Status CausalAttentionForward(Tensor qkv, int64_t batch, int64_t heads,
                                              Tensor saved, Tensor y);
  // Its backward (autograd's mirror of that flow): with a = round(p), da = round(dy · vᵀ),
  // dv = round(aᵀ · dy), ds = round(p ⊙ (f32(da) − Σ_row f32(da) ⊙ p)),
  // ds = round(f32(ds) · (1/sqrt(hs))), dq = round(ds · k), dk = round(dsᵀ · q), written into
  // dqkv [B·T, 3C] (qkv's dtype). y is the forward's output, dy [B·T, C] its gradient; `saved`
  // as the forward left it (a backend may overwrite it: one backward per forward).
  virtual absl::Status CausalAttentionBackward(Tensor qkv, Tensor saved, Tensor y, Tensor dy,
                                               int64_t batch, int64_t heads, Tensor dqkv);

  // ---- Fused softmax cross-entropy (trainer/loss/cross_entropy.cc) ----
  // Whether SoftmaxCrossEntropy is implemented. Without it the loss composes LogSoftmaxRows,
  // SmoothedOneHot, SumProduct, CountArgmaxMatches, Exp and ScaledDifference over [R, C] f32
  // buffers (four of them: 26 GB for a GPT-2 micro-batch of 32 × 1024 tokens).
  virtual bool HasFusedSoftmaxCrossEntropy() const { return false; }
  // The same values in one pass per row, with no [R, C] buffer: with log p = LogSoftmaxRows(x)
  // and q = SmoothedOneHot(ids, on, off),
  //   metrics[0] += f32(Σ_r Σ_c q · log p / divide_by) / then_divide (the sum in double),
  //   metrics[1] += CountArgmaxMatches(x, ids),
  //   unless d_logits is empty: d_logits = round(f32(coef · (exp(log p) − q) · seed)) in its
  //   dtype, seed = step_state.scale / seed_divisor (as ScaledDifference, then Cast).
  // x [R, C] any dtype, ids [R, 1] f32, metrics [1, 2] f32; d_logits [R, C] may alias x; x and
  // d_logits may be column views (ColumnSlice: a padded vocabulary's first C columns). Bit for
  // bit the composed ops, except the loss sum's order (its last bits) and, on CUDA, each term's
  // exp in fp32 (the composed LogSoftmaxRows there does the same).
  virtual absl::Status SoftmaxCrossEntropy(Tensor x, Tensor ids, float on, float off,
                                           double divide_by, float then_divide, Tensor metrics,
                                           float coef, StepStateBuffer step_state,
                                           float seed_divisor, Tensor d_logits);

  // ---- The optimizer step (step_math.h's phases; trainer/optim/) ----
  // Phase 1, a reduction over the n fp32 gradients (still multiplied by the scale):
  // step_state.found_inf = any non-finite; step_state.sum_squares = Σ (g · inv_scale)², in
  // double, inv_scale = InverseScale(step_state.scale).
  virtual absl::Status GradientStatistics(Tensor grads, StepStateBuffer step_state) = 0;
  // Phase 2 on the backend: FinalizeStep(config, metrics[0], step_state) (step_math.h), and
  // step_state.last_correct = metrics[1]. metrics [1, 2] f32: the step's averaged loss and
  // correct count.
  virtual absl::Status FinalizeStep(const StepConfig& config, Tensor metrics,
                                    StepStateBuffer step_state) = 0;
  // Phase 3, elementwise over the n parameters, unless step_state.skipped: with
  // g = grads[i] · InverseScale(last_scale) · clip_coef, ApplyUpdate(rule, PrepareUpdate(rule,
  // state), g, &params[i], &slot_a[i], &slot_b[i]) (trainer/optim/update_math.h), and, when
  // params_low is not empty, params_low[i] = round(params[i]) in its dtype (the low-precision
  // copies for the next micro-batches, in the same pass). slot_a / slot_b may be empty when the
  // rule does not use them. The gradients are left as they are or zeroed.
  virtual absl::Status UpdateParameters(const UpdateRule& rule, Tensor params, Tensor grads,
                                        Tensor slot_a, Tensor slot_b, StepStateBuffer step_state,
                                        Tensor params_low) = 0;

  // A StepState in backend memory, initialised from `initial`.
  virtual absl::StatusOr<StepStateBuffer> AllocateStepState(const StepState& initial) = 0;
  // The state after all issued work (waits for it).
  virtual absl::StatusOr<StepState> ReadStepState(StepStateBuffer step_state) = 0;
  // Queues a copy of step_state (after all issued work) into host ring slot `slot`.
  virtual absl::Status SnapshotStats(StepStateBuffer step_state, int slot) = 0;
  // Waits for slot's copy and returns it.
  virtual absl::StatusOr<StepStats> ReadStats(int slot) = 0;
  static constexpr int kStatsSlots = 16;
  // Milliseconds on the backend's clock for work issued so far (waits for it).
  virtual absl::StatusOr<double> NowMs() = 0;

  // ---- One optimizer step recorded once and replayed (CUDA graphs) ----
  // A backend that can record the work issued for a step (kernels, copies and collectives, with
  // the buffers they use) and replay it with one launch. While recording nothing runs, and
  // UpdateParameters takes its learning rate from what each ReplayStep sets instead of
  // rule.lr. Recording must not wait for the device (nothing may need a resize then).
  virtual bool CanRecordSteps() const { return false; }
  virtual absl::Status BeginStepRecording() {
    return absl::UnimplementedError("this backend cannot record steps");
  }
  // Ends the recording (also after a failed one, which it reports); the step recorded replaces
  // any earlier one.
  virtual absl::Status EndStepRecording() {
    return absl::UnimplementedError("this backend cannot record steps");
  }
  // Runs the recorded step with learning rate `lr`. FAILED_PRECONDITION when there is none,
  // or a buffer it uses was reallocated since it was recorded (record it again).
  virtual absl::Status ReplayStep(double lr) {
    return absl::UnimplementedError("this backend cannot record steps");
  }

  // Its collective; Collective::Abort also ends the backend's own waits for collective work.
  virtual Collective* collective() = 0;
};

}  // namespace mptrain
