// train_bench: our engine's steady-state time per optimizer step on 1 or 2 GPUs (one thread per
// GPU in this process, NCCL between them), and the time of its gradient allreduce. Prints one
// JSON object per configuration; bench/report.py puts them beside PyTorch's figures.
//
//   train_bench --gpus 2 [--configs seed,mlp1k,mlp8k] [--warmup 10] [--steps 50]

#include <algorithm>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/nccl_collective.h"
#include "bench/bench_configs.h"
#include "common/cli_flags.h"
#include "common/job_spec.h"
#include "trainer/in_memory_store.h"
#include "trainer/train_loop.h"
#include "trainer/training_config_from_spec.h"

ABSL_FLAG(int, gpus, 2, "GPUs (ranks) to use");
ABSL_FLAG(std::string, configs, "seed,mlp1k,mlp8k", "Comma-separated configurations");
ABSL_FLAG(int, warmup, 10, "Optimizer steps left out of the timing");
ABSL_FLAG(int, steps, 50, "Timed optimizer steps");
ABSL_FLAG(int, allreduce_iters, 50, "Timed gradient allreduces");
ABSL_FLAG(std::string, norm, "none",
          "model.norm after each hidden Linear: none, layer_norm, batch_norm or sync_batch_norm");

namespace mptrain::bench {
namespace {

class StepTimes : public TrainingObserver {
 public:
  void OnStep(int64_t, const StepTelemetry* record) override {
    if (record != nullptr) times_ms.push_back(record->step_time_ms);
  }
  bool ShouldStop() override { return false; }
  std::vector<double> times_ms;
};

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct RankResult {
  absl::Status status;
  double step_ms = 0;
  double allreduce_ms = 0;
};

RankResult RunRank(const v1::JobSpec& spec, int rank, int warmup, InMemoryKeyValueStore* store) {
  RankResult result;
  auto backend = cuda::CudaBackend::Create(
      rank,
      [&](cudaStream_t stream) -> absl::StatusOr<std::unique_ptr<Collective>> {
        auto nccl = cuda::NcclCollective::Connect(rank, spec.world_size(), store, stream, 120'000);
        if (!nccl.ok()) return nccl.status();
        return std::unique_ptr<Collective>(std::move(*nccl));
      },
      120'000);
  if (!backend.ok()) {
    result.status = backend.status();
    return result;
  }
  StepTimes observer;
  absl::StatusOr<TrainingConfig> config = TrainingConfigFromSpec(spec);
  if (!config.ok()) {
    result.status = config.status();
    return result;
  }
  auto trained = RunTraining(*config, rank, backend->get(), &observer);
  if (!trained.ok()) {
    result.status = trained.status();
    return result;
  }
  std::vector<double> steady(observer.times_ms.begin() + std::min<size_t>(warmup, observer.times_ms.size()),
                             observer.times_ms.end());
  result.step_ms = Median(steady);

  // The gradient allreduce alone: the same buffer size, through the same Collective.
  const int64_t n = ParameterCount(spec.model()) + 1;
  auto buffer = (*backend)->Allocate(DType::kF32, 1, n);
  if (!buffer.ok()) {
    result.status = buffer.status();
    return result;
  }
  const int iters = absl::GetFlag(FLAGS_allreduce_iters);
  for (int i = 0; i < 5; ++i) (void)(*backend)->collective()->AllReduceMean(*buffer);
  auto start = (*backend)->NowMs();
  for (int i = 0; i < iters; ++i) {
    result.status = (*backend)->collective()->AllReduceMean(*buffer);
    if (!result.status.ok()) return result;
  }
  auto end = (*backend)->NowMs();
  if (!start.ok() || !end.ok()) {
    result.status = start.ok() ? end.status() : start.status();
    return result;
  }
  result.allreduce_ms = (*end - *start) / iters;
  return result;
}

}  // namespace
}  // namespace mptrain::bench

int main(int argc, char** argv) {
  using namespace mptrain;
  using namespace mptrain::bench;
  ParseFlags(argc, argv, "train_bench --gpus N");
  const int gpus = absl::GetFlag(FLAGS_gpus);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = absl::GetFlag(FLAGS_steps);
  std::vector<std::string> wanted = absl::StrSplit(absl::GetFlag(FLAGS_configs), ',');
  int status = 0;
  for (const BenchConfig& config : BenchConfigs()) {
    if (std::find(wanted.begin(), wanted.end(), config.name) == wanted.end()) continue;
    v1::JobSpec spec = BenchSpec(config, gpus, warmup + steps);
    v1::NormKind norm = v1::NORM_KIND_UNSPECIFIED;
    if (!v1::NormKind_Parse(absl::AsciiStrToUpper(absl::GetFlag(FLAGS_norm)), &norm)) {
      std::cerr << "--norm " << absl::GetFlag(FLAGS_norm) << ": unknown\n";
      return 2;
    }
    spec.mutable_model()->set_norm(norm);
    ApplyJobSpecDefaults(&spec);
    InMemoryKeyValueStore store;
    std::vector<RankResult> results(gpus);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < gpus; ++rank) {
      threads.emplace_back([&, rank] { results[rank] = RunRank(spec, rank, warmup, &store); });
    }
    for (auto& thread : threads) thread.join();
    for (const RankResult& result : results) {
      if (!result.status.ok()) {
        std::cerr << config.name << ": " << result.status << "\n";
        status = 1;
      }
    }
    if (!results[0].status.ok()) continue;
    const double params = static_cast<double>(ParameterCount(spec.model()));
    const double samples_per_gpu = static_cast<double>(config.micro_batch) * 4;
    const double step_ms = results[0].step_ms;
    const double bytes = (params + 1) * 4;
    const double busbw = gpus > 1 ? bytes * 2 * (gpus - 1) / gpus / (results[0].allreduce_ms * 1e-3) / 1e9 : 0;
    std::cout << absl::StrFormat(
                     "{\"engine\": \"mptrain\", \"config\": \"%s\", \"norm\": \"%s\", "
                     "\"gpus\": %d, \"step_ms\": %.4f, "
                     "\"samples_per_s\": %.1f, \"tflops_per_gpu\": %.2f, \"params\": %.0f, "
                     "\"allreduce_ms\": %.4f, \"allreduce_busbw_gbs\": %.2f}",
                     config.name, absl::GetFlag(FLAGS_norm), gpus, step_ms, samples_per_gpu * gpus / (step_ms * 1e-3),
                     6 * params * samples_per_gpu / (step_ms * 1e-3) / 1e12, params,
                     results[0].allreduce_ms, busbw)
              << std::endl;
  }
  return status;
}
