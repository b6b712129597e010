// gpt_train_bench: our GPT training step on one GPU in this process (the rank's own loop:
// RunTraining over the CUDA backend, the same JobSpec as bench/run_gpt_bench.sh submits), for
// profiling (scripts/device_run.sh gptprofile: Nsight Compute over one steady step, bracketed
// by cudaProfilerStart/Stop) and for quick timings without the service around it.
//
//   gpt_train_bench [--layers 12 --width 768 --heads 12] [--batch 16 --accum 4]
//                   [--precision bf16|fp16|fp32] [--warmup 5 --steps 10] [--profile_step 0]
// Prints one JSON line: median ms/step after the warm-up, tokens/s, the steps replayed as a
// recorded CUDA graph. Tokens: a synthetic llm.c shard of uniform ids written to --tokens.

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <vector>

#include <cuda_profiler_api.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/nccl_collective.h"
#include "common/cli_flags.h"
#include "common/job_spec.h"
#include "trainer/in_memory_store.h"
#include "trainer/train_loop.h"
#include "trainer/training_config_from_spec.h"

ABSL_FLAG(int64_t, layers, 12, "Transformer blocks");
ABSL_FLAG(int64_t, width, 768, "Embedding width");
ABSL_FLAG(int64_t, heads, 12, "Attention heads");
ABSL_FLAG(int64_t, context, 1024, "Context length");
ABSL_FLAG(int64_t, batch, 16, "Micro-batch (sequences)");
ABSL_FLAG(int64_t, accum, 4, "Accumulation micro-batches per step");
ABSL_FLAG(std::string, precision, "bf16", "fp32, bf16 or fp16 (GradScaler)");
ABSL_FLAG(int, warmup, 5, "Steps left out of the timing");
ABSL_FLAG(int, steps, 10, "Timed steps");
ABSL_FLAG(int, profile_step, 0,
          "Bracket the host's issue of one step after this one with cudaProfilerStart/Stop "
          "(ncu --profile-from-start off); 0: none");
ABSL_FLAG(bool, deterministic, false, "JobSpec.deterministic");
ABSL_FLAG(std::string, tokens, "/tmp/gpt_train_bench_tokens.bin", "Token shard (written)");

namespace mptrain::bench {
namespace {

// Step times from telemetry; OnStep(k) arrives as the host issues a later step (stats are read a
// few steps late), so the profiler range between two OnStep calls holds one step's issue.
class StepObserver : public TrainingObserver {
 public:
  explicit StepObserver(int profile_step) : profile_step_(profile_step) {}
  void OnStep(int64_t step, const StepTelemetry* record) override {
    if (record != nullptr) {
      times_ms.push_back(record->step_time_ms);
      last_loss = record->loss;
    }
    if (profile_step_ > 0 && step == profile_step_) cudaProfilerStart();
    if (profile_step_ > 0 && step == profile_step_ + 1) cudaProfilerStop();
  }
  bool ShouldStop() override { return false; }
  std::vector<double> times_ms;
  double last_loss = 0;

 private:
  int profile_step_;
};

bool WriteTokens(const std::string& path, int64_t count) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<int32_t>(count);
  std::vector<uint16_t> tokens(count);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (auto& t : tokens) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    t = static_cast<uint16_t>(state % 50257);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return static_cast<bool>(out);
}

int Main() {
  const int64_t L = absl::GetFlag(FLAGS_layers), C = absl::GetFlag(FLAGS_width);
  const int64_t H = absl::GetFlag(FLAGS_heads), T = absl::GetFlag(FLAGS_context);
  const int64_t B = absl::GetFlag(FLAGS_batch), A = absl::GetFlag(FLAGS_accum);
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  const std::string tokens = absl::GetFlag(FLAGS_tokens);
  if (!WriteTokens(tokens, int64_t{4} << 20)) {
    std::cerr << "gpt_train_bench: cannot write " << tokens << "\n";
    return 1;
  }
  const std::string json = absl::StrFormat(
      R"({"name": "gpt-bench", "world_size": 1, "device": "cuda",
          "model": {"gpt": {"vocab_size": 50257, "padded_vocab_size": 50304,
                            "context_length": %d, "layers": %d, "heads": %d, "width": %d}},
          "data": {"tokens": {"files": ["%s"]}},
          "micro_batch_size": %d, "accumulation_steps": %d, "steps": %d, "precision": "%s",
          "optimizer": {"kind": "adamw", "lr": 0.0006, "beta2": 0.95, "weight_decay": 0.1},
          "max_grad_norm": 1.0, "telemetry_every": 1, "deterministic": %s})",
      T, L, H, C, tokens, B, A, warmup + steps, absl::GetFlag(FLAGS_precision),
      absl::GetFlag(FLAGS_deterministic) ? "true" : "false");
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(json);
  if (!spec.ok()) {
    std::cerr << "gpt_train_bench: " << spec.status() << "\n";
    return 2;
  }
  ApplyJobSpecDefaults(&*spec);
  absl::StatusOr<TrainingConfig> config = TrainingConfigFromSpec(*spec);
  if (!config.ok()) {
    std::cerr << "gpt_train_bench: " << config.status() << "\n";
    return 2;
  }
  // As a worker's rank does: MPTRAIN_STEP_GRAPHS=0 issues every step op by op (profiling).
  if (const char* graphs = std::getenv("MPTRAIN_STEP_GRAPHS");
      graphs != nullptr && std::string(graphs) == "0") {
    config->record_steps = false;
  }
  InMemoryKeyValueStore store;
  auto backend = cuda::CudaBackend::Create(
      0,
      [&](cudaStream_t stream) -> absl::StatusOr<std::unique_ptr<Collective>> {
        auto nccl = cuda::NcclCollective::Connect(0, 1, &store, stream, 120'000);
        if (!nccl.ok()) return nccl.status();
        return std::unique_ptr<Collective>(std::move(*nccl));
      },
      120'000);
  if (!backend.ok()) {
    std::cerr << "gpt_train_bench: " << backend.status() << "\n";
    return 1;
  }
  StepObserver observer(absl::GetFlag(FLAGS_profile_step));
  absl::StatusOr<TrainingResult> trained = RunTraining(*config, 0, backend->get(), &observer);
  if (!trained.ok()) {
    std::cerr << "gpt_train_bench: " << trained.status() << "\n";
    return 1;
  }
  std::vector<double> steady(
      observer.times_ms.begin() + std::min<size_t>(warmup, observer.times_ms.size()),
      observer.times_ms.end());
  std::sort(steady.begin(), steady.end());
  const double ms = steady.empty() ? 0 : steady[steady.size() / 2];
  const double step_tokens = static_cast<double>(B * A * T);
  std::cout << absl::StrFormat(
                   "{\"engine\": \"mptrain (in process)\", \"layers\": %d, \"width\": %d, "
                   "\"batch\": %d, \"accum\": %d, \"precision\": \"%s\", \"ms_per_step\": %.2f, "
                   "\"tokens_per_s\": %.0f, \"replayed_steps\": %d, \"first_ms\": %.1f, "
                   "\"deterministic\": %s, \"final_loss\": %.6f}",
                   L, C, B, A, absl::GetFlag(FLAGS_precision), ms,
                   ms > 0 ? step_tokens / ms * 1000 : 0, trained->replayed_steps,
                   observer.times_ms.empty() ? 0 : observer.times_ms.front(),
                   absl::GetFlag(FLAGS_deterministic) ? "true" : "false", observer.last_loss)
            << std::endl;
  return 0;
}

}  // namespace
}  // namespace mptrain::bench

int main(int argc, char** argv) {
  mptrain::ParseFlags(argc, argv, "gpt_train_bench [--layers 12 --width 768 ...]");
  return mptrain::bench::Main();
}
