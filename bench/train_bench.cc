// train_bench: our engine's steady-state time per optimizer step on 1 or 2 GPUs (one thread per
// GPU in this process, NCCL between them), and the time of its gradient allreduce. Prints one
// JSON object per configuration; bench/report.py puts them beside PyTorch's figures.
//
//   train_bench --gpus 2 [--configs seed,mlp1k,mlp8k] [--warmup 10] [--steps 50]

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
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
ABSL_FLAG(bool, raw_nccl, true,
          "Also time ncclAllReduce itself on a blocking communicator of its own (the floor for "
          "our small collectives)");
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
  // Where a small collective's time goes: the host's wall time per AllReduceMean call (its
  // enqueue: events, NCCL's enqueue and the poll), and the device time per allreduce when 50
  // are queued without a join between them.
  double allreduce_host_us = 0;
  double allreduce_queued_ms = 0;
  double raw_nccl_ms = 0;  // ncclAllReduce back to back on a blocking communicator, per call.
};

// One blocking NCCL communicator shared by the rank threads of this process (the raw floor).
struct RawNccl {
  std::once_flag once;
  ncclUniqueId id;
};

// The device time of one ncclAllReduce (ncclAvg, f32, `n` elements) back to back on a blocking
// communicator and a stream of its own: what NCCL itself costs, without our events and polls.
absl::StatusOr<double> TimeRawNccl(RawNccl* raw, int rank, int world, void* buffer, int64_t n,
                                   int iters) {
  std::call_once(raw->once, [raw] { ncclGetUniqueId(&raw->id); });
  cudaSetDevice(rank);
  ncclComm_t comm = nullptr;
  if (ncclCommInitRank(&comm, world, raw->id, rank) != ncclSuccess) {
    return absl::InternalError("ncclCommInitRank failed");
  }
  cudaStream_t stream;
  cudaEvent_t begin, done;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEventCreate(&begin);
  cudaEventCreate(&done);
  for (int i = 0; i < 5; ++i) {
    ncclAllReduce(buffer, buffer, static_cast<size_t>(n), ncclFloat32, ncclAvg, comm, stream);
  }
  cudaEventRecord(begin, stream);
  for (int i = 0; i < iters; ++i) {
    ncclAllReduce(buffer, buffer, static_cast<size_t>(n), ncclFloat32, ncclAvg, comm, stream);
  }
  cudaEventRecord(done, stream);
  cudaEventSynchronize(done);
  float ms = 0;
  cudaEventElapsedTime(&ms, begin, done);
  cudaEventDestroy(begin);
  cudaEventDestroy(done);
  cudaStreamDestroy(stream);
  ncclCommDestroy(comm);
  return static_cast<double>(ms) / iters;
}

RankResult RunRank(const v1::JobSpec& spec, int rank, int warmup, InMemoryKeyValueStore* store,
                   RawNccl* raw) {
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
  // As a worker's rank does: MPTRAIN_STEP_GRAPHS=0 issues every step op by op (profiling).
  if (const char* graphs = std::getenv("MPTRAIN_STEP_GRAPHS"); graphs != nullptr &&
                                                                std::string(graphs) == "0") {
    config->record_steps = false;
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
  Collective* collective = (*backend)->collective();
  for (int i = 0; i < 5; ++i) (void)collective->AllReduceMean(*buffer);
  auto start = (*backend)->NowMs();
  const auto host_start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    result.status = collective->AllReduceMean(*buffer);
    if (!result.status.ok()) return result;
  }
  const auto host_end = std::chrono::steady_clock::now();
  auto end = (*backend)->NowMs();
  if (!start.ok() || !end.ok()) {
    result.status = start.ok() ? end.status() : start.status();
    return result;
  }
  result.allreduce_ms = (*end - *start) / iters;
  result.allreduce_host_us =
      std::chrono::duration<double, std::micro>(host_end - host_start).count() / iters;
  start = (*backend)->NowMs();
  for (int i = 0; i < iters; ++i) {
    result.status = collective->AllReduceMeanAsync(*buffer);
    if (!result.status.ok()) return result;
  }
  result.status = collective->JoinAllReduces();
  if (!result.status.ok()) return result;
  end = (*backend)->NowMs();
  if (!start.ok() || !end.ok()) {
    result.status = start.ok() ? end.status() : start.status();
    return result;
  }
  result.allreduce_queued_ms = (*end - *start) / iters;
  if (absl::GetFlag(FLAGS_raw_nccl) && spec.world_size() > 1) {
    absl::StatusOr<double> raw_ms =
        TimeRawNccl(raw, rank, spec.world_size(), buffer->data, n, iters);
    if (!raw_ms.ok()) {
      result.status = raw_ms.status();
      return result;
    }
    result.raw_nccl_ms = *raw_ms;
  }
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
    RawNccl raw;
    std::vector<RankResult> results(gpus);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < gpus; ++rank) {
      threads.emplace_back([&, rank] { results[rank] = RunRank(spec, rank, warmup, &store, &raw); });
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
                     "\"allreduce_ms\": %.4f, \"allreduce_busbw_gbs\": %.2f, "
                     "\"allreduce_host_us\": %.1f, \"allreduce_queued_ms\": %.4f, "
                     "\"raw_nccl_ms\": %.4f}",
                     config.name, absl::GetFlag(FLAGS_norm), gpus, step_ms, samples_per_gpu * gpus / (step_ms * 1e-3),
                     6 * params * samples_per_gpu / (step_ms * 1e-3) / 1e12, params,
                     results[0].allreduce_ms, busbw, results[0].allreduce_host_us,
                     results[0].allreduce_queued_ms, results[0].raw_nccl_ms)
              << std::endl;
  }
  return status;
}
