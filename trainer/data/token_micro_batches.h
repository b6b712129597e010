#pragma once

// A language model's micro-batches: TokenBatches (llm.c's DataLoader over token files) read on
// the host, the ids and targets uploaded as [B·T, 1] f32 (exact: ids < 2^20 < 2^24), which is
// what GptModel::Forward and the cross-entropy take. For a recorded step (train_loop.cc) the
// step's micro-batches are read and uploaded before it into buffers of their own (Stage), which
// the recording and its replays read.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/data/batch_source.h"
#include "trainer/data/token_shards.h"

namespace mptrain {

class TokenMicroBatches final : public BatchSource {
 public:
  static absl::StatusOr<TokenMicroBatches> Create(Backend* backend, TokenBatches batches);

  absl::Status Next(Tensor* x, Tensor* y) override;
  bool in_place() const override { return false; }
  absl::Status Stage(int64_t count) override;
  void DropStaged() override { staged_ = served_ = 0; }
  int64_t StagingBytes(int64_t count) const override {
    return count * 2 * static_cast<int64_t>(inputs_.size()) * static_cast<int64_t>(sizeof(float));
  }
  // Micro-batches served since the start.
  int64_t cursor() const override { return batches_.micro_batches_done(); }
  absl::Status SeekTo(int64_t steps_done, int64_t accumulation) override;
  // Back to the first micro-batch (evaluation: every one reads the same batches).
  absl::Status Rewind() { return batches_.Seek(0); }

 private:
  TokenMicroBatches(Backend* backend, TokenBatches batches)
      : backend_(backend), batches_(std::move(batches)) {}

  Backend* backend_;
  TokenBatches batches_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<float> staging_;
  Tensor x_, y_;
  // Stage()'s buffers, one (ids, targets) pair per micro-batch; Next() serves staged_x_[served_]
  // while served_ < staged_.
  std::vector<Tensor> staged_x_, staged_y_;
  int64_t staged_ = 0, served_ = 0;
  absl::Status Fill(Tensor x, Tensor y);
};

}  // namespace mptrain
