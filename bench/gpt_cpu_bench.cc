// Tokens per second of our GPT training step on the CPU backend (one rank: forward, the
// cross-entropy, backward, AdamW), for bench/run_gpt_cpu_bench.sh, which compares it with
// PyTorch eager on the same configuration and threads (bench/gpt_cpu_torch.py).
//
//   gpt_cpu_bench --tokens FILE --layers L --width C --heads H --context T --batch B
//                 [--steps N] [--precision fp32|bf16]
// Prints "tokens_per_second X" over the steps after the first (warm-up).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "tests/fake_collectives.h"
#include "trainer/train_loop.h"

namespace mptrain {
namespace {

class TimingObserver : public TrainingObserver {
 public:
  void OnStep(int64_t step, const StepTelemetry*) override {
    if (step == 1) first_ = std::chrono::steady_clock::now();
    last_ = std::chrono::steady_clock::now();
  }
  bool ShouldStop() override { return false; }
  double SecondsAfterFirst() const { return std::chrono::duration<double>(last_ - first_).count(); }

 private:
  std::chrono::steady_clock::time_point first_, last_;
};

int Main(int argc, char** argv) {
  TrainingConfig config;
  config.model.gpt.vocab_size = 256;
  config.model.gpt.padded_vocab_size = 256;
  config.model.gpt.layers = 2;
  config.model.gpt.width = 64;
  config.model.gpt.heads = 4;
  config.model.gpt.context_length = 64;
  config.micro_batch_size = 8;
  config.steps = 20;
  config.compute_dtype = DType::kF32;
  config.loss.type = LossType::kCrossEntropy;
  config.optimizer.type = OptimizerType::kAdamW;
  config.optimizer.lr = 1e-3;
  config.data.source = DataConfig::Source::kTokens;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--tokens")
      config.data.token_files = {value};
    else if (flag == "--layers")
      config.model.gpt.layers = std::atoll(value);
    else if (flag == "--width")
      config.model.gpt.width = std::atoll(value);
    else if (flag == "--heads")
      config.model.gpt.heads = std::atoll(value);
    else if (flag == "--context")
      config.model.gpt.context_length = std::atoll(value);
    else if (flag == "--batch")
      config.micro_batch_size = std::atoll(value);
    else if (flag == "--steps")
      config.steps = std::atoll(value);
    else if (flag == "--precision") {
      config.compute_dtype = std::strcmp(value, "bf16") == 0 ? DType::kBF16 : DType::kF32;
    } else {
      std::fprintf(stderr, "gpt_cpu_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (config.steps < 2) config.steps = 2;
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  TimingObserver observer;
  absl::StatusOr<TrainingResult> result = RunTraining(config, 0, &backend, &observer);
  if (!result.ok()) {
    std::fprintf(stderr, "gpt_cpu_bench: %s\n", result.status().ToString().c_str());
    return 1;
  }
  const double tokens = static_cast<double>(config.steps - 1) * config.micro_batch_size *
                        config.model.gpt.context_length;
  std::printf("tokens_per_second %.1f\n", tokens / observer.SecondsAfterFirst());
  return 0;
}

}  // namespace
}  // namespace mptrain

int main(int argc, char** argv) { return mptrain::Main(argc, argv); }
