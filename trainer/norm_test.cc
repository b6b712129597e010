// Normalization layers (README "Normalization layers"): the norm math against finite
// differences and its defining properties on the CPU backend, and sync_batch_norm on two gloo
// ranks against one rank that sees both ranks' micro-batches concatenated.

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gloo_collective.h"
#include "gtest/gtest.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "tests/fake_collectives.h"
#include "trainer/checkpoint.h"
#include "trainer/loss/mse.h"
#include "trainer/mlp.h"
#include "trainer/mse_probe.h"
#include "trainer/norm_math.h"
#include "trainer/parameter_layout.h"
#include "trainer/train_loop.h"

namespace mptrain {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

// ---- Gradient check: every parameter's gradient (Linear and norm) against central finite
// differences of the forward loss, in fp32.

struct NormCase {
  NormKind norm;
  ActivationKind activation;
  unsigned seed;  // Keeps every ReLU input away from its kink (checked below).
};

class NormGradientCheck : public ::testing::TestWithParam<NormCase> {};

TEST_P(NormGradientCheck, BackwardMatchesFiniteDifferences) {
  ModelConfig model;
  model.widths = {5, 7, 6, 3};
  model.activation = GetParam().activation;
  model.norm = GetParam().norm;
  const int64_t batch = 6;
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  auto mlp = Mlp::Create(&backend, model, DType::kF32, batch);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  const ParameterLayout& layout = (*mlp)->layout();
  const int64_t n = layout.total;
  ASSERT_TRUE(layout.layers[0].has_norm() && layout.layers[1].has_norm());
  ASSERT_FALSE(layout.layers[2].has_norm()) << "the output Linear has no norm";

  std::mt19937 generator(GetParam().seed);
  std::normal_distribution<float> normal;
  std::vector<float> params(n), x(batch * 5), y(batch * 3);
  for (float& v : params) v = 0.5f * normal(generator);
  // Norm weights around 1 and biases around 0, as after some training.
  for (const LayerLayout& l : layout.layers) {
    for (int64_t i = 0; i < l.norm_features; ++i) {
      params[l.norm_weight_offset + i] = 1.0f + 0.3f * normal(generator);
      params[l.norm_bias_offset + i] = 0.3f * normal(generator);
    }
  }
  for (float& v : x) v = normal(generator);
  for (float& v : y) v = normal(generator);
  testing::MseProbe probe(&backend, mlp->get(), x, y);
  ASSERT_TRUE(probe.ok());

  auto loss_at = [&](const std::vector<float>& p, std::vector<float>* grads) {
    return probe.LossAt(p, grads);
  };

  std::vector<float> analytic;
  loss_at(params, &analytic);
  // Finite differences across a ReLU's kink are meaningless: the case's seed keeps every norm
  // output away from 0 (seeds 7 and 8 put one within 1e-3 of it).
  for (size_t layer = 0; layer < 2 && model.activation == ActivationKind::kRelu; ++layer) {
    std::vector<float> zn(batch * layout.layers[layer].out);
    ASSERT_TRUE(backend.Download((*mlp)->norm_output(layer), zn.data()).ok());
    for (float v : zn) ASSERT_GT(std::fabs(v), 2e-3f) << "pick another seed";
  }
  // Small enough that no ReLU input crosses its kink (a layer norm's outputs sit near 0).
  const float eps = 1e-3f;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> plus = params, minus = params;
    plus[i] += eps;
    minus[i] -= eps;
    const double numeric = (loss_at(plus, nullptr) - loss_at(minus, nullptr)) / (2 * eps);
    EXPECT_NEAR(analytic[i], numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Norms, NormGradientCheck,
    ::testing::Values(NormCase{NormKind::kLayerNorm, ActivationKind::kRelu, 11},
                      NormCase{NormKind::kLayerNorm, ActivationKind::kGelu, 7},
                      NormCase{NormKind::kBatchNorm, ActivationKind::kRelu, 12},
                      NormCase{NormKind::kBatchNorm, ActivationKind::kGelu, 7},
                      // One rank: sync_batch_norm is batch_norm (through the collective).
                      NormCase{NormKind::kSyncBatchNorm, ActivationKind::kGelu, 7}));

// ---- The batch-norm primitives against their definitions (double precision).

TEST(BatchNormPrimitives, AConstantFeature_NeverDrivesTheRunningVarianceBelowZero) {
  // Variance 0: invstd = f32(1/sqrt(eps)) rounds up, and torch's recovery gives about -8e-13.
  const float invstd = InverseStd(0.0, kNormEps);
  ASSERT_LT(1.0 / (static_cast<double>(invstd) * invstd) - kNormEps, 0.0) << "the premise";
  BatchStatisticsCombination combined;
  combined.Add(2.5f, invstd, 8, kNormEps);
  combined.Add(2.5f, invstd, 8, kNormEps);
  EXPECT_EQ(combined.BiasedVariance(), 0.0);
  float running_var = 1.0f;
  for (int step = 0; step < 1000; ++step) {
    running_var = RunningUpdate(running_var, combined.UnbiasedVariance(), kBatchNormMomentum);
  }
  EXPECT_GE(running_var, 0.0f) << "after 1000 forwards of a constant feature";
}

TEST(BatchNormPrimitives, StatisticsOfHalvesCombineToTheWhole_AndUpdateTheRunningEstimates) {
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  const int64_t rows = 10, cols = 3;
  std::mt19937 generator(5);
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 3.0f * normal(generator) + (i % cols);
  auto xt = *backend.Allocate(DType::kF32, rows, cols);
  ASSERT_TRUE(backend.Upload(x.data(), xt).ok());
  // Rows 0-3 and 4-9 as two "ranks" (unequal counts, as torch's counts allow).
  auto gathered = *backend.Allocate(DType::kF32, 2, 2 * cols + 1);
  ASSERT_TRUE(backend.BatchNormStatistics(xt.RowSlice(0, 4), kNormEps, gathered.RowSlice(0, 1)).ok());
  ASSERT_TRUE(backend.BatchNormStatistics(xt.RowSlice(4, 6), kNormEps, gathered.RowSlice(1, 1)).ok());
  auto running = *backend.Allocate(DType::kF32, 2, cols);
  std::vector<float> initial = {0.5f, -1.0f, 2.0f, 1.0f, 3.0f, 0.25f};
  ASSERT_TRUE(backend.Upload(initial.data(), running).ok());
  auto mean_invstd = *backend.Allocate(DType::kF32, 2, cols);
  ASSERT_TRUE(backend.BatchNormCombineStatistics(gathered, kNormEps, kBatchNormMomentum, running,
                                                 mean_invstd).ok());
  std::vector<float> stats(2 * cols), run(2 * cols);
  ASSERT_TRUE(backend.Download(mean_invstd, stats.data()).ok());
  ASSERT_TRUE(backend.Download(running, run.data()).ok());
  for (int64_t c = 0; c < cols; ++c) {
    double mean = 0, squares = 0;
    for (int64_t r = 0; r < rows; ++r) mean += x[r * cols + c];
    mean /= rows;
    for (int64_t r = 0; r < rows; ++r) squares += std::pow(x[r * cols + c] - mean, 2);
    EXPECT_NEAR(stats[c], mean, 1e-6 * (1 + std::fabs(mean)));
    EXPECT_NEAR(stats[cols + c], 1 / std::sqrt(squares / rows + 1e-5), 1e-6 * stats[cols + c]);
    EXPECT_NEAR(run[c], 0.9 * initial[c] + 0.1 * mean, 1e-6);
    // The running variance takes the unbiased variance.
    const double expected_var = 0.9 * initial[cols + c] + 0.1 * squares / (rows - 1);
    EXPECT_NEAR(run[cols + c], expected_var, 1e-6 * expected_var);
  }
}

// ---- Training runs.

// MLP 6 -> 8 -> 7 -> 3 with `norm`, npy data, fp32, SGD with momentum.
TrainingConfig NormConfig(NormKind norm, const std::string& x, const std::string& y) {
  TrainingConfig config;
  config.world_size = 1;
  config.model.widths = {6, 8, 7, 3};
  config.model.activation = ActivationKind::kGelu;
  config.model.norm = norm;
  config.data.source = DataConfig::Source::kNpy;
  config.data.features_path = x;
  config.data.targets_path = y;
  config.micro_batch_size = 4;
  config.accumulation_steps = 3;
  config.steps = 4;
  config.compute_dtype = DType::kF32;
  config.loss_scaler.enabled = false;
  config.optimizer.lr = 0.1;
  config.optimizer.momentum = 0.9;
  return config;
}

class RecordingObserver : public TrainingObserver {
 public:
  void OnStep(int64_t, const StepTelemetry* record) override {
    if (record != nullptr) records.push_back(*record);
  }
  bool ShouldStop() override { return false; }
  std::vector<StepTelemetry> records;
};

struct RankRun {
  absl::StatusOr<TrainingResult> result;
  std::vector<StepTelemetry> records;
  int gradient_allreduces = 0;
  int norm_collectives = 0;
  int broadcasts = 0;
};

// Runs `world` ranks over gloo (each wrapped in a counting collective), or one rank alone.
std::vector<RankRun> Train(const TrainingConfig& config, int world,
                           const std::string& resume = "") {
  std::vector<RankRun> runs(world);
  InMemoryKeyValueStore store;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      std::unique_ptr<Collective> inner;
      if (world == 1) {
        inner = std::make_unique<testing::SingleRankCollective>();
      } else {
        auto gloo = GlooCollective::Connect(rank, world, "127.0.0.1", &store, 30'000);
        if (!gloo.ok()) {
          runs[rank].result = gloo.status();
          return;
        }
        inner = std::move(*gloo);
      }
      auto counting = std::make_unique<testing::CountingCollective>(std::move(inner));
      testing::CountingCollective* counter = counting.get();
      CpuBackend backend(std::move(counting));
      RecordingObserver observer;
      runs[rank].result = RunTraining(config, rank, &backend, &observer, resume);
      runs[rank].records = observer.records;
      runs[rank].gradient_allreduces = counter->calls();
      runs[rank].norm_collectives = counter->norm_calls();
      runs[rank].broadcasts = counter->broadcasts();
    });
  }
  for (auto& thread : threads) thread.join();
  return runs;
}

double RelativeL2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += std::pow(static_cast<double>(a[i]) - b[i], 2);
    norm += std::pow(static_cast<double>(b[i]), 2);
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// Rank r of 2 takes rows [r·S, (r+1)·S) in micro-batches of B; the single rank's file puts,
// for each micro-batch m, rank 0's rows of m then rank 1's: its micro-batch of 2B is the
// concatenation of the two ranks' m-th micro-batches.
struct ConcatenatedData {
  std::string two_x, two_y, one_x, one_y;
};

ConcatenatedData WriteConcatenatedData(const std::string& name, int64_t micro_batches,
                                       int64_t batch, int64_t in, int64_t out) {
  std::mt19937 generator(21);
  std::normal_distribution<float> normal;
  const int64_t shard = micro_batches * batch, rows = 2 * shard;
  NpyMatrix x{rows, in, std::vector<float>(rows * in)};
  NpyMatrix y{rows, out, std::vector<float>(rows * out)};
  // Different data per rank: rank 1's features are shifted and scaled, so per-rank statistics
  // differ from the global ones.
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < in; ++c) {
      x.values[r * in + c] = r < shard ? normal(generator) : 2.0f * normal(generator) + 1.5f;
    }
    for (int64_t c = 0; c < out; ++c) y.values[r * out + c] = normal(generator);
  }
  NpyMatrix x1 = x, y1 = y;
  for (int64_t m = 0; m < micro_batches; ++m) {
    for (int64_t rank = 0; rank < 2; ++rank) {
      for (int64_t i = 0; i < batch; ++i) {
        const int64_t from = rank * shard + m * batch + i;
        const int64_t to = m * 2 * batch + rank * batch + i;
        std::copy_n(x.values.begin() + from * in, in, x1.values.begin() + to * in);
        std::copy_n(y.values.begin() + from * out, out, y1.values.begin() + to * out);
      }
    }
  }
  ConcatenatedData files{TempPath(name + "_two_x.npy"), TempPath(name + "_two_y.npy"),
                         TempPath(name + "_one_x.npy"), TempPath(name + "_one_y.npy")};
  EXPECT_TRUE(WriteNpyMatrix(files.two_x, x).ok());
  EXPECT_TRUE(WriteNpyMatrix(files.two_y, y).ok());
  EXPECT_TRUE(WriteNpyMatrix(files.one_x, x1).ok());
  EXPECT_TRUE(WriteNpyMatrix(files.one_y, y1).ok());
  return files;
}

// The defining property of SyncBatchNorm, with gradient accumulation (no_sync micro-batches):
// two ranks equal one rank that sees both ranks' micro-batches concatenated — per-step loss,
// running statistics and final parameters, within fp32 rounding.
TEST(SyncBatchNorm, TwoGlooRanks_EqualOneRankSeeingBothMicroBatches) {
  TrainingConfig two = NormConfig(NormKind::kSyncBatchNorm, "", "");
  const ConcatenatedData data =
      WriteConcatenatedData("sync", two.steps * two.accumulation_steps, two.micro_batch_size,
                            two.model.widths.front(), two.model.widths.back());
  two.world_size = 2;
  two.data.features_path = data.two_x;
  two.data.targets_path = data.two_y;
  two.steps = 4;
  TrainingConfig one = two;
  one.world_size = 1;
  one.micro_batch_size = 2 * two.micro_batch_size;
  one.data.features_path = data.one_x;
  one.data.targets_path = data.one_y;

  std::vector<RankRun> ranks = Train(two, 2);
  std::vector<RankRun> single = Train(one, 1);
  ASSERT_TRUE(ranks[0].result.ok()) << ranks[0].result.status();
  ASSERT_TRUE(ranks[1].result.ok()) << ranks[1].result.status();
  ASSERT_TRUE(single[0].result.ok()) << single[0].result.status();

  ASSERT_EQ(ranks[0].records.size(), single[0].records.size());
  for (size_t s = 0; s < single[0].records.size(); ++s) {
    const double a = ranks[0].records[s].loss, b = single[0].records[s].loss;
    EXPECT_NEAR(a, b, 1e-6 * std::fabs(b)) << "step " << s + 1;
  }
  // Running statistics: identical on both ranks (bit for bit), equal to the single rank's.
  EXPECT_EQ(ranks[0].result->buffers, ranks[1].result->buffers);
  EXPECT_LT(RelativeL2(ranks[0].result->buffers, single[0].result->buffers), 1e-6);
  EXPECT_EQ(ranks[0].result->parameters, ranks[1].result->parameters);
  const double param_diff = RelativeL2(ranks[0].result->parameters, single[0].result->parameters);
  EXPECT_LT(param_diff, 1e-5);

  // Gradient allreduces only on the stepping micro-batch (a small model: one bucket per step);
  // the norm's collectives on every micro-batch, no_sync ones too: per hidden layer, one
  // all-gather in the forward and one sum in the backward.
  const int hidden = static_cast<int>(two.model.widths.size()) - 2;
  for (const RankRun& rank : ranks) {
    EXPECT_EQ(rank.gradient_allreduces, two.steps) << "none on no_sync micro-batches";
    EXPECT_EQ(rank.norm_collectives, two.steps * two.accumulation_steps * hidden * 2);
    EXPECT_EQ(rank.broadcasts, 0) << "sync_batch_norm's buffers need no broadcast";
  }

  // Without the synchronisation (local batch norm, each rank its own statistics) the same
  // run ends elsewhere: the property above is not a coincidence of the data.
  TrainingConfig local = two;
  local.model.norm = NormKind::kBatchNorm;
  std::vector<RankRun> local_ranks = Train(local, 2);
  ASSERT_TRUE(local_ranks[0].result.ok()) << local_ranks[0].result.status();
  EXPECT_GT(RelativeL2(local_ranks[0].result->parameters, single[0].result->parameters), 1e-3);
}

// A local batch norm keeps each rank's own running statistics (its own data); DDP's
// broadcast_buffers copies rank 0's at the start of every step, so after the last step's
// micro-batches they differ again. Parameters stay identical (gradients are averaged).
TEST(BatchNorm, LocalStatisticsDifferPerRank_WhileSyncBatchNormsAreIdentical) {
  TrainingConfig config = NormConfig(NormKind::kBatchNorm, "", "");
  const ConcatenatedData data =
      WriteConcatenatedData("local", config.steps * config.accumulation_steps,
                            config.micro_batch_size, config.model.widths.front(),
                            config.model.widths.back());
  config.world_size = 2;
  config.data.features_path = data.two_x;
  config.data.targets_path = data.two_y;
  std::vector<RankRun> local = Train(config, 2);
  ASSERT_TRUE(local[0].result.ok()) << local[0].result.status();
  ASSERT_TRUE(local[1].result.ok()) << local[1].result.status();
  EXPECT_EQ(local[0].result->parameters, local[1].result->parameters);
  EXPECT_GT(RelativeL2(local[0].result->buffers, local[1].result->buffers), 1e-2);
  for (const RankRun& rank : local) {
    EXPECT_EQ(rank.norm_collectives, 0);
    EXPECT_EQ(rank.broadcasts, config.steps) << "rank 0's buffers before each step";
    EXPECT_EQ(rank.gradient_allreduces, config.steps);
  }
  config.model.norm = NormKind::kSyncBatchNorm;
  std::vector<RankRun> sync = Train(config, 2);
  ASSERT_TRUE(sync[0].result.ok()) << sync[0].result.status();
  EXPECT_EQ(sync[0].result->buffers, sync[1].result->buffers);
}

// Checkpoints hold the norms' parameters and the running statistics under torch's names (after
// the README's map); a resumed run is bit-identical, running statistics included.
TEST(BatchNorm, ResumeFromCheckpoint_IsBitIdenticalWithRunningStatistics) {
  TrainingConfig config = NormConfig(NormKind::kSyncBatchNorm, "", "");
  const ConcatenatedData data = WriteConcatenatedData("resume", 40, 4, 6, 3);
  config.world_size = 2;
  config.data.features_path = data.two_x;
  config.data.targets_path = data.two_y;
  config.steps = 6;
  config.checkpoint_every = 3;
  config.checkpoint_dir = TempPath("");
  config.overwrite_output = true;
  config.output_checkpoint = TempPath("norm_final.safetensors");
  std::vector<RankRun> whole = Train(config, 2);
  ASSERT_TRUE(whole[0].result.ok()) << whole[0].result.status();

  const std::string checkpoint = CheckpointPath(config.checkpoint_dir, 3);
  auto tensors = ReadSafetensors(checkpoint);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  for (const char* name :
       {"layers.0.weight", "norms.0.weight", "norms.0.bias", "norms.0.running_mean",
        "norms.0.running_var", "norms.0.num_batches_tracked", "norms.1.running_var",
        "momentum.norms.1.weight", "layers.2.bias"}) {
    EXPECT_TRUE(tensors->count(name)) << name;
  }
  EXPECT_FALSE(tensors->count("norms.2.weight")) << "the output Linear has no norm";
  EXPECT_EQ(tensors->at("norms.0.num_batches_tracked").values,
            std::vector<float>{static_cast<float>(3 * config.accumulation_steps)});
  EXPECT_TRUE(tensors->at("norms.0.num_batches_tracked").shape.empty()) << "0-d, as torch's";
  auto final_tensors = ReadSafetensors(config.output_checkpoint);
  ASSERT_TRUE(final_tensors.ok()) << final_tensors.status();
  EXPECT_EQ(final_tensors->at("norms.1.running_mean").values.size(), 7u);

  config.output_checkpoint = TempPath("norm_final_resumed.safetensors");
  std::vector<RankRun> resumed = Train(config, 2, checkpoint);
  ASSERT_TRUE(resumed[0].result.ok()) << resumed[0].result.status();
  EXPECT_EQ(resumed[0].result->parameters, whole[0].result->parameters);
  EXPECT_EQ(resumed[0].result->buffers, whole[0].result->buffers);
  EXPECT_EQ(resumed[1].result->buffers, whole[1].result->buffers);
}

// Layer norm: no buffers, no collectives beyond the gradient allreduce.
TEST(LayerNorm, TrainsWithNoBuffersAndNoExtraCollectives) {
  TrainingConfig config = NormConfig(NormKind::kLayerNorm, "", "");
  const ConcatenatedData data = WriteConcatenatedData("ln", 12, 4, 6, 3);
  config.world_size = 2;
  config.data.features_path = data.two_x;
  config.data.targets_path = data.two_y;
  config.compute_dtype = DType::kBF16;
  std::vector<RankRun> runs = Train(config, 2);
  ASSERT_TRUE(runs[0].result.ok()) << runs[0].result.status();
  ASSERT_TRUE(runs[1].result.ok()) << runs[1].result.status();
  EXPECT_TRUE(runs[0].result->buffers.empty());
  EXPECT_EQ(runs[0].result->parameters, runs[1].result->parameters);
  EXPECT_EQ(runs[0].norm_collectives, 0);
  EXPECT_EQ(runs[0].broadcasts, 0);
  EXPECT_EQ(runs[0].gradient_allreduces, config.steps);
  EXPECT_LT(runs[0].records.back().loss, runs[0].records.front().loss);
}

}  // namespace
}  // namespace mptrain
