// The CUDA backend against the CPU backend (the reference for autocast numerics) and NCCL
// across two GPUs. Needs a GPU: skips with the reason on machines without one (CI); run on the
// GPU machine with scripts/device_run.sh.

#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <random>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/nccl_collective.h"
#include "comm/stop_token.h"
#include "gtest/gtest.h"
#include "io/npy.h"
#include "tests/fake_collectives.h"
#include "trainer/loss/mse.h"
#include "trainer/mlp.h"
#include "trainer/precision.h"
#include "trainer/train_loop.h"
#include "trainer/training_config_from_spec.h"

namespace mptrain::cuda {
namespace {

int VisibleGpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

#define REQUIRE_GPUS(n)                                                                    \
  if (VisibleGpus() < (n)) {                                                               \
    GTEST_SKIP() << "needs " << (n) << " CUDA GPU(s), " << VisibleGpus()                   \
                 << " visible: runs on the GPU machine (scripts/device_run.sh)";           \
  }

std::unique_ptr<CudaBackend> SingleRankBackend(int device = 0) {
  auto backend = CudaBackend::Create(
      device,
      [](cudaStream_t) -> absl::StatusOr<std::unique_ptr<Collective>> {
        return std::unique_ptr<Collective>(new testing::SingleRankCollective());
      },
      60'000);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

// ‖a − b‖ / ‖b‖
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

class LinearParity : public ::testing::TestWithParam<std::tuple<DType, ActivationKind>> {};

TEST_P(LinearParity, ForwardAndBackwardMatchCpuBackend) {
  REQUIRE_GPUS(1);
  const auto [dtype, act] = GetParam();
  const int64_t m = 96, k = 160, n = 72;
  std::mt19937 generator(1);
  std::normal_distribution<float> normal;
  auto random = [&](int64_t count, float scale) {
    std::vector<float> values(count);
    for (float& v : values) v = scale * normal(generator);
    return values;
  };
  const std::vector<float> x = random(m * k, 1.0f), w = random(n * k, 0.1f), b = random(n, 0.1f),
                           dy = random(m * n, 1.0f);
  auto gpu = SingleRankBackend();
  CpuBackend cpu(std::make_unique<testing::SingleRankCollective>());
  struct Outputs {
    std::vector<float> y, pre, dx, dw, db;
  };
  // The backward pass starts from `pre_override` when given: the same pre-activations on both
  // backends, so that only the GEMMs' summation order differs. (GELU's derivative crosses zero
  // near -0.75, where one ulp of difference in pre is a large relative change in d_pre.)
  auto run = [&](Backend& backend, const std::vector<float>* pre_override) {
    Outputs out;
    Tensor tx = *backend.Allocate(dtype, m, k), tw = *backend.Allocate(dtype, n, k),
           tb = *backend.Allocate(dtype, 1, n), tpre = *backend.Allocate(dtype, m, n),
           ty = *backend.Allocate(dtype, m, n), tdy = *backend.Allocate(dtype, m, n),
           tdpre = *backend.Allocate(dtype, m, n), tdx = *backend.Allocate(dtype, m, k),
           tdw = *backend.Allocate(DType::kF32, n, k), tdb = *backend.Allocate(DType::kF32, 1, n);
    EXPECT_TRUE(backend.Upload(x.data(), tx).ok());
    EXPECT_TRUE(backend.Upload(w.data(), tw).ok());
    EXPECT_TRUE(backend.Upload(b.data(), tb).ok());
    EXPECT_TRUE(backend.Upload(dy.data(), tdy).ok());
    EXPECT_TRUE(backend.LinearForward(tx, tw, tb, act, tpre, ty).ok());
    out.pre.resize(m * n);
    EXPECT_TRUE(backend.Download(tpre, out.pre.data()).ok());
    if (pre_override != nullptr) {
      EXPECT_TRUE(backend.Upload(pre_override->data(), tpre).ok());
    }
    EXPECT_TRUE(backend.ActivationBackward(act, tpre, tdy, tdpre).ok());
    EXPECT_TRUE(backend.LinearBackward(tx, tw, tdpre, tdx, tdw, tdb).ok());
    out.y.resize(m * n);
    out.dx.resize(m * k);
    out.dw.resize(n * k);
    out.db.resize(n);
    EXPECT_TRUE(backend.Download(ty, out.y.data()).ok());
    EXPECT_TRUE(backend.Download(tdx, out.dx.data()).ok());
    EXPECT_TRUE(backend.Download(tdw, out.dw.data()).ok());
    EXPECT_TRUE(backend.Download(tdb, out.db.data()).ok());
    return out;
  };
  Outputs on_cpu = run(cpu, nullptr);
  Outputs on_gpu = run(*gpu, &on_cpu.pre);
  // Same inputs, same rounding points; only the GEMMs' summation order differs, which moves a
  // result by at most an ulp of the low-precision type (fp16 2^-11, bf16 2^-8 relative).
  const double tolerance = dtype == DType::kBF16 ? 1e-2 : dtype == DType::kF16 ? 2e-3 : 1e-5;
  EXPECT_LT(RelativeError(on_gpu.y, on_cpu.y), tolerance);
  EXPECT_LT(RelativeError(on_gpu.pre, on_cpu.pre), tolerance);
  EXPECT_LT(RelativeError(on_gpu.dx, on_cpu.dx), tolerance);
  EXPECT_LT(RelativeError(on_gpu.dw, on_cpu.dw), tolerance);
  EXPECT_LT(RelativeError(on_gpu.db, on_cpu.db), tolerance);
}

INSTANTIATE_TEST_SUITE_P(
    DtypesAndActivations, LinearParity,
    ::testing::Combine(::testing::Values(DType::kF16, DType::kBF16, DType::kF32),
                       ::testing::Values(ActivationKind::kRelu, ActivationKind::kGelu,
                                         ActivationKind::kNone)));

class NullObserver : public TrainingObserver {
 public:
  void OnStep(int64_t, const StepTelemetry* record) override {
    if (record != nullptr) records.push_back(*record);
  }
  bool ShouldStop() override { return false; }
  std::vector<StepTelemetry> records;
};

// The same single-rank training on GPU 0 and on the CPU backend (the reference for autocast
// numerics), with each run's telemetry.
struct GpuAndCpuRuns {
  NullObserver gpu_observer, cpu_observer;
  absl::StatusOr<TrainingResult> on_gpu, on_cpu;
};

GpuAndCpuRuns TrainOnGpuAndCpu(const TrainingConfig& spec) {
  GpuAndCpuRuns runs;
  auto gpu = SingleRankBackend();
  CpuBackend cpu(std::make_unique<testing::SingleRankCollective>());
  runs.on_gpu = RunTraining(spec, 0, gpu.get(), &runs.gpu_observer);
  runs.on_cpu = RunTraining(spec, 0, &cpu, &runs.cpu_observer);
  return runs;
}

// Rank `rank` of two on GPU `rank`, its NCCL collective meeting the other through `store`;
// `lanes` as JobSpec.grad_comm_lanes (0: decided at rendezvous); `stop` aborts its waits.
absl::StatusOr<std::unique_ptr<CudaBackend>> TwoGpuRank(int rank, InMemoryKeyValueStore* store,
                                                        int lanes, StopToken* stop = nullptr) {
  return CudaBackend::Create(
      rank,
      [&](cudaStream_t stream) -> absl::StatusOr<std::unique_ptr<Collective>> {
        NcclCollectiveOptions options;
        options.rank = rank;
        options.world_size = 2;
        options.store = store;
        options.rendezvous_timeout_ms = options.collective_timeout_ms = 60'000;
        options.lanes = lanes;
        options.stop_token = stop;
        auto nccl = NcclCollective::Connect(options, stream);
        if (!nccl.ok()) return nccl.status();
        return std::unique_ptr<Collective>(std::move(*nccl));
      },
      60'000);
}

// Trains `spec` (world size 2) on GPUs 0 and 1 over NCCL, one thread per rank; `lanes` as
// JobSpec.grad_comm_lanes (0: decided at rendezvous).
std::array<absl::StatusOr<TrainingResult>, 2> TrainOnTwoGpus(const TrainingConfig& spec,
                                                             int lanes = 0) {
  InMemoryKeyValueStore store;
  std::array<absl::StatusOr<TrainingResult>, 2> results;
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      auto backend = TwoGpuRank(rank, &store, lanes);
      if (!backend.ok()) {
        results[rank] = backend.status();
        return;
      }
      NullObserver observer;
      results[rank] = RunTraining(spec, rank, backend->get(), &observer);
    });
  }
  for (auto& rank : ranks) rank.join();
  return results;
}

TrainingConfig MlpSpec(v1::Precision precision, double init_scale) {
  v1::JobSpec spec;
  spec.set_world_size(1);
  spec.set_device(v1::CUDA);
  spec.mutable_model()->set_input_dim(256);
  spec.mutable_model()->add_hidden_dims(128);
  spec.mutable_model()->add_hidden_dims(128);
  spec.mutable_model()->set_output_dim(32);
  spec.mutable_data()->mutable_synthetic()->set_seed(9);
  spec.set_micro_batch_size(64);
  spec.set_accumulation_steps(4);
  spec.set_steps(30);
  spec.set_precision(precision);
  spec.mutable_optimizer()->set_lr(0.01);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.mutable_loss_scaler()->set_init_scale(init_scale);
  spec.mutable_loss_scaler()->set_enabled(precision != v1::FP32);
  absl::StatusOr<TrainingConfig> config = TrainingConfigFromSpec(spec);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : TrainingConfig{};
}

class TrainingParity : public ::testing::TestWithParam<std::tuple<v1::Precision, double>> {};

TEST_P(TrainingParity, CudaTrainingMatchesCpuTraining) {
  REQUIRE_GPUS(1);
  const auto [precision, init_scale] = GetParam();
  TrainingConfig spec = MlpSpec(precision, init_scale);
  GpuAndCpuRuns runs = TrainOnGpuAndCpu(spec);
  const NullObserver& gpu_observer = runs.gpu_observer;
  const NullObserver& cpu_observer = runs.cpu_observer;
  const absl::StatusOr<TrainingResult>& on_gpu = runs.on_gpu;
  const absl::StatusOr<TrainingResult>& on_cpu = runs.on_cpu;
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  // Overflow decisions and the scale trajectory are discrete: they must agree exactly.
  ASSERT_EQ(gpu_observer.records.size(), cpu_observer.records.size());
  for (size_t i = 0; i < gpu_observer.records.size(); ++i) {
    EXPECT_EQ(gpu_observer.records[i].skipped, cpu_observer.records[i].skipped) << "step " << i + 1;
    EXPECT_EQ(gpu_observer.records[i].loss_scale, cpu_observer.records[i].loss_scale);
    EXPECT_NEAR(gpu_observer.records[i].loss, cpu_observer.records[i].loss,
                2e-3 * std::fabs(cpu_observer.records[i].loss));
  }
  EXPECT_EQ(on_gpu->skipped_steps, on_cpu->skipped_steps);
  EXPECT_LT(RelativeError(on_gpu->parameters, on_cpu->parameters), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Cases, TrainingParity,
                         ::testing::Values(std::make_tuple(v1::FP16, 65536.0),
                                           std::make_tuple(v1::BF16, 1.0),
                                           std::make_tuple(v1::FP32, 1.0),
                                           std::make_tuple(v1::FP16, 1e30)));

// Issue 14's normalization layers: whole training runs on the GPU against the CPU backend (the
// CPU side is proven against PyTorch in CI), per norm and precision.
class NormParity : public ::testing::TestWithParam<std::tuple<NormKind, v1::Precision>> {};

TEST_P(NormParity, CudaTrainingMatchesCpuTraining) {
  REQUIRE_GPUS(1);
  const auto [norm, precision] = GetParam();
  TrainingConfig spec = MlpSpec(precision, 65536.0);
  spec.model.norm = norm;
  GpuAndCpuRuns runs = TrainOnGpuAndCpu(spec);
  const NullObserver& gpu_observer = runs.gpu_observer;
  const NullObserver& cpu_observer = runs.cpu_observer;
  const absl::StatusOr<TrainingResult>& on_gpu = runs.on_gpu;
  const absl::StatusOr<TrainingResult>& on_cpu = runs.on_cpu;
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  ASSERT_EQ(gpu_observer.records.size(), cpu_observer.records.size());
  const double tolerance = precision == v1::FP32 ? 1e-5 : precision == v1::FP16 ? 2e-3 : 1e-2;
  for (size_t i = 0; i < gpu_observer.records.size(); ++i) {
    EXPECT_EQ(gpu_observer.records[i].skipped, cpu_observer.records[i].skipped) << "step " << i + 1;
    EXPECT_NEAR(gpu_observer.records[i].loss, cpu_observer.records[i].loss,
                tolerance * std::fabs(cpu_observer.records[i].loss))
        << "step " << i + 1;
  }
  EXPECT_LT(RelativeError(on_gpu->parameters, on_cpu->parameters), tolerance);
  ASSERT_EQ(on_gpu->buffers.size(), on_cpu->buffers.size());
  if (!on_cpu->buffers.empty()) {
    EXPECT_LT(RelativeError(on_gpu->buffers, on_cpu->buffers), tolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Norms, NormParity,
    ::testing::Values(std::make_tuple(NormKind::kLayerNorm, v1::FP16),
                      std::make_tuple(NormKind::kLayerNorm, v1::FP32),
                      std::make_tuple(NormKind::kBatchNorm, v1::FP16),
                      std::make_tuple(NormKind::kBatchNorm, v1::BF16),
                      std::make_tuple(NormKind::kSyncBatchNorm, v1::FP16)));

// sync_batch_norm over NCCL on two GPUs: both ranks end with identical parameters and identical
// running statistics (every forward all-gathers, every backward sums, no_sync or not).
TEST(NcclCollective, TwoGpus_SyncBatchNorm_IdenticalParametersAndStatistics) {
  REQUIRE_GPUS(2);
  TrainingConfig spec = MlpSpec(v1::FP16, 65536.0);
  spec.world_size = 2;
  spec.model.norm = NormKind::kSyncBatchNorm;
  std::array<absl::StatusOr<TrainingResult>, 2> results = TrainOnTwoGpus(spec);
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[0]->checksum, results[1]->checksum);
  EXPECT_FALSE(results[0]->buffers.empty());
  EXPECT_EQ(results[0]->buffers, results[1]->buffers);
}

// Issue 13's features on the GPU against the CPU backend (the CPU side is proven against PyTorch
// in CI): cross-entropy with label smoothing, AdamW, warm-up + cosine, shuffled epochs and
// evaluation, in fp16 from an overflowing scale (skipped steps must leave Adam untouched on both),
// bf16 and fp32.
class FeatureParity : public ::testing::TestWithParam<DType> {};

// A classifier on a shuffled npy dataset (300 rows) with evaluations: cross-entropy with label
// smoothing, AdamW, warm-up + cosine, fp16 from an overflowing scale.
constexpr int kClassifierRows = 300;
TrainingConfig ShuffledClassifierConfig(DType dtype) {
  const int in = 64, classes = 10, rows = kClassifierRows;
  std::mt19937 generator(13);
  std::normal_distribution<float> normal;
  NpyMatrix features{rows, in, std::vector<float>(rows * in)};
  NpyLabels labels{rows, std::vector<int64_t>(rows)};
  for (float& v : features.values) v = normal(generator);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = &features.values[r * in];
    labels.values[r] = std::max_element(x, x + classes) - x;
  }
  const std::string dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  EXPECT_TRUE(WriteNpyMatrix(dir + "/ce_x.npy", features).ok());
  EXPECT_TRUE(WriteNpyLabels(dir + "/ce_y.npy", labels).ok());
  TrainingConfig config;
  config.model.widths = {in, 128, 128, classes};
  config.model.activation = ActivationKind::kGelu;
  config.loss.type = LossType::kCrossEntropy;
  config.loss.label_smoothing = 0.1;
  config.data.source = DataConfig::Source::kNpy;
  config.data.features_path = dir + "/ce_x.npy";
  config.data.targets_path = dir + "/ce_y.npy";
  config.data.shuffle = true;
  config.data.shuffle_seed = 2;
  config.eval.features_path = config.data.features_path;
  config.eval.targets_path = config.data.targets_path;
  config.eval.every = 10;
  config.micro_batch_size = 32;
  config.accumulation_steps = 2;
  config.steps = 30;
  config.compute_dtype = dtype;
  config.optimizer.type = OptimizerType::kAdamW;
  config.optimizer.lr = 0.003;
  config.optimizer.weight_decay = 0.05;
  config.lr_schedule.type = ScheduleType::kWarmupCosine;
  config.lr_schedule.warmup_steps = 5;
  config.lr_schedule.min_lr = 0.0003;
  config.loss_scaler.enabled = dtype == DType::kF16;
  config.loss_scaler.init_scale = std::ldexp(1.0, 40);
  config.loss_scaler.growth_interval = 10;
  return config;
}

TEST_P(FeatureParity, CrossEntropyAdamWScheduleShuffleEval_CudaMatchesCpu) {
  REQUIRE_GPUS(1);
  const DType dtype = GetParam();
  const int rows = kClassifierRows;
  TrainingConfig config = ShuffledClassifierConfig(dtype);
  GpuAndCpuRuns runs = TrainOnGpuAndCpu(config);
  const NullObserver& gpu_observer = runs.gpu_observer;
  const NullObserver& cpu_observer = runs.cpu_observer;
  const absl::StatusOr<TrainingResult>& on_gpu = runs.on_gpu;
  const absl::StatusOr<TrainingResult>& on_cpu = runs.on_cpu;
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  if (dtype == DType::kF16) {
    EXPECT_GT(on_cpu->skipped_steps, 0);
  }
  EXPECT_EQ(on_gpu->skipped_steps, on_cpu->skipped_steps);
  const double tolerance = dtype == DType::kF32 ? 1e-5 : dtype == DType::kF16 ? 2e-3 : 1e-2;
  ASSERT_EQ(gpu_observer.records.size(), cpu_observer.records.size());
  for (size_t i = 0; i < gpu_observer.records.size(); ++i) {
    const StepTelemetry& g = gpu_observer.records[i];
    const StepTelemetry& c = cpu_observer.records[i];
    EXPECT_EQ(g.skipped, c.skipped) << "step " << i + 1;
    EXPECT_EQ(g.loss_scale, c.loss_scale);
    EXPECT_EQ(g.lr, c.lr);
    EXPECT_NEAR(g.loss, c.loss, tolerance * std::fabs(c.loss)) << "step " << i + 1;
    EXPECT_NEAR(g.accuracy, c.accuracy, 2.0 / 64 + 1e-12) << "two samples of 64 at most";
    EXPECT_EQ(g.has_eval, c.has_eval);
    if (c.has_eval) {
      EXPECT_NEAR(g.eval_loss, c.eval_loss, tolerance * std::fabs(c.eval_loss));
      EXPECT_NEAR(g.eval_accuracy, c.eval_accuracy, 2.0 / rows + 1e-12)
          << "two samples of " << rows << " at most";
    }
  }
  EXPECT_LT(RelativeError(on_gpu->parameters, on_cpu->parameters), 10 * tolerance);
}

INSTANTIATE_TEST_SUITE_P(Precisions, FeatureParity,
                         ::testing::Values(DType::kF16, DType::kBF16, DType::kF32));

// Shuffled batches are gathered into buffers of their own before each step
// (MicroBatches::Stage) and the step reading them is replayed as a CUDA graph: bit-identical to
// every step issued op by op, evaluations (each followed by a new recording) included.
TEST(RecordedSteps, OneGpu_ShuffledBatchesStagedAndReplayed_AreBitIdentical) {
  REQUIRE_GPUS(1);
  TrainingConfig config = ShuffledClassifierConfig(DType::kF16);
  NullObserver replayed_observer, issued_observer;
  auto replaying = SingleRankBackend();
  absl::StatusOr<TrainingResult> replayed =
      RunTraining(config, 0, replaying.get(), &replayed_observer);
  config.record_steps = false;
  auto issuing = SingleRankBackend();
  absl::StatusOr<TrainingResult> issued = RunTraining(config, 0, issuing.get(), &issued_observer);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  ASSERT_TRUE(issued.ok()) << issued.status();
  EXPECT_EQ(replayed->replayed_steps, config.steps - 1);
  EXPECT_GT(issued->skipped_steps, 0);
  EXPECT_EQ(replayed->parameters, issued->parameters);
  EXPECT_EQ(replayed->skipped_steps, issued->skipped_steps);
  ASSERT_EQ(replayed_observer.records.size(), issued_observer.records.size());
  for (size_t i = 0; i < issued_observer.records.size(); ++i) {
    EXPECT_EQ(replayed_observer.records[i].loss, issued_observer.records[i].loss) << i;
    EXPECT_EQ(replayed_observer.records[i].accuracy, issued_observer.records[i].accuracy) << i;
    EXPECT_EQ(replayed_observer.records[i].eval_loss, issued_observer.records[i].eval_loss) << i;
  }
}

TEST(NcclCollective, TwoGpus_TrainToIdenticalParameters) {
  REQUIRE_GPUS(2);
  TrainingConfig spec = MlpSpec(v1::FP16, 65536.0);
  spec.world_size = 2;
  std::array<absl::StatusOr<TrainingResult>, 2> results = TrainOnTwoGpus(spec);
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[0]->checksum, results[1]->checksum);
}

// grad_comm_lanes: a bucket striped over three communicators reduces to exactly what one gives
// (the mean of two ranks does not depend on how the buffer is cut), and within one machine the
// rendezvous decides one lane.
TEST(NcclCollective, TwoGpus_GradientsStripedOverLanes_TrainBitIdenticalToOneLane) {
  REQUIRE_GPUS(2);
  TrainingConfig spec = MlpSpec(v1::FP16, 65536.0);
  spec.world_size = 2;
  spec.model.widths = {2048, 1024, 1024};  // 2M + 1M weights: one bucket in three slices.
  spec.steps = 6;
  std::string checksums[2];
  const int lanes[2] = {1, 3};
  for (int l = 0; l < 2; ++l) {
    std::array<absl::StatusOr<TrainingResult>, 2> results = TrainOnTwoGpus(spec, lanes[l]);
    ASSERT_TRUE(results[0].ok()) << results[0].status();
    ASSERT_TRUE(results[1].ok()) << results[1].status();
    EXPECT_EQ(results[0]->checksum, results[1]->checksum) << lanes[l] << " lanes";
    checksums[l] = results[0]->checksum;
  }
  EXPECT_EQ(checksums[1], checksums[0]);

  InMemoryKeyValueStore store;
  int decided[2] = {-1, -1};
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      cudaSetDevice(rank);
      NcclCollectiveOptions options;
      options.rank = rank;
      options.world_size = 2;
      options.store = &store;
      auto nccl = NcclCollective::Connect(options, nullptr);
      if (nccl.ok()) decided[rank] = (*nccl)->lanes();
    });
  }
  for (auto& rank : ranks) rank.join();
  EXPECT_EQ(decided[0], 1) << "two GPUs of one machine: one lane";
  EXPECT_EQ(decided[1], 1);
}

// The blocking communicators form on a thread the rank leaves behind: a peer that never joins
// ends the rendezvous at its deadline, and Abort() (the rank's stop token) ends it at once.
TEST(NcclCollective, Connect_GivesUpOnAPeerThatNeverJoins_AndOnAbort) {
  REQUIRE_GPUS(1);
  for (bool abort : {false, true}) {
    InMemoryKeyValueStore store;  // Rank 1 never comes.
    StopToken stop;
    NcclCollectiveOptions options;
    options.rank = 0;
    options.world_size = 2;
    options.store = &store;
    options.lanes = 1;  // Straight to NCCL: no wait for rank 1's node.
    options.rendezvous_timeout_ms = abort ? 60'000 : 1'500;
    options.stop_token = &stop;
    std::thread tripper([&] {
      if (!abort) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      stop.RequestStop("test: the worker stopped this rank");
    });
    const auto start = std::chrono::steady_clock::now();
    auto nccl = NcclCollective::Connect(options, nullptr);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    tripper.join();
    ASSERT_FALSE(nccl.ok());
    EXPECT_EQ(nccl.status().code(),
              abort ? absl::StatusCode::kAborted : absl::StatusCode::kDeadlineExceeded)
        << nccl.status();
    EXPECT_LT(seconds, 5.0) << nccl.status();
  }
}

// A job of one rank on NCCL: its allreduces and broadcasts leave the data as it is, bit for
// bit (no kernel runs for them), a one-rank NCCL job trains exactly as one on the single-rank
// collective, and Abort() still ends every later collective with ABORTED.
TEST(NcclCollective, OneRank_CollectivesAreTheIdentity_TrainingUnchanged_AbortStillWorks) {
  REQUIRE_GPUS(1);
  InMemoryKeyValueStore store;
  StopToken stop;
  NcclCollective* collective = nullptr;
  auto backend = CudaBackend::Create(
      0,
      [&](cudaStream_t stream) -> absl::StatusOr<std::unique_ptr<Collective>> {
        NcclCollectiveOptions options;
        options.world_size = 1;
        options.store = &store;
        options.stop_token = &stop;
        auto nccl = NcclCollective::Connect(options, stream);
        if (!nccl.ok()) return nccl.status();
        collective = nccl->get();
        return std::unique_ptr<Collective>(std::move(*nccl));
      },
      60'000);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::vector<float> values = {1.5f, -0.0f, 3e-41f, -65504.0f, 1e30f,
                                     std::numeric_limits<float>::infinity(), 0.1f, -7.0f};
  auto buffer = (*backend)->Allocate(DType::kF32, 1, values.size());
  auto low = (*backend)->Allocate(DType::kF16, 1, values.size());
  ASSERT_TRUE(buffer.ok() && low.ok());
  ASSERT_TRUE((*backend)->Upload(values.data(), *buffer).ok());
  ASSERT_TRUE((*backend)->Upload(values.data(), *low).ok());
  ASSERT_TRUE(collective->AllReduceMean(*buffer).ok());
  ASSERT_TRUE(collective->AllReduceMeanAsync(*buffer).ok());
  ASSERT_TRUE(collective->AllReduceSumCompressedAsync(*low).ok());
  ASSERT_TRUE(collective->JoinAllReduces().ok());
  ASSERT_TRUE(collective->Broadcast(*buffer, 0).ok());
  ASSERT_TRUE(collective->AllReduceSum(*buffer).ok());
  EXPECT_EQ(collective->Broadcast(*buffer, 1).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> after(values.size()), after_low(values.size());
  ASSERT_TRUE((*backend)->Download(*buffer, after.data()).ok());
  ASSERT_TRUE((*backend)->Download(*low, after_low.data()).ok());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(std::memcmp(&after[i], &values[i], 4), 0) << i << ": " << after[i];
    EXPECT_EQ(after_low[i], RoundTo(DType::kF16, values[i])) << i;
  }

  // Training: the same parameters as on the single-rank collective.
  TrainingConfig config = MlpSpec(v1::FP16, 65536.0);
  NullObserver observer;
  auto on_nccl = RunTraining(config, 0, backend->get(), &observer);
  auto single = SingleRankBackend();
  ASSERT_NE(single, nullptr);
  auto on_single = RunTraining(config, 0, single.get(), &observer);
  ASSERT_TRUE(on_nccl.ok() && on_single.ok()) << on_nccl.status() << on_single.status();
  EXPECT_EQ(on_nccl->checksum, on_single->checksum);
  EXPECT_EQ(on_nccl->parameters, on_single->parameters);

  stop.RequestStop("test: stopped");
  EXPECT_EQ(collective->AllReduceMeanAsync(*buffer).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(collective->Broadcast(*buffer, 0).code(), absl::StatusCode::kAborted);
}

// grad_comm_dtype fp16 / bf16 (DDP's compress hooks) through NCCL's fp16/bf16 sums: the ranks
// end identical, and the compressed communication shows in the result (fp32 gradients give
// other parameters).
TEST(NcclCollective, TwoGpus_CompressedGradients_TrainToIdenticalParameters) {
  REQUIRE_GPUS(2);
  std::string checksums[3];
  const DType comms[3] = {DType::kF32, DType::kF16, DType::kBF16};
  for (int c = 0; c < 3; ++c) {
    TrainingConfig spec = MlpSpec(v1::FP16, 65536.0);
    spec.world_size = 2;
    spec.grad_comm_dtype = comms[c];
    std::array<absl::StatusOr<TrainingResult>, 2> results = TrainOnTwoGpus(spec);
    ASSERT_TRUE(results[0].ok()) << results[0].status();
    ASSERT_TRUE(results[1].ok()) << results[1].status();
    EXPECT_EQ(results[0]->checksum, results[1]->checksum) << "grad comm " << c;
    checksums[c] = results[0]->checksum;
  }
  EXPECT_NE(checksums[1], checksums[0]) << "fp16 gradient communication changed nothing";
  EXPECT_NE(checksums[2], checksums[0]) << "bf16 gradient communication changed nothing";
}

TEST(CudaBackend, CompressGradients_MatchesTheCpuBackend_AndWidensBackExactly) {
  REQUIRE_GPUS(1);
  std::mt19937 generator(5);
  std::normal_distribution<float> normal;
  std::vector<float> grads(4099);
  for (float& g : grads) g = 3e4f * normal(generator);  // fp16 rounding everywhere, some infs.
  grads[0] = 1e-9f;
  grads[1] = 131000.0f;  // inf in fp16.
  auto gpu = SingleRankBackend();
  CpuBackend cpu(std::make_unique<testing::SingleRankCollective>());
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    std::vector<float> results[2];
    Backend* backends[2] = {gpu.get(), &cpu};
    for (int b = 0; b < 2; ++b) {
      Backend& backend = *backends[b];
      auto src = backend.Allocate(DType::kF32, 1, grads.size());
      auto wire = backend.Allocate(dtype, 1, grads.size());
      auto back = backend.Allocate(DType::kF32, 1, grads.size());
      ASSERT_TRUE(src.ok() && wire.ok() && back.ok());
      ASSERT_TRUE(backend.Upload(grads.data(), *src).ok());
      ASSERT_TRUE(backend.CompressGradients(*src, 2.0f, *wire).ok());
      ASSERT_TRUE(backend.Cast(*wire, *back).ok());
      results[b].resize(grads.size());
      ASSERT_TRUE(backend.Download(*back, results[b].data()).ok());
    }
    for (size_t i = 0; i < grads.size(); ++i) {
      const float expected = RoundTo(dtype, RoundTo(dtype, grads[i]) / 2.0f);
      ASSERT_EQ(results[0][i], expected) << i;
      ASSERT_EQ(results[1][i], expected) << i;
    }
  }
}

// MSE's value and gradient from one pass (the 16-bit, aligned, n % 8 == 0 case) must equal the
// two kernels it replaces bit for bit; other sizes take the two kernels.
TEST(CudaBackend, SquaredErrorAndGradient_EqualsTheSeparateKernelsBitForBit) {
  REQUIRE_GPUS(1);
  auto gpu = SingleRankBackend();
  ASSERT_NE(gpu, nullptr);
  std::mt19937 generator(11);
  std::normal_distribution<float> normal;
  StepState initial;
  initial.scale = 65536.0f;
  auto state = gpu->AllocateStepState(initial);
  ASSERT_TRUE(state.ok());
  // More than one grid-stride pass, the last one partial (264 blocks × 256 threads × 16).
  for (int64_t n : {int64_t{1'500'008}, int64_t{4096}, int64_t{1003}}) {
    std::vector<float> a(n), b(n);
    for (int64_t i = 0; i < n; ++i) {
      a[i] = 4.0f * normal(generator);
      b[i] = normal(generator);
    }
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      std::vector<float> losses[2], grads[2];
      for (int fused = 0; fused < 2; ++fused) {
        auto a_t = gpu->Allocate(dtype, 1, n);
        auto b_t = gpu->Allocate(DType::kF32, 1, n);
        auto out = gpu->Allocate(dtype, 1, n);
        auto acc = gpu->Allocate(DType::kF32, 1, 1);
        ASSERT_TRUE(a_t.ok() && b_t.ok() && out.ok() && acc.ok());
        ASSERT_TRUE(gpu->Upload(a.data(), *a_t).ok());
        ASSERT_TRUE(gpu->Upload(b.data(), *b_t).ok());
        const double divide_by = static_cast<double>(n);
        const float coef = static_cast<float>(2.0 / divide_by);
        if (fused == 1) {
          ASSERT_TRUE(gpu->SquaredErrorAndGradient(*a_t, *b_t, divide_by, 4.0f, *acc, coef,
                                                   *state, 4.0f, *out)
                          .ok());
        } else {
          ASSERT_TRUE(gpu->SumSquaredDifference(*a_t, *b_t, divide_by, 4.0f, *acc).ok());
          ASSERT_TRUE(gpu->ScaledDifference(*a_t, *b_t, coef, *state, 4.0f, *out).ok());
        }
        losses[fused].resize(1);
        grads[fused].resize(n);
        ASSERT_TRUE(gpu->Download(*acc, losses[fused].data()).ok());
        ASSERT_TRUE(gpu->Download(*out, grads[fused].data()).ok());
      }
      EXPECT_GT(losses[0][0], 0.0f);
      EXPECT_EQ(losses[1][0], losses[0][0]) << "n " << n;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(grads[1][i], grads[0][i]) << "n " << n << " element " << i;
      }
    }
  }
}

// SGD without momentum leaves the momentum buffer out of the update: the same parameters as
// an update that reads and writes it.
TEST(CudaBackend, UpdateParameters_SgdWithoutMomentum_SameWithoutTheBuffer) {
  REQUIRE_GPUS(1);
  auto gpu = SingleRankBackend();
  ASSERT_NE(gpu, nullptr);
  const int64_t n = 10'000;
  std::vector<float> params(n), grads(n);
  std::mt19937 generator(12);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < n; ++i) {
    params[i] = normal(generator);
    grads[i] = 1024.0f * normal(generator);
  }
  StepState initial;
  initial.scale = 1024.0f;
  initial.last_scale = 1024.0f;
  initial.clip_coef = 1.0f;
  auto state = gpu->AllocateStepState(initial);
  ASSERT_TRUE(state.ok());
  UpdateRule rule;
  rule.lr = 0.01;
  std::vector<float> results[2];
  for (int with_buffer = 0; with_buffer < 2; ++with_buffer) {
    auto p = gpu->Allocate(DType::kF32, 1, n);
    auto g = gpu->Allocate(DType::kF32, 1, n);
    auto momentum = gpu->Allocate(DType::kF32, 1, n);
    auto low = gpu->Allocate(DType::kF16, 1, n);
    ASSERT_TRUE(p.ok() && g.ok() && momentum.ok() && low.ok());
    ASSERT_TRUE(gpu->Upload(params.data(), *p).ok());
    ASSERT_TRUE(gpu->Upload(grads.data(), *g).ok());
    ASSERT_TRUE(gpu->UpdateParameters(rule, *p, *g, with_buffer ? *momentum : Tensor{}, Tensor{},
                                      *state, *low)
                    .ok());
    results[with_buffer].resize(n);
    ASSERT_TRUE(gpu->Download(*p, results[with_buffer].data()).ok());
  }
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(results[0][i], results[1][i]) << i;
    ASSERT_NE(results[0][i], params[i]) << i;
  }
}

// The mlp8k-like path: the last layer's weight gradient in row chunks (strided dy) must give
// the gradients of the whole-layer computation.
TEST(CudaBackward, LargeLastLayerInChunks_MatchesWholeLayer) {
  REQUIRE_GPUS(1);
  ModelConfig model;
  model.widths = {8192, 4096};
  const int64_t batch = 64;
  auto gpu = SingleRankBackend();
  auto mlp = Mlp::Create(gpu.get(), model, DType::kF16, batch);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  const int64_t n = (*mlp)->layout().total;
  std::mt19937 generator(2);
  std::normal_distribution<float> normal;
  std::vector<float> params(n), x(batch * 8192), y(batch * 4096);
  for (float& v : params) v = 0.01f * normal(generator);
  for (float& v : x) v = normal(generator);
  for (float& v : y) v = normal(generator);
  Tensor tx = *gpu->Allocate(DType::kF32, batch, 8192);
  Tensor ty = *gpu->Allocate(DType::kF32, batch, 4096);
  StepState unit;
  unit.scale = 1024;
  StepStateBuffer state = *gpu->AllocateStepState(unit);
  ASSERT_TRUE(gpu->Upload(params.data(), (*mlp)->params()).ok());
  ASSERT_TRUE(gpu->Upload(x.data(), tx).ok());
  ASSERT_TRUE(gpu->Upload(y.data(), ty).ok());
  ASSERT_TRUE((*mlp)->RefreshLowPrecisionWeights().ok());
  auto gradients = [&](const GradientReducer::SpanReady& hook) {
    EXPECT_TRUE(gpu->Zero((*mlp)->grads()).ok());
    EXPECT_TRUE((*mlp)->Forward(tx).ok());
    EXPECT_TRUE(MseLoss(gpu.get(), 4096, 1).Backward((*mlp)->output(), ty, state, (*mlp)->metrics(),
                                                     (*mlp)->output_grad()).ok());
    std::unique_ptr<GradientReducer> reducer;
    if (hook) reducer = *GradientReducer::Create((*mlp)->table(), (*mlp)->accumulator(), hook);
    EXPECT_TRUE((*mlp)->Backward(0, reducer.get()).ok());
    std::vector<float> grads(n + 2);
    EXPECT_TRUE(gpu->Download((*mlp)->grads(), grads.data()).ok());
    return grads;
  };
  const std::vector<float> whole = gradients({});
  int spans = 0;
  const std::vector<float> chunked = gradients([&](Tensor) {
    ++spans;
    return absl::OkStatus();
  });
  EXPECT_EQ(spans, 3);
  EXPECT_LT(RelativeError(chunked, whole), 1e-3);
}

// On the GPU too, deferred accumulation (per-micro-batch fp16 gradients summed on the last
// micro-batch) must equal adding each micro-batch's gradients as it comes.
TEST(CudaBackward, DeferredAccumulation_IsBitIdenticalToIncremental) {
  REQUIRE_GPUS(1);
  ModelConfig model;
  model.widths = {512, 256, 64};
  const int64_t batch = 32, accumulation = 4;
  std::vector<std::vector<float>> results;
  for (int64_t budget : {int64_t{0}, Mlp::kDeferredBudgetBytes}) {
    auto gpu = SingleRankBackend();
    auto mlp = Mlp::Create(gpu.get(), model, DType::kF16, batch, accumulation, budget);
    ASSERT_TRUE(mlp.ok());
    ASSERT_EQ((*mlp)->defers_accumulation(), budget > 0);
    std::mt19937 generator(5);
    std::normal_distribution<float> normal;
    std::vector<float> params((*mlp)->layout().total);
    for (float& v : params) v = 0.05f * normal(generator);
    ASSERT_TRUE(gpu->Upload(params.data(), (*mlp)->params()).ok());
    ASSERT_TRUE((*mlp)->RefreshLowPrecisionWeights().ok());
    StepState unit;
    unit.scale = 4096;
    StepStateBuffer state = *gpu->AllocateStepState(unit);
    Tensor x = *gpu->Allocate(DType::kF32, batch, 512);
    Tensor y = *gpu->Allocate(DType::kF32, batch, 64);
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      std::vector<float> xs(batch * 512), ys(batch * 64);
      for (float& v : xs) v = normal(generator);
      for (float& v : ys) v = normal(generator);
      ASSERT_TRUE(gpu->Upload(xs.data(), x).ok());
      ASSERT_TRUE(gpu->Upload(ys.data(), y).ok());
      ASSERT_TRUE((*mlp)->Forward(x).ok());
      ASSERT_TRUE(MseLoss(gpu.get(), 64, accumulation)
                      .Backward((*mlp)->output(), y, state, (*mlp)->metrics(),
                                (*mlp)->output_grad()).ok());
      ASSERT_TRUE((*mlp)->Backward(micro).ok());
    }
    std::vector<float> grads((*mlp)->layout().total + 2);
    ASSERT_TRUE(gpu->Download((*mlp)->grads(), grads.data()).ok());
    results.push_back(grads);
  }
  EXPECT_EQ(results[0], results[1]);
}

// Steps recorded once as a CUDA graph and replayed (TrainingConfig::record_steps) must do
// exactly what the same steps issued op by op do: the same parameters bit for bit, the same
// telemetry, the same skips and scale trajectory — with the learning rate changing every step
// (warm-up then cosine: set on the device per replay), Adam's bias corrections (read on the
// device), fp16 overflow skips (init scale 2^40) and, on two GPUs, the NCCL allreduce inside
// the graph. Op by op is what the parity tests hold against PyTorch.
TrainingConfig RecordedStepsConfig(DType dtype, OptimizerType optimizer) {
  TrainingConfig config = MlpSpec(dtype == DType::kF16   ? v1::FP16
                                  : dtype == DType::kBF16 ? v1::BF16
                                                          : v1::FP32,
                                  std::ldexp(1.0, 40));
  config.optimizer.type = optimizer;
  config.optimizer.lr = 0.003;
  config.optimizer.weight_decay = 0.01;
  config.lr_schedule.type = ScheduleType::kWarmupCosine;
  config.lr_schedule.warmup_steps = 5;
  config.lr_schedule.min_lr = 0.0003;
  config.loss_scaler.growth_interval = 4;
  return config;
}

TEST(RecordedSteps, OneGpu_ReplaysAreBitIdenticalToStepsIssuedOpByOp) {
  REQUIRE_GPUS(1);
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
    for (OptimizerType optimizer : {OptimizerType::kAdamW, OptimizerType::kSgd}) {
      SCOPED_TRACE(absl::StrCat("dtype ", static_cast<int>(dtype), " optimizer ",
                                static_cast<int>(optimizer)));
      TrainingConfig config = RecordedStepsConfig(dtype, optimizer);
      NullObserver replayed_observer, issued_observer;
      auto replaying = SingleRankBackend();
      absl::StatusOr<TrainingResult> replayed =
          RunTraining(config, 0, replaying.get(), &replayed_observer);
      config.record_steps = false;
      auto issuing = SingleRankBackend();
      absl::StatusOr<TrainingResult> issued =
          RunTraining(config, 0, issuing.get(), &issued_observer);
      ASSERT_TRUE(replayed.ok()) << replayed.status();
      ASSERT_TRUE(issued.ok()) << issued.status();
      EXPECT_EQ(replayed->replayed_steps, config.steps - 1) << "the first step runs op by op";
      EXPECT_EQ(issued->replayed_steps, 0);
      if (dtype == DType::kF16) {
        EXPECT_GT(issued->skipped_steps, 0);
      }
      EXPECT_EQ(replayed->skipped_steps, issued->skipped_steps);
      EXPECT_EQ(replayed->final_loss_scale, issued->final_loss_scale);
      EXPECT_EQ(replayed->parameters, issued->parameters);
      ASSERT_EQ(replayed_observer.records.size(), issued_observer.records.size());
      for (size_t i = 0; i < issued_observer.records.size(); ++i) {
        const StepTelemetry& a = replayed_observer.records[i];
        const StepTelemetry& b = issued_observer.records[i];
        EXPECT_EQ(a.loss, b.loss) << "step " << i + 1;
        EXPECT_TRUE(a.grad_norm == b.grad_norm || (std::isnan(a.grad_norm) && std::isnan(b.grad_norm)))
            << "step " << i + 1;
        EXPECT_EQ(a.loss_scale, b.loss_scale) << "step " << i + 1;
        EXPECT_EQ(a.skipped, b.skipped) << "step " << i + 1;
        EXPECT_EQ(a.lr, b.lr) << "step " << i + 1;
      }
    }
  }
}

TEST(RecordedSteps, TwoGpus_ReplaysWithTheAllreduceInside_AreBitIdentical) {
  REQUIRE_GPUS(2);
  TrainingConfig config = RecordedStepsConfig(DType::kF16, OptimizerType::kAdam);
  config.world_size = 2;
  std::array<absl::StatusOr<TrainingResult>, 2> replayed = TrainOnTwoGpus(config);
  config.record_steps = false;
  std::array<absl::StatusOr<TrainingResult>, 2> issued = TrainOnTwoGpus(config);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(replayed[rank].ok()) << replayed[rank].status();
    ASSERT_TRUE(issued[rank].ok()) << issued[rank].status();
    EXPECT_EQ(replayed[rank]->replayed_steps, config.steps - 1);
    EXPECT_EQ(replayed[rank]->parameters, issued[rank]->parameters) << "rank " << rank;
    EXPECT_EQ(replayed[rank]->skipped_steps, issued[rank]->skipped_steps);
    EXPECT_EQ(replayed[rank]->final_loss_scale, issued[rank]->final_loss_scale);
  }
  EXPECT_GT(issued[0]->skipped_steps, 0);
  EXPECT_EQ(replayed[0]->checksum, replayed[1]->checksum);
}

// With several lanes (as between nodes) a small model's buckets all go on lane 0: the other
// lanes take no part in the recorded step, and must not be joined into it (waiting on an event
// recorded outside a capture invalidates it).
TEST(RecordedSteps, TwoGpus_ThreeLanes_BucketsOnOneLane_AreRecordedAndBitIdentical) {
  REQUIRE_GPUS(2);
  TrainingConfig config = RecordedStepsConfig(DType::kF16, OptimizerType::kSgd);
  config.world_size = 2;
  std::array<absl::StatusOr<TrainingResult>, 2> replayed = TrainOnTwoGpus(config, 3);
  config.record_steps = false;
  std::array<absl::StatusOr<TrainingResult>, 2> issued = TrainOnTwoGpus(config, 3);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(replayed[rank].ok()) << replayed[rank].status();
    ASSERT_TRUE(issued[rank].ok()) << issued[rank].status();
    EXPECT_EQ(replayed[rank]->replayed_steps, config.steps - 1);
    EXPECT_EQ(replayed[rank]->parameters, issued[rank]->parameters) << "rank " << rank;
  }
}

// A rank whose peer is gone while steps are replayed must still stop at once when told to.
// NCCL's abort does not return while a CUDA graph that captured the communicator exists, so
// the backend destroys its recorded step first: without that, the rank hung in ncclCommAbort
// (seen on 2xH200 in scripts/gpu_fault_demo.sh: the worker's forced exit 3 s later ended it).
// Here rank 1 stops after 50 steps (its collective aborts, as a dead peer's would never answer);
// rank 0 is then stopped 1 s later and must return ABORTED within a few seconds.
// Waits until `done` or `seconds` have passed. A rank thread stuck in NCCL cannot be joined:
// on the deadline the test fails loudly and exits rather than hang the suite.
void AwaitOrExit(const std::atomic<bool>& done, double seconds, const char* failure) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(seconds));
  while (!done && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done) return;
  std::fprintf(stderr, "FAILED: %s\n", failure);
  std::fflush(stderr);
  std::_Exit(1);
}

class StopAfter : public TrainingObserver {
 public:
  StopAfter(int64_t steps, StopToken* stop) : steps_(steps), stop_(stop) {}
  void OnStep(int64_t step, const StepTelemetry*) override {
    last_step = step;
    if (steps_ > 0 && step >= steps_) stop_->RequestStop("test: this rank died");
  }
  bool ShouldStop() override { return false; }
  std::atomic<int64_t> last_step{0};

 private:
  int64_t steps_;
  StopToken* stop_;
};

TEST(RecordedSteps, TwoGpus_APeerGoneDuringReplays_TheRankStillStopsAtOnce) {
  REQUIRE_GPUS(2);
  TrainingConfig config = RecordedStepsConfig(DType::kF16, OptimizerType::kSgd);
  config.world_size = 2;
  config.steps = 100'000'000;
  InMemoryKeyValueStore store;
  StopToken stops[2];
  StopAfter observers[2] = {StopAfter(0, &stops[0]), StopAfter(50, &stops[1])};
  absl::StatusOr<TrainingResult> results[2];
  std::atomic<bool> done[2] = {false, false};
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      auto backend = TwoGpuRank(rank, &store, /*lanes=*/0, &stops[rank]);
      if (!backend.ok()) {
        results[rank] = backend.status();
      } else {
        results[rank] = RunTraining(config, rank, backend->get(), &observers[rank]);
        backend->reset();  // The teardown is part of stopping.
      }
      done[rank] = true;
    });
  }
  AwaitOrExit(done[1], 30, "rank 1 did not stop within 30 s of its own stop request");
  std::this_thread::sleep_for(std::chrono::seconds(1));  // Rank 0 now waits on a gone peer.
  EXPECT_FALSE(done[0]) << "rank 0 ended although its peer is gone: " << results[0].status();
  const auto stopped_at = std::chrono::steady_clock::now();
  stops[0].RequestStop("test: the worker stopped this rank");
  AwaitOrExit(done[0], 20, "rank 0 did not stop within 20 s of its stop request");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  for (auto& rank : ranks) rank.join();
  EXPECT_GT(observers[1].last_step.load(), 5) << "rank 1 replayed steps before it stopped";
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kAborted) << results[0].status();
  EXPECT_LT(seconds, 3.0) << "rank 0 took " << seconds << " s to stop";
}

// A stop while a step is being recorded (the capture not ended yet, both lanes' streams forked
// into it by a striped allreduce): the collective's abort ends the capture first, then aborts
// the lanes; the rank's calls return ABORTED at once and its teardown does not hang.
TEST(RecordedSteps, TwoGpus_AStopWhileAStepIsRecorded_EndsAtOnce) {
  REQUIRE_GPUS(2);
  InMemoryKeyValueStore store;
  StopToken stops[2];
  absl::Status outcomes[2];
  double seconds[2] = {0, 0};
  std::atomic<bool> done[2] = {false, false};
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      auto backend = TwoGpuRank(rank, &store, /*lanes=*/2, &stops[rank]);
      if (!backend.ok()) {
        outcomes[rank] = backend.status();
        done[rank] = true;
        return;
      }
      Collective* collective = (*backend)->collective();
      Tensor buffer = *(*backend)->Allocate(DType::kF32, 1, int64_t{4} << 20);  // Two stripes.
      absl::Status status = (*backend)->Zero(buffer);
      if (status.ok()) status = (*backend)->BeginStepRecording();
      if (status.ok()) status = collective->AllReduceMeanAsync(buffer);
      const auto stopped_at = std::chrono::steady_clock::now();
      stops[rank].RequestStop("test: stopped while a step is recorded");
      if (status.ok()) status = collective->AllReduceMeanAsync(buffer);
      (void)(*backend)->EndStepRecording();
      backend->reset();
      seconds[rank] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
      outcomes[rank] = status;
      done[rank] = true;
    });
  }
  for (int rank = 0; rank < 2; ++rank) {
    AwaitOrExit(done[rank], 90, "a rank stopped while recording did not end within 90 s");
  }
  for (auto& rank : ranks) rank.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(outcomes[rank].code(), absl::StatusCode::kAborted) << outcomes[rank];
    EXPECT_LT(seconds[rank], 5.0) << "rank " << rank;
  }
}

}  // namespace
}  // namespace mptrain::cuda
