#pragma once

// The rank's training data in backend memory and the cursor that walks it in micro-batches:
// either its contiguous shard in order, wrapping around (the fixed synthetic batch is used in
// place), or, with shuffling, the stream of DistributedSampler indices over all rows, epoch after
// epoch (sampler.h). The position is a function of the optimizer step, so that a resumed run
// continues where the checkpoint was.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/data/batch_source.h"
#include "trainer/rank_data.h"

namespace mptrain {

struct Shuffling {
  bool enabled = false;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
};

class MicroBatches final : public BatchSource {
 public:
  // `data`: the rank's shard, or all rows when shuffling.
  static absl::StatusOr<MicroBatches> Create(Backend* backend, const RankData& data,
                                             int64_t batch, const Shuffling& shuffling = {});

  // The next micro-batch, [batch, input_dim] and [batch, target columns] f32.
  absl::Status Next(Tensor* x, Tensor* y) override;

  // Every micro-batch is the same unmodified tensor.
  bool in_place() const override { return !shuffling_.enabled && features_.rows == batch_; }

  // Copies (or gathers) the next `count` micro-batches now, each into a buffer of its own; the
  // next `count` calls of Next() return those buffers and issue no work. A step recorded as a
  // CUDA graph reads its micro-batches from them: the same tensors every step, their contents
  // staged before each replay (train_loop.cc), which reads them without calling Next(): the
  // batches of an earlier Stage() are replaced. In-place data needs none: does nothing.
  absl::Status Stage(int64_t count) override;
  // The staged micro-batches were read without Next() (by a replayed step): forgets them.
  void DropStaged() override { staged_ = served_ = 0; }
  // The memory Stage(count) holds, in bytes (0 for in-place data).
  int64_t StagingBytes(int64_t count) const override;

  // Shard order: the next row; shuffled: the offset in the current epoch.
  int64_t cursor() const override;
  // Where the stream is after `steps_done` optimizer steps of `accumulation` micro-batches.
  void SeekToStep(int64_t steps_done, int64_t accumulation);
  absl::Status SeekTo(int64_t steps_done, int64_t accumulation) override {
    SeekToStep(steps_done, accumulation);
    return absl::OkStatus();
  }

 private:
  absl::Status IndicesOfEpoch(int64_t epoch, Tensor* indices);
  // The next micro-batch's rows into x and y ([batch, ...] f32); advances the cursor.
  absl::Status Fill(Tensor x, Tensor y);

  Backend* backend_ = nullptr;
  Tensor features_, targets_, x_, y_;
  int64_t batch_ = 0;
  int64_t cursor_ = 0;
  Shuffling shuffling_;
  // Shuffled: rows per epoch of this rank, the epoch of the cursor, and the index lists of two
  // epochs (a micro-batch may span the end of one), uploaded once per epoch.
  int64_t epoch_rows_ = 0;
  int64_t epoch_ = 0;
  Tensor epoch_indices_[2];
  int64_t indices_epoch_[2] = {-1, -1};
  // Stage(): the staged micro-batches' buffers (grown once), how many hold staged batches and
  // how many of those Next() has returned.
  std::vector<Tensor> staged_x_, staged_y_;
  int64_t staged_ = 0;
  int64_t served_ = 0;
};

}  // namespace mptrain
