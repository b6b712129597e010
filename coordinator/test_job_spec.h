#pragma once

// For tests: the smallest job spec validation accepts (a 4 -> 2 linear model, one step).

#include "proto/mptrain.pb.h"

namespace mptrain {

inline v1::JobSpec SmallJobSpec(int world_size, v1::DeviceKind device = v1::CPU) {
  v1::JobSpec spec;
  // No name: names are unique among an owner's live jobs, and tests submit this one often.
  spec.set_world_size(world_size);
  spec.set_device(device);
  spec.mutable_model()->set_input_dim(4);
  spec.mutable_model()->set_output_dim(2);
  spec.mutable_data()->mutable_synthetic()->set_seed(0);
  spec.set_micro_batch_size(2);
  spec.set_accumulation_steps(1);
  spec.set_steps(1);
  spec.mutable_optimizer()->set_lr(0.1);
  return spec;
}

}  // namespace mptrain
