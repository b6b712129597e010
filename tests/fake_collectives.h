#pragma once

// Test doubles for the backend's outside world: a single-rank collective and a wrapper that
// counts collective calls. (trainer/in_memory_store.h serves in-process rendezvous.)

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
  // Not counted: `calls` is about the allreduces of the steps.
  absl::Status Broadcast(Tensor buffer, int root) override {
    return inner_->Broadcast(buffer, root);
  }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }
  int calls() const { return calls_; }

 private:
  std::unique_ptr<Collective> inner_;
  int calls_ = 0;
};

}  // namespace mptrain::testing
