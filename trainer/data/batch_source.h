#pragma once

// What the training loop takes its micro-batches from (train_loop.cc): the MLP's arrays in
// backend memory (micro_batches.h) or a language model's token files (token_micro_batches.h).
// The position is a function of the optimizer step, so that a resumed run continues where its
// checkpoint was.

#include <cstdint>

#include "absl/status/status.h"
#include "trainer/backend.h"

namespace mptrain {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next micro-batch: inputs x and targets y, f32 in backend memory.
  virtual absl::Status Next(Tensor* x, Tensor* y) = 0;
  // Every micro-batch is the same unmodified tensor.
  virtual bool in_place() const = 0;
  // Copies the next `count` micro-batches into buffers of their own now, for a recorded step
  // (MicroBatches::Stage); DropStaged forgets them after a replay read them.
  virtual absl::Status Stage(int64_t count) = 0;
  virtual void DropStaged() = 0;
  // The memory Stage(count) holds, in bytes; INT64_MAX when the source cannot stage.
  virtual int64_t StagingBytes(int64_t count) const = 0;
  // The position for a checkpoint's data_cursor.
  virtual int64_t cursor() const = 0;
  // Where the stream is after `steps_done` optimizer steps of `accumulation` micro-batches.
  virtual absl::Status SeekTo(int64_t steps_done, int64_t accumulation) = 0;
};

}  // namespace mptrain
