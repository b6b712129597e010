#pragma once

// The benchmark's job configurations (BENCHMARKS.md): the original example and two MLPs, all
// fp16 autocast + GradScaler, SGD lr 0.01, MSE, ReLU, accumulation 4, one fixed synthetic batch
// per rank. bench/pytorch_baseline.py defines the same three.

#include <string>
#include <vector>

#include "proto/mptrain.pb.h"

namespace mptrain::bench {

struct BenchConfig {
  std::string name;
  std::vector<int64_t> widths;  // input, hidden..., output
  int64_t micro_batch = 0;
};

inline std::vector<BenchConfig> BenchConfigs() {
  return {
      {"seed", {1024, 16}, 64},
      {"mlp1k", {1024, 1024, 1024, 1024, 1024}, 512},
      {"mlp8k", {8192, 8192, 8192, 8192, 8192}, 4096},
  };
}

inline v1::JobSpec BenchSpec(const BenchConfig& config, int world_size, int64_t steps) {
  v1::JobSpec spec;
  spec.set_name(config.name);
  spec.set_world_size(world_size);
  spec.set_device(v1::CUDA);
  spec.mutable_model()->set_input_dim(config.widths.front());
  for (size_t i = 1; i + 1 < config.widths.size(); ++i) {
    spec.mutable_model()->add_hidden_dims(config.widths[i]);
  }
  spec.mutable_model()->set_output_dim(config.widths.back());
  spec.mutable_model()->set_activation(v1::RELU);
  spec.mutable_data()->mutable_synthetic()->set_seed(0);
  spec.set_micro_batch_size(config.micro_batch);
  spec.set_accumulation_steps(4);
  spec.set_steps(steps);
  spec.set_precision(v1::FP16);
  spec.mutable_optimizer()->set_lr(0.01);
  return spec;
}

}  // namespace mptrain::bench
