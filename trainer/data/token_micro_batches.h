#pragma once

// A language model's micro-batches: TokenBatches (llm.c's DataLoader over token files) read on
// the host, the ids and targets uploaded as [B·T, 1] f32 (exact: ids < 2^20 < 2^24), which is
// what GptModel::Forward and the cross-entropy take. Not staged for recorded steps (read on the
// host each micro-batch).

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
  absl::Status Stage(int64_t) override {
    return absl::UnimplementedError("token micro-batches are not staged");
  }
  void DropStaged() override {}
  int64_t StagingBytes(int64_t) const override { return INT64_MAX; }
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
};

}  // namespace mptrain
