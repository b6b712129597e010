#pragma once

// A backend that records steps the way a CUDA graph does, over any other backend (the CPU's in
// CI): while recording, every operation is stored instead of run, with the arguments it was
// given (so a replay does what was recorded, not what the host would issue now); a replay runs
// them in order, with UpdateParameters taking the replay's learning rate. What it checks is the
// trainer's side of record_steps (train_loop.cc): which steps are recorded, which host state a
// replay must not depend on, when a recording must be made again. Collectives are not
// recorded: use it with a world of one (their operations are no-ops there). Unlike a graph, it
// looks the inner backend's own buffers up again at each replay, so it never asks for a new
// recording after a reallocation (CudaBackend's buffer_generation_ is the GPU test's concern).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "trainer/backend.h"

namespace mptrain::testing {

class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(Backend* inner) : inner_(inner) {}

  int recordings() const { return recordings_; }
  int replays() const { return replays_; }

  std::string Name() const override { return "recording " + inner_->Name(); }
  void SetDeterministic(bool deterministic) override { inner_->SetDeterministic(deterministic); }
  // What a CUDA graph cannot hold (allocations, transfers the host waits for, reads of the
  // device's state) is refused while recording, as a capture would fail.
  absl::StatusOr<Tensor> Allocate(DType dtype, int64_t rows, int64_t cols) override {
    RETURN_IF_ERROR(RefuseWhileRecording("Allocate"));
    return inner_->Allocate(dtype, rows, cols);
  }
  absl::Status Upload(const float* host, Tensor dst) override {
    RETURN_IF_ERROR(RefuseWhileRecording("Upload"));
    return inner_->Upload(host, dst);
  }
  absl::Status Download(Tensor src, float* host) override {
    RETURN_IF_ERROR(RefuseWhileRecording("Download"));
    return inner_->Download(src, host);
  }
  absl::Status Zero(Tensor t) override { return Do([=, this] { return inner_->Zero(t); }); }
  absl::Status Cast(Tensor src, Tensor dst) override {
    return Do([=, this] { return inner_->Cast(src, dst); });
  }
  absl::Status CopyRowsWrapping(Tensor src, int64_t first, Tensor dst) override {
    return Do([=, this] { return inner_->CopyRowsWrapping(src, first, dst); });
  }
  absl::Status GatherRows(Tensor src, Tensor indices, Tensor dst) override {
    return Do([=, this] { return inner_->GatherRows(src, indices, dst); });
  }
  absl::Status LinearForward(Tensor x, Tensor w, Tensor b, ActivationKind act, Tensor pre,
                             Tensor y) override {
    return Do([=, this] { return inner_->LinearForward(x, w, b, act, pre, y); });
  }
  absl::Status ActivationBackward(ActivationKind act, Tensor pre, Tensor dy,
                                  Tensor d_pre) override {
    return Do([=, this] { return inner_->ActivationBackward(act, pre, dy, d_pre); });
  }
  absl::Status LinearBackward(Tensor x, Tensor w, Tensor dy, Tensor dx, Tensor dw_acc,
                              Tensor db_acc, bool overwrite_grads) override {
    return Do([=, this] {
      return inner_->LinearBackward(x, w, dy, dx, dw_acc, db_acc, overwrite_grads);
    });
  }
  absl::Status LinearBackwardThroughActivation(Tensor x, Tensor w, Tensor dy, ActivationKind act,
                                               Tensor pre, Tensor d_act, Tensor d_pre,
                                               Tensor dw_acc, Tensor db_acc,
                                               bool overwrite_grads) override {
    return Do([=, this] {
      return inner_->LinearBackwardThroughActivation(x, w, dy, act, pre, d_act, d_pre, dw_acc,
                                                     db_acc, overwrite_grads);
    });
  }
  absl::Status BiasGradient(Tensor dy, Tensor db_acc, bool overwrite_grads) override {
    return Do([=, this] { return inner_->BiasGradient(dy, db_acc, overwrite_grads); });
  }
  absl::Status SumRowsToF32(Tensor rows, Tensor out) override {
    return Do([=, this] { return inner_->SumRowsToF32(rows, out); });
  }
  absl::Status ScaledDifference(Tensor a, Tensor b, float coef, StepStateBuffer step_state,
                                float seed_divisor, Tensor out) override {
    return Do([=, this] {
      return inner_->ScaledDifference(a, b, coef, step_state, seed_divisor, out);
    });
  }
  absl::Status SumSquaredDifference(Tensor a, Tensor b, double divide_by, float then_divide,
                                    Tensor acc) override {
    return Do([=, this] { return inner_->SumSquaredDifference(a, b, divide_by, then_divide, acc); });
  }
  absl::Status SumProduct(Tensor a, Tensor b, double divide_by, float then_divide,
                          Tensor acc) override {
    return Do([=, this] { return inner_->SumProduct(a, b, divide_by, then_divide, acc); });
  }
  absl::Status LogSoftmaxRows(Tensor x, Tensor out) override {
    return Do([=, this] { return inner_->LogSoftmaxRows(x, out); });
  }
  absl::Status Exp(Tensor x, Tensor out) override {
    return Do([=, this] { return inner_->Exp(x, out); });
  }
  absl::Status SmoothedOneHot(Tensor ids, float on, float off, Tensor out) override {
    return Do([=, this] { return inner_->SmoothedOneHot(ids, on, off, out); });
  }
  absl::Status CountArgmaxMatches(Tensor x, Tensor ids, Tensor acc) override {
    return Do([=, this] { return inner_->CountArgmaxMatches(x, ids, acc); });
  }
  absl::Status CompressGradients(Tensor src, float divisor, Tensor dst) override {
    return Do([=, this] { return inner_->CompressGradients(src, divisor, dst); });
  }
  absl::Status ActivationForward(ActivationKind act, Tensor x, Tensor y) override {
    return Do([=, this] { return inner_->ActivationForward(act, x, y); });
  }
  // The language model's operations (GptModel).
  absl::Status Add(Tensor a, Tensor b, Tensor out) override {
    return Do([=, this] { return inner_->Add(a, b, out); });
  }
  absl::Status EmbeddingForward(Tensor ids, Tensor wte, Tensor wpe, int64_t seq_len,
                                Tensor out) override {
    return Do([=, this] { return inner_->EmbeddingForward(ids, wte, wpe, seq_len, out); });
  }
  absl::Status EmbeddingBackward(Tensor ids, Tensor dout, int64_t seq_len, Tensor dwte_acc,
                                 Tensor dwpe_acc, bool overwrite_wte, bool overwrite_wpe) override {
    return Do([=, this] {
      return inner_->EmbeddingBackward(ids, dout, seq_len, dwte_acc, dwpe_acc, overwrite_wte,
                                       overwrite_wpe);
    });
  }
  bool CanRecordAttention(DType dtype) const override {
    return inner_->CanRecordAttention(dtype);
  }
  std::pair<int64_t, int64_t> AttentionSavedShape(DType dtype, int64_t batch, int64_t heads,
                                                  int64_t seq_len) const override {
    return inner_->AttentionSavedShape(dtype, batch, heads, seq_len);
  }
  absl::Status CausalAttentionForward(Tensor qkv, int64_t batch, int64_t heads, Tensor saved,
                                      Tensor y) override {
    return Do([=, this] { return inner_->CausalAttentionForward(qkv, batch, heads, saved, y); });
  }
  absl::Status CausalAttentionBackward(Tensor qkv, Tensor saved, Tensor y, Tensor dy,
                                       int64_t batch, int64_t heads, Tensor dqkv) override {
    return Do([=, this] {
      return inner_->CausalAttentionBackward(qkv, saved, y, dy, batch, heads, dqkv);
    });
  }
  bool HasFusedSoftmaxCrossEntropy() const override {
    return inner_->HasFusedSoftmaxCrossEntropy();
  }
  absl::Status SoftmaxCrossEntropy(Tensor x, Tensor ids, float on, float off, double divide_by,
                                   float then_divide, Tensor metrics, float coef,
                                   StepStateBuffer step_state, float seed_divisor,
                                   Tensor d_logits) override {
    return Do([=, this] {
      return inner_->SoftmaxCrossEntropy(x, ids, on, off, divide_by, then_divide, metrics, coef,
                                         step_state, seed_divisor, d_logits);
    });
  }
  absl::Status BatchNormStatistics(Tensor x, float eps, Tensor stats) override {
    return Do([=, this] { return inner_->BatchNormStatistics(x, eps, stats); });
  }
  absl::Status BatchNormCombineStatistics(Tensor gathered, float eps, float momentum,
                                          Tensor running, Tensor mean_invstd) override {
    return Do([=, this] {
      return inner_->BatchNormCombineStatistics(gathered, eps, momentum, running, mean_invstd);
    });
  }
  absl::Status BatchNormRunningStatistics(Tensor running, float eps,
                                          Tensor mean_invstd) override {
    return Do([=, this] { return inner_->BatchNormRunningStatistics(running, eps, mean_invstd); });
  }
  absl::Status BatchNormApply(Tensor x, Tensor mean_invstd, Tensor weight, Tensor bias,
                              Tensor y) override {
    return Do([=, this] { return inner_->BatchNormApply(x, mean_invstd, weight, bias, y); });
  }
  absl::Status BatchNormBackwardReduce(Tensor dy, Tensor x, Tensor mean_invstd, Tensor sums,
                                       Tensor dweight_acc, Tensor dbias_acc,
                                       bool overwrite_grads) override {
    return Do([=, this] {
      return inner_->BatchNormBackwardReduce(dy, x, mean_invstd, sums, dweight_acc, dbias_acc,
                                             overwrite_grads);
    });
  }
  absl::Status BatchNormBackwardInput(Tensor dy, Tensor x, Tensor mean_invstd, Tensor weight,
                                      Tensor sums, double count, Tensor dx) override {
    return Do([=, this] {
      return inner_->BatchNormBackwardInput(dy, x, mean_invstd, weight, sums, count, dx);
    });
  }
  absl::Status LayerNormForward(Tensor x, Tensor weight, Tensor bias, float eps, Tensor row_stats,
                                Tensor y) override {
    return Do([=, this] { return inner_->LayerNormForward(x, weight, bias, eps, row_stats, y); });
  }
  absl::Status LayerNormBackward(Tensor dy, Tensor x, Tensor row_stats, Tensor weight, Tensor dx,
                                 Tensor dweight_acc, Tensor dbias_acc,
                                 bool overwrite_grads) override {
    return Do([=, this] {
      return inner_->LayerNormBackward(dy, x, row_stats, weight, dx, dweight_acc, dbias_acc,
                                       overwrite_grads);
    });
  }
  absl::Status GradientStatistics(Tensor grads, StepStateBuffer step_state) override {
    return Do([=, this] { return inner_->GradientStatistics(grads, step_state); });
  }
  absl::Status FinalizeStep(const StepConfig& config, Tensor metrics,
                            StepStateBuffer step_state) override {
    return Do([=, this] { return inner_->FinalizeStep(config, metrics, step_state); });
  }
  absl::Status UpdateParameters(const UpdateRule& rule, Tensor params, Tensor grads,
                                Tensor slot_a, Tensor slot_b, StepStateBuffer step_state,
                                Tensor params_low) override {
    const bool recorded = recording_;
    return Do([=, this] {
      UpdateRule applied = rule;
      if (recorded) applied.lr = replay_lr_;  // As the CUDA graph reads it on the device.
      return inner_->UpdateParameters(applied, params, grads, slot_a, slot_b, step_state,
                                      params_low);
    });
  }
  absl::StatusOr<StepStateBuffer> AllocateStepState(const StepState& initial) override {
    RETURN_IF_ERROR(RefuseWhileRecording("AllocateStepState"));
    return inner_->AllocateStepState(initial);
  }
  absl::StatusOr<StepState> ReadStepState(StepStateBuffer step_state) override {
    RETURN_IF_ERROR(RefuseWhileRecording("ReadStepState"));
    return inner_->ReadStepState(step_state);
  }
  absl::Status SnapshotStats(StepStateBuffer step_state, int slot) override {
    return Do([=, this] { return inner_->SnapshotStats(step_state, slot); });
  }
  absl::StatusOr<StepStats> ReadStats(int slot) override {
    RETURN_IF_ERROR(RefuseWhileRecording("ReadStats"));
    return inner_->ReadStats(slot);
  }
  absl::StatusOr<double> NowMs() override {
    RETURN_IF_ERROR(RefuseWhileRecording("NowMs"));
    return inner_->NowMs();
  }
  Collective* collective() override { return inner_->collective(); }

  bool CanRecordSteps() const override { return true; }
  absl::Status BeginStepRecording() override {
    if (recording_) return absl::FailedPreconditionError("already recording");
    recording_ = true;
    pending_.clear();
    return absl::OkStatus();
  }
  absl::Status EndStepRecording() override {
    if (!recording_) return absl::FailedPreconditionError("not recording");
    recording_ = false;
    recorded_ = std::move(pending_);
    ++recordings_;
    return absl::OkStatus();
  }
  absl::Status ReplayStep(double lr) override {
    if (recorded_.empty()) return absl::FailedPreconditionError("no step recorded");
    replay_lr_ = lr;
    ++replays_;
    for (const auto& op : recorded_) {
      if (absl::Status status = op(); !status.ok()) return status;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status RefuseWhileRecording(const char* what) const {
    if (!recording_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        std::string(what) + " while a step is recorded (a CUDA graph capture would fail)");
  }
  absl::Status Do(std::function<absl::Status()> op) {
    if (!recording_) return op();
    pending_.push_back(std::move(op));
    return absl::OkStatus();
  }

  Backend* inner_;
  bool recording_ = false;
  double replay_lr_ = 0;
  std::vector<std::function<absl::Status()>> pending_, recorded_;
  int recordings_ = 0, replays_ = 0;
};

}  // namespace mptrain::testing
