#pragma once

// Fused causal self-attention in fp16/bf16 through cuDNN 9's SDPA (flash-style: the T×T scores
// stay on chip), driven by the header-only cudnn-frontend (third_party/cudnn_frontend). The
// packed qkv [B·T, 3C] of the GPT is read in place through strides, as llm.c does: no permute.
// What the forward keeps for the backward is each row's log-sum-exp, [B·H·T] f32 (row
// (b·H + h)·T + t), instead of the probabilities.
//
// A graph is built once per shape and dtype (the slow part: about a second, NVRTC compiling the
// kernels) and cached. The cache outlives the backend: a backend gone parks its CudnnAttention
// (handle, graphs, workspace) for the next one on the same device in the process, so a warm
// rank process reused for the next job (worker --reuse_ranks) does not compile them again.
// Workspace grows only while building (or to rebuild one freed by a growth that failed).
//
// The plan: cuDNN's heuristic (mode A) lists several for a shape; the first MPTRAIN_CUDNN_PLANS
// of them that build (default kDefaultPlansToTime; 1: the heuristic's first, untimed) whose
// workspace stays within the first's or kMaxTimedPlanWorkspace (AttentionPlanCandidates) are
// timed on the shape's first call outside a stream capture, and the fastest is kept (cuBLASLt's
// candidates are chosen the same way, cuda_backend.h). A deterministic job keeps the
// heuristic's first plan, forward and backward: the same bits on every run.

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/backend_types.h"

namespace mptrain::cuda {

class CudnnAttention {
 public:
  // The one parked for `device` (its graphs already built) if there is one, else a new one.
  // UNAVAILABLE when cuDNN cannot be loaded or initialised (its message names why).
  static absl::StatusOr<std::unique_ptr<CudnnAttention>> Create(cudaStream_t stream, int device);
  // Keeps `attention` for the next Create on `device` (one per device; another is destroyed).
  // The caller's work on its stream must be done.
  static void Park(std::unique_ptr<CudnnAttention> attention, int device);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // dtype kF16 or kBF16. qkv [B·T, 3C], y [B·T, C], stats [B·H·T] f32; hs = C / H.
  // `deterministic`: the heuristic's first plan, untimed (the same one in every run).
  absl::Status Forward(const void* qkv, DType dtype, int64_t batch, int64_t seq_len, int64_t heads,
                       int64_t head_size, bool deterministic, void* y, float* stats);
  // dqkv [B·T, 3C] (dq, dk, dv side by side, as qkv); y and stats as Forward left them.
  // `deterministic`: cuDNN's deterministic algorithm (on Hopper its dP-in-workspace kernels:
  // dQ in a pass of its own, B·H·T² bf16 of workspace); otherwise its fused flash backward,
  // whose dQ is added with atomics (PyTorch's SDPA backward likewise): faster, and the same
  // gradients up to the order of fp32 additions.
  absl::Status Backward(const void* qkv, const void* y, const void* dy, const float* stats,
                        DType dtype, int64_t batch, int64_t seq_len, int64_t heads,
                        int64_t head_size, bool deterministic, void* dqkv);
  // Whether a workspace growth happened since the last call (the caller's recorded step that
  // used the old one must be recorded again).
  bool TakeWorkspaceChanged() {
    const bool changed = workspace_changed_;
    workspace_changed_ = false;
    return changed;
  }

 private:
  static constexpr int kDefaultPlansToTime = 8;
  static constexpr int kMaxPlansToTime = 16;
  static constexpr int kTimedRunsPerPlan = 3;
  static constexpr int64_t kMaxTimedPlanWorkspace = int64_t{64} << 20;
  struct Built;
  struct Graphs;
  // backward?, dtype, B, T, H, hs, deterministic
  using Key = std::tuple<bool, DType, int64_t, int64_t, int64_t, int64_t, bool>;

  explicit CudnnAttention(cudaStream_t stream);
  static int PlansToTime();
  absl::StatusOr<Built*> GraphFor(const Key& key);
  absl::Status GrowWorkspace(int64_t bytes);
  absl::Status TimePlans(Built& built, std::unordered_map<int64_t, void*>& pack);
  absl::Status Execute(const Key& key, const std::map<int64_t, void*>& pointers);

  cudaStream_t stream_;
  void* handle_ = nullptr;  // cudnnHandle_t
  std::unique_ptr<Graphs> graphs_;
  void* workspace_ = nullptr;
  int64_t workspace_bytes_ = 0;
  bool workspace_changed_ = false;
};

}  // namespace mptrain::cuda
