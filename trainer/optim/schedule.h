#pragma once

// Learning-rate schedules with the step indexing of a PyTorch scheduler created before training
// and stepped once after every attempted optimizer step (skipped on overflow or not): optimizer
// step s (1-based) uses the scheduler's value at t = s - 1. In double, operation for operation as
// the reference (parity/pytorch_reference.py) computes them, so the rates are equal, not close.
//
//   constant:       lr
//   warmup_cosine:  lr · f(t), f(t) = t / W for t < W (LambdaLR, as the usual warm-up), then
//                   r + (1 − r) · (0.5 · (1 + cos(π · p))), p = (t − W) / max(1, T − W),
//                   r = min_lr / lr, T = the job's steps
//   warmup_linear:  the same with r + (1 − r) · (1 − p)
//   step:           torch.optim.lr_scheduler.StepLR: multiplied by gamma every step_size steps
//                   (one multiplication after the other, as its chainable form does)

#include <cstdint>

#include "trainer/training_config.h"

namespace mptrain {

class LrSchedule {
 public:
  LrSchedule(const ScheduleConfig& config, double base_lr, int64_t total_steps)
      : config_(config), base_lr_(base_lr), total_steps_(total_steps) {}

  // The learning rate of optimizer step `step` (1-based). Steps may come in any order; in
  // increasing order each costs O(1).
  double At(int64_t step);

 private:
  ScheduleConfig config_;
  double base_lr_;
  int64_t total_steps_;
  // StepLR: the rate after `decays_` multiplications.
  int64_t decays_ = 0;
  double decayed_lr_ = 0;
  bool started_ = false;
};

}  // namespace mptrain
