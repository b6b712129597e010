#pragma once

// The cuDNN SDPA graph of one causal-attention shape (forward or backward), described and
// lowered to cuDNN's operation graph, with no execution plan chosen yet: what CudnnAttention
// caches per shape, and what bench/attention_plans times every plan of. Includes the
// header-only cudnn-frontend (about half a minute to compile): only the files that drive cuDNN
// include this.

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/backend_types.h"

namespace mptrain::cuda {

// The tensors of both graphs, by uid (the variant pack's keys).
enum AttentionUid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

struct AttentionShape {
  bool backward = false;
  DType dtype = DType::kBF16;  // kF16 or kBF16
  int64_t batch = 0;
  int64_t seq_len = 0;
  int64_t heads = 0;
  int64_t head_size = 0;
  // The backward: cuDNN's deterministic algorithm; both: the heuristic's first plan, untimed.
  bool deterministic = false;

  auto Tie() const {
    return std::tie(backward, dtype, batch, seq_len, heads, head_size, deterministic);
  }
  bool operator<(const AttentionShape& other) const { return Tie() < other.Tie(); }
  // "backward B=32 T=1024 H=12 hs=64" (errors and logs).
  std::string Name() const;
};

absl::Status FrontendStatus(cudnn_frontend::error_object error, const std::string& what);

// Q, K, V read in place from the packed qkv [B·T, 3C] (strides, no permute); O and dO
// [B·T, C]; dQ, dK, dV written side by side into dqkv [B·T, 3C]; stats [B·H·T] f32 (each row's
// log-sum-exp). Validated and lowered (build_operation_graph): the caller creates, builds and
// picks its execution plans.
absl::StatusOr<std::shared_ptr<cudnn_frontend::graph::Graph>> DescribeAttention(
    const AttentionShape& shape, cudnnHandle_t handle);

// Matmul FLOPs of one call at this shape with the causal mask's half of the scores (forward 2,
// backward 5 T×T×hs products per head, halved): for TFLOP/s figures.
double AttentionFlops(const AttentionShape& shape);

}  // namespace mptrain::cuda
