#pragma once

// Which of cuDNN's heuristic plans for an attention shape are timed (cudnn_attention.cc): the
// first `limit` that build, in the heuristic's order, whose workspace stays within the first's
// or `workspace_floor`, whichever is larger. The memory a step plans for must not grow by an
// unbounded amount for a few percent of attention time: on Hopper the backward's second plan
// wants twice the first's workspace (193.5 against 97.5 MiB at B=32 T=1024 H=12 hs=64) and
// runs 1.6x slower. No CUDA here: tested on any machine.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mptrain::cuda {

class AttentionPlanCandidates {
 public:
  AttentionPlanCandidates(int limit, int64_t workspace_floor)
      : limit_(std::max(limit, 1)), workspace_floor_(std::max<int64_t>(workspace_floor, 0)) {}

  // A plan that built, offered in the heuristic's order; kept if there is room and its
  // workspace is within the bound (set by the first plan offered).
  void Offer(int64_t plan, int64_t workspace_bytes) {
    if (Full() || workspace_bytes < 0) return;
    if (bound_ < 0) bound_ = std::max(workspace_bytes, workspace_floor_);
    if (workspace_bytes > bound_) return;
    plans_.push_back(plan);
    workspace_bytes_ = std::max(workspace_bytes_, workspace_bytes);
  }
  bool Full() const { return static_cast<int>(plans_.size()) >= limit_; }
  // Kept plans, the heuristic's first that built first.
  const std::vector<int64_t>& plans() const { return plans_; }
  // The workspace that runs every kept plan.
  int64_t workspace_bytes() const { return workspace_bytes_; }

 private:
  int limit_;
  int64_t workspace_floor_;
  int64_t bound_ = -1;
  std::vector<int64_t> plans_;
  int64_t workspace_bytes_ = 0;
};

}  // namespace mptrain::cuda
