// CudaBackend's optimizer step (GradScaler's unscale/check, the scaler update, the parameter
// update), the recorded-step (CUDA graph) machinery and the step's device-side state.

#include <cstring>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/step_kernels.h"
#include "backends/cuda/nccl_collective.h"

namespace mptrain::cuda {

absl::Status CudaBackend::GradientStatistics(Tensor grads, StepStateBuffer step_state) {
  CUDA_RETURN_IF_ERROR(mptrain::cuda::GradientStatistics(static_cast<const float*>(grads.data),
                                                         grads.numel(), step_state.data,
                                                         partials_, inf_flags_, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::FinalizeStep(const StepConfig& config, Tensor metrics,
                                       StepStateBuffer step_state) {
  if (metrics.numel() != 2) return absl::InvalidArgumentError("FinalizeStep: needs 2 metrics");
  CUDA_RETURN_IF_ERROR(mptrain::cuda::FinalizeStep(
      config, static_cast<const float*>(metrics.data), step_state.data, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::UpdateParameters(const UpdateRule& rule, Tensor params, Tensor grads,
                                           Tensor slot_a, Tensor slot_b,
                                           StepStateBuffer step_state, Tensor params_low) {
  const int64_t n = params.numel();
  auto fits = [n](Tensor t) { return t.empty() || t.numel() == n; };
  if (grads.numel() != n || !fits(slot_a) || !fits(slot_b) || !fits(params_low)) {
    return absl::InvalidArgumentError("UpdateParameters: buffer sizes do not match");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::UpdateParameters(
      rule, static_cast<float*>(params.data), static_cast<const float*>(grads.data),
      static_cast<float*>(slot_a.data), static_cast<float*>(slot_b.data), n, step_state.data,
      params_low.data, params_low.dtype, recording_ ? lr_device_ : nullptr, stream_));
  return absl::OkStatus();
}

bool CudaBackend::ReplayPending() {
  if (replay_done_ == nullptr || collective_ == nullptr || collective_->world_size() < 2) {
    return false;
  }
  const cudaError_t state = cudaEventQuery(replay_done_);
  if (state != cudaErrorNotReady) cudaGetLastError();
  return state == cudaErrorNotReady;
}

void CudaBackend::EndRecordingInProgress() {
  if (!recording_) return;
  cudaGraph_t abandoned = nullptr;
  if (cudaStreamEndCapture(stream_, &abandoned) == cudaSuccess && abandoned != nullptr) {
    cudaGraphDestroy(abandoned);
  }
  cudaGetLastError();  // An unjoined capture ends with an error: it is abandoned either way.
  recording_ = false;
}

void CudaBackend::DropRecordedStep() {
  EndRecordingInProgress();
  // Seen to wait for a replay still running (NcclCollective::SetAbortHooks): during an abort,
  // its NCCL kernels end once the abort flag is set.
  if (step_graph_ != nullptr) cudaGraphExecDestroy(step_graph_);
  step_graph_ = nullptr;
}

absl::Status CudaBackend::BeginStepRecording() {
  if (recording_) return absl::FailedPreconditionError("a step is being recorded already");
  if (lr_device_ == nullptr) CUDA_RETURN_IF_ERROR(cudaMalloc(&lr_device_, sizeof(double)));
  if (lr_ring_ == nullptr) {
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&lr_ring_, kStatsSlots * sizeof(double)));
  }
  for (cudaEvent_t& event : lr_copied_) {
    if (event == nullptr) {
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    }
  }
  if (replay_done_ == nullptr) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&replay_done_, cudaEventDisableTiming));
  }
  // The new recording replaces the old one whatever happens: a failed recording leaves none.
  // Destroying a graph waits for its launches: the last replay is waited for first, here, where
  // a dead peer or a stop is noticed.
  if (step_graph_ != nullptr) {
    if (absl::Status waited = WaitFor(replay_done_, "the last replayed step"); !waited.ok()) {
      return waited;
    }
  }
  DropRecordedStep();
  // Thread-local: only this thread's calls are checked against the capture (NCCL's and the
  // rank's other threads go on).
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  recording_ = true;
  recorded_generation_ = buffer_generation_;
  return absl::OkStatus();
}

absl::Status CudaBackend::EndStepRecording() {
  if (!recording_) return absl::FailedPreconditionError("no step is being recorded");
  recording_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (ended != cudaSuccess || graph == nullptr) {
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    return CudaStatus(ended != cudaSuccess ? ended : cudaErrorStreamCaptureInvalidated,
                      "cudaStreamEndCapture (recording a step)", __FILE__, __LINE__);
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_RETURN_IF_ERROR(instantiated);
  if (step_graph_ != nullptr) cudaGraphExecDestroy(step_graph_);
  step_graph_ = exec;
  return absl::OkStatus();
}

absl::Status CudaBackend::ReplayStep(double lr) {
  if (step_graph_ == nullptr) return absl::FailedPreconditionError("no step recorded");
  if (recorded_generation_ != buffer_generation_) {
    if (absl::Status waited = WaitFor(replay_done_, "the last replayed step"); !waited.ok()) {
      return waited;
    }
    DropRecordedStep();
    return absl::FailedPreconditionError("a buffer the recorded step uses was reallocated");
  }
  lr_slot_ = (lr_slot_ + 1) % kStatsSlots;
  if (absl::Status status = WaitFor(lr_copied_[lr_slot_], "a learning rate copy");
      !status.ok()) {
    return status;
  }
  lr_ring_[lr_slot_] = lr;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(lr_device_, &lr_ring_[lr_slot_], sizeof(double),
                                       cudaMemcpyHostToDevice, stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(lr_copied_[lr_slot_], stream_));
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(step_graph_, stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(replay_done_, stream_));
  return absl::OkStatus();
}

absl::StatusOr<StepStateBuffer> CudaBackend::AllocateStepState(const StepState& initial) {
  void* memory = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&memory, sizeof(StepState)));
  allocations_.push_back(memory);
  StepStateBuffer buffer{static_cast<StepState*>(memory)};
  std::memcpy(readback_, &initial, sizeof(StepState));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffer.data, readback_, sizeof(StepState),
                                       cudaMemcpyHostToDevice, stream_));
  if (absl::Status status = WaitForStream("step state upload"); !status.ok()) return status;
  return buffer;
}

absl::StatusOr<StepState> CudaBackend::ReadStepState(StepStateBuffer step_state) {
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(readback_, step_state.data, sizeof(StepState),
                                       cudaMemcpyDeviceToHost, stream_));
  if (absl::Status status = WaitForStream("step state download"); !status.ok()) return status;
  return *readback_;
}

absl::Status CudaBackend::SnapshotStats(StepStateBuffer step_state, int slot) {
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&stats_ring_[slot], step_state.data, sizeof(StepState),
                                       cudaMemcpyDeviceToHost, stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(stats_events_[slot], stream_));
  return absl::OkStatus();
}

absl::StatusOr<StepStats> CudaBackend::ReadStats(int slot) {
  if (absl::Status status = WaitFor(stats_events_[slot], "the optimizer step"); !status.ok()) {
    return status;
  }
  StepStats stats;
  stats.state = stats_ring_[slot];
  float elapsed = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&elapsed, base_event_, stats_events_[slot]));
  stats.completed_ms = elapsed;
  return stats;
}

absl::StatusOr<double> CudaBackend::NowMs() {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(now_event_, stream_));
  if (absl::Status status = WaitFor(now_event_, "the device clock"); !status.ok()) return status;
  float elapsed = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&elapsed, base_event_, now_event_));
  return static_cast<double>(elapsed);
}

}  // namespace mptrain::cuda
