#pragma once

// Test doubles for the backend's outside world: a single-rank collective and a wrapper that
// counts collective calls. (trainer/in_memory_store.h serves in-process rendezvous.)

#include <cstring>
#include <memory>
#include <string>

#include "trainer/backend.h"
#include "trainer/in_memory_store.h"

namespace mptrain::testing {

// World size 1: the mean over one rank is the buffer itself.
class SingleRankCollective final : public Collective {
 public:
  absl::Status AllReduceMean(Tensor) override {
    if (aborted_) return absl::AbortedError("collective allreduce aborted: " + reason_);
    return absl::OkStatus();
  }
  absl::Status AllReduceSumCompressedAsync(Tensor buffer) override {
    return AllReduceMean(buffer);  // The sum over one rank, too.
  }
  absl::Status Broadcast(Tensor, int root) override {
    if (root != 0) return absl::InvalidArgumentError("broadcast root must be 0 in a world of 1");
    if (aborted_) return absl::AbortedError("collective broadcast aborted: " + reason_);
    return absl::OkStatus();
  }
  absl::Status AllGather(Tensor send, Tensor recv) override {
    if (aborted_) return absl::AbortedError("collective allgather aborted: " + reason_);
    if (send.numel() != recv.numel()) return absl::InvalidArgumentError("allgather: sizes");
    std::memmove(recv.data, send.data, send.numel() * sizeof(float));  // host memory (CPU)
    return absl::OkStatus();
  }
  absl::Status AllReduceSum(Tensor) override {
    if (aborted_) return absl::AbortedError("collective allreduce aborted: " + reason_);
    return absl::OkStatus();
  }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void Abort(const std::string& reason) override {
    if (!aborted_) reason_ = reason;
    aborted_ = true;
  }

 private:
  bool aborted_ = false;
  std::string reason_;
};

// Forwards to `inner` and counts the calls.
class CountingCollective final : public Collective {
 public:
  explicit CountingCollective(std::unique_ptr<Collective> inner) : inner_(std::move(inner)) {}
  absl::Status AllReduceMean(Tensor buffer) override {
    ++calls_;
    return inner_->AllReduceMean(buffer);
  }
  absl::Status AllReduceMeanAsync(Tensor buffer) override {
    ++calls_;
    return inner_->AllReduceMeanAsync(buffer);
  }
  absl::Status AllReduceSumCompressedAsync(Tensor buffer) override {
    ++calls_;
    return inner_->AllReduceSumCompressedAsync(buffer);
  }
  absl::Status JoinAllReduces() override { return inner_->JoinAllReduces(); }
  // Not counted in `calls` (the gradient allreduces of the steps): broadcasts, and the
  // normalization layers' collectives, which `norm_calls` counts.
  absl::Status Broadcast(Tensor buffer, int root) override {
    ++broadcasts_;
    return inner_->Broadcast(buffer, root);
  }
  absl::Status AllGather(Tensor send, Tensor recv) override {
    ++norm_calls_;
    return inner_->AllGather(send, recv);
  }
  absl::Status AllReduceSum(Tensor buffer) override {
    ++norm_calls_;
    return inner_->AllReduceSum(buffer);
  }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }
  int calls() const { return calls_; }
  int norm_calls() const { return norm_calls_; }
  int broadcasts() const { return broadcasts_; }

 private:
  std::unique_ptr<Collective> inner_;
  int calls_ = 0;
  int norm_calls_ = 0;
  int broadcasts_ = 0;
};

}  // namespace mptrain::testing
