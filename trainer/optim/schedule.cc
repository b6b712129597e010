#include "trainer/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace mptrain {

double LrSchedule::At(int64_t step) {
  const int64_t t = step - 1;
  switch (config_.type) {
    case ScheduleType::kConstant:
      return base_lr_;
    case ScheduleType::kWarmupCosine:
    case ScheduleType::kWarmupLinear: {
      const int64_t warmup = config_.warmup_steps;
      double factor;
      if (t < warmup) {
        factor = static_cast<double>(t) / static_cast<double>(warmup);
      } else {
        const double progress = static_cast<double>(t - warmup) /
                                static_cast<double>(std::max<int64_t>(1, total_steps_ - warmup));
        const double ratio = config_.min_lr / base_lr_;
        const double shape = config_.type == ScheduleType::kWarmupCosine
                                 ? 0.5 * (1.0 + std::cos(M_PI * progress))
                                 : 1.0 - progress;
        factor = ratio + (1.0 - ratio) * shape;
      }
      return base_lr_ * factor;
    }
    case ScheduleType::kStep: {
      const int64_t decays = t / config_.step_size;
      if (!started_ || decays < decays_) {
        started_ = true;
        decays_ = 0;
        decayed_lr_ = base_lr_;
      }
      for (; decays_ < decays; ++decays_) decayed_lr_ = decayed_lr_ * config_.gamma;
      return decayed_lr_;
    }
  }
  return base_lr_;
}

}  // namespace mptrain
