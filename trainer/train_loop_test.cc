#include "trainer/train_loop.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <thread>

#include <sys/stat.h>
#include <unistd.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gloo_collective.h"
#include "gtest/gtest.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "tests/cpu_ranks.h"
#include "tests/fake_collectives.h"
#include "tests/reference_mlp.h"
#include "trainer/checkpoint.h"
#include "trainer/optim/schedule.h"
#include "trainer/parameter_layout.h"

namespace mptrain {
namespace {

class RecordingObserver : public TrainingObserver {
 public:
  void OnStep(int64_t step, const StepTelemetry* record) override {
    steps.push_back(step);
    if (record != nullptr) records.push_back(*record);
  }
  bool ShouldStop() override { return stop_after > 0 && steps.size() >= stop_after; }
  void OnCheckpoint(int64_t, const std::string& path) override { checkpoints.push_back(path); }

  std::vector<std::string> checkpoints;
  std::vector<int64_t> steps;
  std::vector<StepTelemetry> records;
  size_t stop_after = 0;
};

// MLP 16 -> 12 -> 4 (ReLU), synthetic data, 3 steps of 4 micro-batches of 8, fp16 with the
// scaler's defaults, SGD lr 0.05.
TrainingConfig SmallConfig() {
  TrainingConfig config;
  config.world_size = 1;
  config.model.widths = {16, 12, 4};
  config.data.source = DataConfig::Source::kSynthetic;
  config.data.synthetic_seed = 3;
  config.micro_batch_size = 8;
  config.accumulation_steps = 4;
  config.steps = 3;
  config.compute_dtype = DType::kF16;
  config.loss_scaler.enabled = true;
  config.optimizer.lr = 0.05;
  return config;
}

struct TrainedRun {
  absl::StatusOr<TrainingResult> result;
  RecordingObserver observer;
  int collective_calls = 0;
};

TrainedRun TrainOneRank(const TrainingConfig& spec) {
  auto counting = std::make_unique<testing::CountingCollective>(
      std::make_unique<testing::SingleRankCollective>());
  testing::CountingCollective* counter = counting.get();
  CpuBackend backend(std::move(counting));
  TrainedRun run;
  run.result = RunTraining(spec, 0, &backend, &run.observer);
  run.collective_calls = counter->calls();
  return run;
}

std::string TestTmp() { return getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp"; }

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

TEST(RunTraining, NonSteppingMicroBatches_IssueNoCollective) {
  TrainingConfig spec = SmallConfig();
  TrainedRun run = TrainOneRank(spec);
  ASSERT_TRUE(run.result.ok()) << run.result.status();
  // The model is far below one 25 MiB bucket: one allreduce per optimizer step.
  EXPECT_EQ(run.collective_calls, 3) << "one allreduce per optimizer step, none per micro-batch";
  spec.accumulation_steps = 1;
  EXPECT_EQ(TrainOneRank(spec).collective_calls, 3);
}

TEST(RunTraining, LargeModel_AllreducesOneBucketPerLayerGroup_OnlyWhenStepping) {
  TrainingConfig spec = SmallConfig();
  // Two 2048x2048 layers (16 MiB each) do not fit one 25 MiB bucket: two buckets per step.
  spec.model.widths = {2048, 2048, 2048};
  spec.micro_batch_size = 2;
  spec.steps = 2;
  TrainedRun run = TrainOneRank(spec);
  ASSERT_TRUE(run.result.ok()) << run.result.status();
  EXPECT_EQ(run.collective_calls, 2 * 2);
}

TEST(RunTraining, TelemetryEveryStep_WithLossDecreasing) {
  TrainingConfig spec = SmallConfig();
  spec.steps = 8;
  TrainedRun run = TrainOneRank(spec);
  ASSERT_TRUE(run.result.ok()) << run.result.status();
  ASSERT_EQ(run.observer.records.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(run.observer.records[i].step, i + 1);
  EXPECT_LT(run.observer.records.back().loss, run.observer.records.front().loss);
  EXPECT_GT(run.observer.records.front().grad_norm, 0);
  EXPECT_GT(run.observer.records.front().samples_per_second, 0);
  EXPECT_EQ(run.observer.records.front().loss_scale, 65536.0);
}

TEST(RunTraining, TelemetryEvery_SkipsRecordsButKeepsTheLast) {
  TrainingConfig spec = SmallConfig();
  spec.steps = 7;
  spec.telemetry_every = 3;
  TrainedRun run = TrainOneRank(spec);
  ASSERT_TRUE(run.result.ok());
  std::vector<int64_t> steps;
  for (const auto& record : run.observer.records) steps.push_back(record.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 6, 7}));
  EXPECT_EQ(run.observer.steps.size(), 7u) << "progress is reported for every step";
}

TEST(RunTraining, ScaleGrowsExactlyAtGrowthInterval) {
  TrainingConfig spec = SmallConfig();
  spec.steps = 5;
  spec.loss_scaler.init_scale = 1024;
  spec.loss_scaler.growth_interval = 2;
  TrainedRun run = TrainOneRank(spec);
  ASSERT_TRUE(run.result.ok());
  std::vector<double> scales;
  for (const auto& record : run.observer.records) {
    scales.push_back(record.loss_scale);
    EXPECT_FALSE(record.skipped);
  }
  EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 2048, 2048, 4096}));
  EXPECT_EQ(run.result->final_loss_scale, 4096);
}

TEST(RunTraining, Overflow_SkipsStepsBacksOffAndLeavesParametersUntouched) {
  TrainingConfig spec = SmallConfig();
  spec.steps = 40;
  spec.loss_scaler.init_scale = std::ldexp(1.0, 40);  // fp16 gradients overflow
  TrainedRun run = TrainOneRank(spec);
  ASSERT_TRUE(run.result.ok());
  int skipped = 0;
  while (skipped < 40 && run.observer.records[skipped].skipped) {
    EXPECT_EQ(run.observer.records[skipped].loss_scale, std::ldexp(1.0, 40 - skipped));
    EXPECT_FALSE(std::isfinite(run.observer.records[skipped].grad_norm));
    ++skipped;
  }
  ASSERT_GT(skipped, 5) << "the initial scale must overflow fp16 for several steps";
  ASSERT_LT(skipped, 40) << "backoff must eventually reach a usable scale";
  EXPECT_EQ(run.result->skipped_steps, skipped);
  // After the last skip the scale stays put (growth interval 2000).
  EXPECT_EQ(run.observer.records[skipped].loss_scale, std::ldexp(1.0, 40 - skipped));
  EXPECT_TRUE(std::isfinite(run.observer.records[skipped].grad_norm));

  // A run that stops at the last skipped step has exactly the initial parameters.
  spec.steps = skipped;
  TrainedRun only_skipped = TrainOneRank(spec);
  ASSERT_TRUE(only_skipped.result.ok());
  ParameterLayout layout = MakeParameterLayout(spec.model.widths);
  EXPECT_EQ(only_skipped.result->parameters, InitialLayoutParameters(layout, spec.seed));
}

TEST(RunTraining, ClippingSeesUnscaledGradients) {
  TrainingConfig spec = SmallConfig();
  spec.steps = 1;
  const double max_norm = 1e-3;
  spec.max_grad_norm = max_norm;
  TrainedRun run = TrainOneRank(spec);
  ASSERT_TRUE(run.result.ok());
  ParameterLayout layout = MakeParameterLayout(spec.model.widths);
  std::vector<float> initial = InitialLayoutParameters(layout, spec.seed);
  double step_norm = 0;
  for (size_t i = 0; i < initial.size(); ++i) {
    double delta = run.result->parameters[i] - initial[i];
    step_norm += delta * delta;
  }
  step_norm = std::sqrt(step_norm);
  // Clipped to max_norm after unscaling: the step is lr * max_norm. Clipping the scaled
  // gradients would have made it 65536 times smaller.
  EXPECT_NEAR(step_norm, spec.optimizer.lr * max_norm, 0.01 * spec.optimizer.lr * max_norm);
  // The reported norm is the unscaled one: close to the fp32 run's.
  TrainingConfig fp32 = spec;
  fp32.compute_dtype = DType::kF32;
  fp32.loss_scaler.enabled = false;
  TrainedRun reference = TrainOneRank(fp32);
  ASSERT_TRUE(reference.result.ok());
  EXPECT_NEAR(run.observer.records[0].grad_norm, reference.observer.records[0].grad_norm,
              0.02 * reference.observer.records[0].grad_norm);
  EXPECT_GT(run.observer.records[0].grad_norm, 10 * max_norm);
}

TEST(RunTraining, ObserverStop_AbortsBetweenSteps) {
  TrainingConfig spec = SmallConfig();
  spec.steps = 100;
  auto backend = std::make_unique<CpuBackend>(std::make_unique<testing::SingleRankCollective>());
  RecordingObserver observer;
  observer.stop_after = 1;
  auto result = RunTraining(spec, 0, backend.get(), &observer);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted);
}

TEST(RunTraining, TwoRanksOverGloo_EndWithIdenticalParameters) {
  TrainingConfig spec = SmallConfig();
  spec.world_size = 2;
  spec.optimizer.momentum = 0.9;
  const auto results = testing::RunCpuRanksOverGloo(2, [&](int rank, Backend* backend) {
    RecordingObserver observer;
    return RunTraining(spec, rank, backend, &observer);
  });
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[0]->checksum, results[1]->checksum);
  EXPECT_EQ(results[0]->parameters, results[1]->parameters);
  // Each rank alone (its own data, no averaging) ends elsewhere: the allreduce mattered.
  TrainingConfig alone = spec;
  alone.world_size = 1;
  TrainedRun single = TrainOneRank(alone);
  ASSERT_TRUE(single.result.ok());
  EXPECT_NE(single.result->checksum, results[0]->checksum);
}

TEST(RunTraining, NpyDataAndCheckpointInit_OneFp32StepMatchesIndependentReference) {
  const int in = 6, hidden = 5, out = 3, rows = 10, batch = 3, accumulation = 3;
  std::mt19937 generator(11);
  std::normal_distribution<float> normal;
  NpyMatrix features{rows, in, std::vector<float>(rows * in)};
  NpyMatrix targets{rows, out, std::vector<float>(rows * out)};
  for (float& v : features.values) v = normal(generator);
  for (float& v : targets.values) v = normal(generator);
  ASSERT_TRUE(WriteNpyMatrix(TempPath("x.npy"), features).ok());
  ASSERT_TRUE(WriteNpyMatrix(TempPath("y.npy"), targets).ok());

  TrainingConfig spec = SmallConfig();
  spec.model.widths = {in, hidden, out};
  spec.model.activation = ActivationKind::kGelu;
  spec.data.source = DataConfig::Source::kNpy;
  spec.data.features_path = TempPath("x.npy");
  spec.data.targets_path = TempPath("y.npy");
  spec.micro_batch_size = batch;
  spec.accumulation_steps = accumulation;
  spec.steps = 1;
  spec.compute_dtype = DType::kF32;
  spec.loss_scaler.enabled = false;
  spec.optimizer.lr = 0.1;
  spec.optimizer.momentum = 0.9;
  spec.optimizer.weight_decay = 0.01;
  ParameterLayout layout = MakeParameterLayout(spec.model.widths);
  std::vector<float> init(layout.total);
  for (float& v : init) v = 0.3f * normal(generator);
  spec.init_checkpoint = TempPath("init.safetensors");
  spec.output_checkpoint = TempPath("out.safetensors");
  ASSERT_TRUE(WriteSafetensors(spec.init_checkpoint, ParametersToTensors(layout, init)).ok());

  TrainedRun run = TrainOneRank(spec);
  ASSERT_TRUE(run.result.ok()) << run.result.status();
  auto written = ReadSafetensors(spec.output_checkpoint);
  ASSERT_TRUE(written.ok()) << written.status();
  auto trained = TensorsToParameters(layout, *written, "out");
  ASSERT_TRUE(trained.ok());

  // Independent computation: micro-batches of rows 0-2, 3-5, 6-8, loss / accumulation each.
  std::vector<testing::ReferenceLayer> layers(2);
  std::vector<std::vector<double>> weight_grads(2), bias_grads(2);
  for (size_t l = 0; l < 2; ++l) {
    const LayerLayout& ll = layout.layers[l];
    layers[l].in = ll.in;
    layers[l].out = ll.out;
    layers[l].weight.assign(init.begin() + ll.weight_offset,
                            init.begin() + ll.weight_offset + ll.in * ll.out);
    layers[l].bias.assign(init.begin() + ll.bias_offset, init.begin() + ll.bias_offset + ll.out);
    weight_grads[l].assign(ll.in * ll.out, 0.0);
    bias_grads[l].assign(ll.out, 0.0);
  }
  for (int micro = 0; micro < accumulation; ++micro) {
    std::vector<double> x(features.values.begin() + micro * batch * in,
                          features.values.begin() + (micro + 1) * batch * in);
    std::vector<double> y(targets.values.begin() + micro * batch * out,
                          targets.values.begin() + (micro + 1) * batch * out);
    testing::ReferenceLossAndGrad(layers, testing::ReferenceActivation::kGelu, x, y, batch,
                                  1.0 / accumulation, &weight_grads, &bias_grads);
  }
  for (size_t l = 0; l < 2; ++l) {
    const LayerLayout& ll = layout.layers[l];
    auto expect_step = [&](int64_t offset, const std::vector<double>& grads) {
      for (size_t i = 0; i < grads.size(); ++i) {
        const double p = init[offset + i];
        const double expected = p - 0.1 * (grads[i] + 0.01 * p);  // First step: buf = d_p.
        EXPECT_NEAR((*trained)[offset + i], expected, 1e-5 * (1 + std::fabs(expected)))
            << "layer " << l << " element " << i;
      }
    };
    expect_step(ll.weight_offset, weight_grads[l]);
    expect_step(ll.bias_offset, bias_grads[l]);
  }
}

TEST(RunTraining, ResumeFromCheckpoint_IsBitIdenticalToAnUninterruptedRun) {
  // npy data whose shard is not a multiple of the micro-batch (the data position matters),
  // momentum (the optimizer state matters) and a short growth interval (the scaler state
  // matters).
  const int in = 16, out = 4, rows = 37;
  std::mt19937 generator(3);
  std::normal_distribution<float> normal;
  NpyMatrix features{rows, in, std::vector<float>(rows * in)};
  NpyMatrix targets{rows, out, std::vector<float>(rows * out)};
  for (float& v : features.values) v = normal(generator);
  for (float& v : targets.values) v = normal(generator);
  ASSERT_TRUE(WriteNpyMatrix(TempPath("resume_x.npy"), features).ok());
  ASSERT_TRUE(WriteNpyMatrix(TempPath("resume_y.npy"), targets).ok());
  TrainingConfig spec = SmallConfig();
  spec.data.source = DataConfig::Source::kNpy;
  spec.data.features_path = TempPath("resume_x.npy");
  spec.data.targets_path = TempPath("resume_y.npy");
  spec.steps = 12;
  spec.optimizer.momentum = 0.9;
  spec.loss_scaler.growth_interval = 3;
  spec.checkpoint_every = 5;
  spec.checkpoint_dir = TestTmp();
  TrainedRun whole = TrainOneRank(spec);
  ASSERT_TRUE(whole.result.ok()) << whole.result.status();

  const std::string checkpoint = TestTmp() + "/step-00000005.safetensors";
  auto backend = std::make_unique<CpuBackend>(std::make_unique<testing::SingleRankCollective>());
  RecordingObserver observer;
  auto resumed = RunTraining(spec, 0, backend.get(), &observer, checkpoint);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->checksum, whole.result->checksum);
  EXPECT_EQ(resumed->parameters, whole.result->parameters);
  EXPECT_EQ(resumed->final_loss_scale, whole.result->final_loss_scale);
  ASSERT_FALSE(observer.records.empty());
  EXPECT_EQ(observer.records.front().step, 6) << "telemetry continues from the checkpoint";
  // The scale doubled every 3 steps before and after the checkpoint, as without it.
  EXPECT_EQ(observer.records.back().loss_scale, whole.observer.records.back().loss_scale);
}

// A linearly separable 3-class problem (the class is the largest of the first 3 features):
// cross-entropy training drives the training accuracy from chance towards 1.
TEST(RunTraining, CrossEntropy_LearnsAndReportsAccuracy) {
  const int in = 6, rows = 96;
  std::mt19937 generator(4);
  std::normal_distribution<float> normal;
  NpyMatrix features{rows, in, std::vector<float>(rows * in)};
  NpyLabels labels{rows, std::vector<int64_t>(rows)};
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < in; ++c) features.values[r * in + c] = normal(generator);
    const float* x = &features.values[r * in];
    labels.values[r] = std::max_element(x, x + 3) - x;
  }
  ASSERT_TRUE(WriteNpyMatrix(TempPath("ce_x.npy"), features).ok());
  ASSERT_TRUE(WriteNpyLabels(TempPath("ce_y.npy"), labels).ok());
  TrainingConfig spec = SmallConfig();
  spec.model.widths = {in, 16, 3};
  spec.loss.type = LossType::kCrossEntropy;
  spec.loss.label_smoothing = 0.05;
  spec.data.source = DataConfig::Source::kNpy;
  spec.data.features_path = TempPath("ce_x.npy");
  spec.data.targets_path = TempPath("ce_y.npy");
  spec.micro_batch_size = 24;
  spec.accumulation_steps = 2;
  spec.steps = 60;
  spec.compute_dtype = DType::kBF16;
  spec.loss_scaler.enabled = false;
  spec.optimizer.lr = 0.5;
  spec.optimizer.momentum = 0.9;
  TrainedRun run = TrainOneRank(spec);
  ASSERT_TRUE(run.result.ok()) << run.result.status();
  ASSERT_EQ(run.observer.records.size(), 60u);
  for (const StepTelemetry& record : run.observer.records) {
    ASSERT_TRUE(record.has_accuracy);
    // 48 samples per step: the accuracy is a whole number of them.
    EXPECT_DOUBLE_EQ(record.accuracy * 48, std::round(record.accuracy * 48));
    EXPECT_EQ(record.lr, 0.5);
  }
  EXPECT_LT(run.observer.records.front().accuracy, 0.7);
  EXPECT_GE(run.observer.records.back().accuracy, 0.95);
  EXPECT_LT(run.observer.records.back().loss, 0.5 * run.observer.records.front().loss);

  // A class id outside [0, output_dim) fails the run naming the file and the row.
  labels.values[17] = 3;
  ASSERT_TRUE(WriteNpyLabels(TempPath("ce_bad.npy"), labels).ok());
  spec.data.targets_path = TempPath("ce_bad.npy");
  TrainedRun bad = TrainOneRank(spec);
  EXPECT_EQ(bad.result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.result.status().message().find("ce_bad.npy: row 17 has a class outside [0, 3)"),
            absl::string_view::npos)
      << bad.result.status();
  // The class is the file's content: not echoed.
  EXPECT_EQ(bad.result.status().message().find("class 3"), absl::string_view::npos)
      << bad.result.status();
}

// Three ranks (the mean of their correct counts is not exact in fp32): every training and
// evaluation accuracy is a whole number of samples over the total, exactly, as PyTorch's
// summed counts give (2/3 had come out 0.66666669, and an eval accuracy 1.00000003).
TEST(RunTraining, ThreeRanks_AccuraciesAreExactFractionsOfTheWholeCount) {
  const int in = 2, rows = 30;
  std::mt19937 generator(11);
  std::normal_distribution<float> normal;
  NpyMatrix features{rows, in, std::vector<float>(rows * in)};
  NpyLabels labels{rows, std::vector<int64_t>(rows)};
  for (int r = 0; r < rows; ++r) {
    // Separable with a margin: the label is the sign of the first feature.
    const float first = normal(generator);
    features.values[r * in] = first > 0 ? first + 1.0f : first - 1.0f;
    features.values[r * in + 1] = normal(generator);
    labels.values[r] = first > 0 ? 1 : 0;
  }
  ASSERT_TRUE(WriteNpyMatrix(TempPath("acc3_x.npy"), features).ok());
  ASSERT_TRUE(WriteNpyLabels(TempPath("acc3_y.npy"), labels).ok());
  TrainingConfig spec = SmallConfig();
  spec.world_size = 3;
  spec.model.widths = {in, 2};
  spec.loss.type = LossType::kCrossEntropy;
  spec.data.source = DataConfig::Source::kNpy;
  spec.data.features_path = TempPath("acc3_x.npy");
  spec.data.targets_path = TempPath("acc3_y.npy");
  spec.eval.features_path = TempPath("acc3_x.npy");
  spec.eval.targets_path = TempPath("acc3_y.npy");
  spec.eval.every = 1;
  spec.micro_batch_size = 1;
  spec.accumulation_steps = 1;
  spec.steps = 40;
  spec.compute_dtype = DType::kF32;
  spec.loss_scaler.enabled = false;
  spec.optimizer.lr = 0.5;
  RecordingObserver observers[3];
  const auto results = testing::RunCpuRanksOverGloo(3, [&](int rank, Backend* backend) {
    return RunTraining(spec, rank, backend, &observers[rank]);
  });
  for (int rank = 0; rank < 3; ++rank) ASSERT_TRUE(results[rank].ok()) << results[rank].status();
  ASSERT_EQ(observers[0].records.size(), 40u);
  std::set<double> fractions;
  for (const StepTelemetry& record : observers[0].records) {
    ASSERT_TRUE(record.has_accuracy);
    EXPECT_EQ(record.accuracy, std::round(record.accuracy * 3) / 3) << "step " << record.step;
    fractions.insert(record.accuracy);
    ASSERT_TRUE(record.has_eval);
    EXPECT_LE(record.eval_accuracy, 1.0);
    EXPECT_EQ(record.eval_accuracy, std::round(record.eval_accuracy * rows) / rows)
        << "step " << record.step;
  }
  EXPECT_GT(fractions.count(1.0 / 3) + fractions.count(2.0 / 3), 0u)
      << "no step had 1 or 2 of 3 right: the case proves nothing";
  EXPECT_EQ(observers[0].records.back().eval_accuracy, 1.0) << "a separable set, learned";
}

// GradScaler.step skips optimizer.step() on overflow: Adam's state, its step count included,
// must not move. So a run whose first k steps overflow, then trains N steps, ends exactly where
// a run started at the scale it backed off to, training N steps, ends (the synthetic batch is
// the same at every step).
TEST(RunTraining, AdamW_SkippedStepsLeaveTheOptimizerUntouched) {
  TrainingConfig spec = SmallConfig();
  spec.optimizer.type = OptimizerType::kAdamW;
  spec.optimizer.lr = 0.01;
  spec.optimizer.weight_decay = 0.1;
  spec.steps = 40;
  spec.loss_scaler.init_scale = std::ldexp(1.0, 40);
  TrainedRun overflowing = TrainOneRank(spec);
  ASSERT_TRUE(overflowing.result.ok()) << overflowing.result.status();
  const int64_t skipped = overflowing.result->skipped_steps;
  ASSERT_GT(skipped, 3);
  ASSERT_LT(skipped, 30);
  TrainingConfig clean = spec;
  clean.loss_scaler.init_scale = overflowing.observer.records[skipped].loss_scale;
  clean.steps = spec.steps - skipped;
  TrainedRun direct = TrainOneRank(clean);
  ASSERT_TRUE(direct.result.ok()) << direct.result.status();
  EXPECT_EQ(direct.result->skipped_steps, 0);
  EXPECT_EQ(direct.result->parameters, overflowing.result->parameters);
  // And the parameters moved: AdamW steps about lr per parameter.
  EXPECT_NE(direct.result->parameters,
            InitialLayoutParameters(MakeParameterLayout(spec.model.widths), spec.seed));
}

// The schedule advances on every attempted step, skipped or not, and telemetry carries the rate
// each step used.
TEST(RunTraining, LrSchedule_AdvancesOnSkippedStepsToo) {
  TrainingConfig spec = SmallConfig();
  spec.steps = 20;
  spec.loss_scaler.init_scale = std::ldexp(1.0, 30);  // The first steps overflow.
  spec.lr_schedule.type = ScheduleType::kWarmupCosine;
  spec.lr_schedule.warmup_steps = 5;
  spec.lr_schedule.min_lr = 0.001;
  TrainedRun run = TrainOneRank(spec);
  ASSERT_TRUE(run.result.ok()) << run.result.status();
  ASSERT_GT(run.result->skipped_steps, 2);
  LrSchedule schedule(spec.lr_schedule, spec.optimizer.lr, spec.steps);
  ASSERT_EQ(run.observer.records.size(), 20u);
  for (int step = 1; step <= 20; ++step) {
    EXPECT_EQ(run.observer.records[step - 1].lr, schedule.At(step)) << "step " << step;
  }
  EXPECT_EQ(run.observer.records[0].lr, 0.0);
  EXPECT_EQ(run.observer.records[5].lr, spec.optimizer.lr);
}

// Shuffled epochs: the stream position is a function of the step, so a resumed run is
// bit-identical; and held-out evaluation appears on its steps and the last.
TEST(RunTraining, ShuffledEpochsResumeBitIdentically_AndEvaluationIsReported) {
  const int in = 16, out = 4, rows = 37;
  std::mt19937 generator(8);
  std::normal_distribution<float> normal;
  NpyMatrix features{rows, in, std::vector<float>(rows * in)};
  NpyMatrix targets{rows, out, std::vector<float>(rows * out)};
  for (float& v : features.values) v = normal(generator);
  for (float& v : targets.values) v = normal(generator);
  ASSERT_TRUE(WriteNpyMatrix(TempPath("shuffle_x.npy"), features).ok());
  ASSERT_TRUE(WriteNpyMatrix(TempPath("shuffle_y.npy"), targets).ok());
  TrainingConfig spec = SmallConfig();
  spec.data.source = DataConfig::Source::kNpy;
  spec.data.features_path = TempPath("shuffle_x.npy");
  spec.data.targets_path = TempPath("shuffle_y.npy");
  spec.data.shuffle = true;
  spec.data.shuffle_seed = 5;
  spec.eval.features_path = TempPath("shuffle_x.npy");  // 37 rows: 4 batches of 8, then 5
  spec.eval.targets_path = TempPath("shuffle_y.npy");
  spec.eval.every = 3;
  spec.steps = 7;  // 7 · 4 · 8 = 224 rows: several epochs of 37
  spec.checkpoint_every = 4;
  spec.checkpoint_dir = TestTmp() + "/shuffle";
  mkdir(spec.checkpoint_dir.c_str(), 0755);
  TrainedRun whole = TrainOneRank(spec);
  ASSERT_TRUE(whole.result.ok()) << whole.result.status();
  std::vector<int64_t> evaluated;
  for (const StepTelemetry& record : whole.observer.records) {
    if (!record.has_eval) continue;
    evaluated.push_back(record.step);
    EXPECT_GT(record.eval_loss, 0);
  }
  EXPECT_EQ(evaluated, (std::vector<int64_t>{3, 6, 7}));

  auto backend = std::make_unique<CpuBackend>(std::make_unique<testing::SingleRankCollective>());
  RecordingObserver observer;
  auto resumed = RunTraining(spec, 0, backend.get(), &observer,
                             spec.checkpoint_dir + "/step-00000004.safetensors");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->parameters, whole.result->parameters);
  EXPECT_EQ(observer.records.back().eval_loss, whole.observer.records.back().eval_loss);

  // Without shuffling the same job ends elsewhere: the order mattered.
  spec.data.shuffle = false;
  spec.data.shuffle_seed = 0;
  spec.checkpoint_every = 0;
  TrainedRun in_order = TrainOneRank(spec);
  ASSERT_TRUE(in_order.result.ok());
  EXPECT_NE(in_order.result->parameters, whole.result->parameters);
}

// A job's run keeps its newest keep_checkpoints files (the ones it stamped) and those a restart
// may resume from (the observer's acknowledged step and newer).
TEST(RunTraining, KeepCheckpoints_OlderOnesOfTheJobGo_NeverTheAcknowledged) {
  struct Acknowledging : RecordingObserver {
    int64_t acknowledged = std::numeric_limits<int64_t>::max();
    int64_t AcknowledgedCheckpointStep() override { return acknowledged; }
  };
  TrainingConfig spec = SmallConfig();
  spec.steps = 7;
  spec.checkpoint_every = 1;
  spec.keep_checkpoints = 2;
  spec.checkpoint_dir = TestTmp() + "/kept";
  auto left_after = [&](int64_t acknowledged) {
    EXPECT_EQ(system(("rm -rf " + spec.checkpoint_dir).c_str()), 0);
    mkdir(spec.checkpoint_dir.c_str(), 0755);
    CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
    Acknowledging observer;
    observer.acknowledged = acknowledged;
    auto result = RunTraining(spec, 0, &backend, &observer, "", CheckpointStamp{"job-0042/uid", "alice"});
    EXPECT_TRUE(result.ok()) << result.status();
    std::vector<int64_t> left;
    for (int64_t step = 1; step <= 7; ++step) {
      if (access(CheckpointPath(spec.checkpoint_dir, step).c_str(), F_OK) == 0) {
        left.push_back(step);
      }
    }
    return left;
  };
  EXPECT_EQ(left_after(std::numeric_limits<int64_t>::max()), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(left_after(3), (std::vector<int64_t>{3, 4, 5, 6, 7}));
  // The newest resumes as before.
  CpuBackend again(std::make_unique<testing::SingleRankCollective>());
  RecordingObserver resumed_observer;
  EXPECT_TRUE(RunTraining(spec, 0, &again, &resumed_observer,
                          CheckpointPath(spec.checkpoint_dir, 6), CheckpointStamp{"job-0042/uid", "alice"})
                  .ok());
}

class ResumeWithOptimizer : public ::testing::TestWithParam<OptimizerType> {};

// Every optimizer's state is in the checkpoint: a resumed run is bit-identical.
TEST_P(ResumeWithOptimizer, IsBitIdenticalToAnUninterruptedRun) {
  TrainingConfig spec = SmallConfig();
  spec.optimizer.type = GetParam();
  spec.optimizer.lr = 0.01;
  spec.optimizer.momentum = GetParam() == OptimizerType::kSgd ? 0.9 : 0;
  spec.optimizer.nesterov = GetParam() == OptimizerType::kSgd;
  spec.optimizer.weight_decay = 0.01;
  spec.steps = 9;
  spec.loss_scaler.init_scale = std::ldexp(1.0, 24);  // A few skipped steps first.
  spec.loss_scaler.growth_interval = 2;
  spec.checkpoint_every = 4;
  spec.checkpoint_dir = TestTmp() + "/resume_" + std::to_string(static_cast<int>(GetParam()));
  mkdir(spec.checkpoint_dir.c_str(), 0755);
  TrainedRun whole = TrainOneRank(spec);
  ASSERT_TRUE(whole.result.ok()) << whole.result.status();
  auto backend = std::make_unique<CpuBackend>(std::make_unique<testing::SingleRankCollective>());
  RecordingObserver observer;
  auto resumed = RunTraining(spec, 0, backend.get(), &observer,
                             spec.checkpoint_dir + "/step-00000004.safetensors");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->parameters, whole.result->parameters);
  EXPECT_EQ(resumed->skipped_steps, whole.result->skipped_steps);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ResumeWithOptimizer,
                         ::testing::Values(OptimizerType::kSgd, OptimizerType::kAdam,
                                           OptimizerType::kAdamW));

TEST(RunTraining, ResumeFromAMissingCheckpoint_FailsNamingIt) {
  TrainingConfig spec = SmallConfig();
  auto backend = std::make_unique<CpuBackend>(std::make_unique<testing::SingleRankCollective>());
  RecordingObserver observer;
  auto result = RunTraining(spec, 0, backend.get(), &observer, "/nonexistent/step-1.safetensors");
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(result.status().message()).find("/nonexistent/step-1.safetensors"),
            std::string::npos);
}

// SmallConfig in fp32 without a scaler (no step is skipped) and a learning rate of 1e30: the
// parameters blow up. With `overflow_update`, weight decay 1e30 too, so that lr · weight_decay · w
// overflows float32 in the first update itself.
TrainingConfig DivergingConfig(int64_t steps, bool overflow_update) {
  TrainingConfig spec = SmallConfig();
  spec.compute_dtype = DType::kF32;
  spec.loss_scaler.enabled = false;
  spec.steps = steps;
  spec.optimizer.lr = 1e30;
  if (overflow_update) spec.optimizer.weight_decay = 1e30;
  return spec;
}

// fp32 without a scaler skips no step: an absurd learning rate blows the parameters up, the
// next loss is infinite or NaN, and the run fails naming that step instead of succeeding with
// loss nan.
TEST(RunTraining, LossNotFiniteOnAStepNotSkipped_FailsNamingTheStep) {
  TrainedRun run = TrainOneRank(DivergingConfig(20, /*overflow_update=*/false));
  ASSERT_FALSE(run.result.ok()) << "a diverged run must not succeed";
  EXPECT_EQ(run.result.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(run.result.status().message());
  EXPECT_NE(message.find("the training diverged: the loss of step "), std::string::npos)
      << message;
  // The named step is the first whose loss was not finite; the steps before it were.
  ASSERT_FALSE(run.observer.records.empty());
  const int64_t named = std::stoll(message.substr(message.find("step ") + 5));
  EXPECT_EQ(named, run.observer.records.back().step + 1) << message;
  for (const StepTelemetry& record : run.observer.records) {
    EXPECT_TRUE(std::isfinite(record.loss)) << "step " << record.step;
  }
}

// One step whose update overflows: its loss (computed before the update) is finite, so only
// the check of the final parameters sees it.
TEST(RunTraining, FinalParametersNotFinite_FailsNamingTheLastStep) {
  TrainedRun run = TrainOneRank(DivergingConfig(1, /*overflow_update=*/true));
  ASSERT_FALSE(run.result.ok()) << "non-finite parameters must not be a success";
  EXPECT_EQ(run.result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(run.result.status().message().find("the training diverged: after step 1 parameter "),
            absl::string_view::npos)
      << run.result.status();
  ASSERT_EQ(run.observer.records.size(), 1u);
  EXPECT_TRUE(std::isfinite(run.observer.records[0].loss));
}

// The same overflow on a checkpoint step: no checkpoint of it is written (a restart would have
// failed loading the job's own file, and its error replaced the divergence as the job's).
TEST(RunTraining, ParametersNotFiniteOnACheckpointStep_NoCheckpointWritten_FailsNamingTheStep) {
  TrainingConfig spec = DivergingConfig(3, /*overflow_update=*/true);
  spec.checkpoint_every = 1;
  spec.checkpoint_dir = TestTmp() + "/diverged";
  mkdir(spec.checkpoint_dir.c_str(), 0755);
  TrainedRun run = TrainOneRank(spec);
  ASSERT_FALSE(run.result.ok());
  EXPECT_EQ(run.result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(run.result.status().message().find("the training diverged: after step 1 parameter "),
            absl::string_view::npos)
      << run.result.status();
  EXPECT_TRUE(run.observer.checkpoints.empty()) << run.observer.checkpoints.front();
  struct stat st;
  EXPECT_NE(stat((spec.checkpoint_dir + "/step-00000001.safetensors").c_str(), &st), 0)
      << "a checkpoint of non-finite parameters was written";
}

// With the fp16 scaler a non-finite gradient is skipped, not a failure.
TEST(RunTraining, SkippedStepsWithInfiniteGradients_StillSucceed) {
  TrainingConfig spec = SmallConfig();
  spec.loss_scaler.init_scale = 3e38;  // The first steps overflow fp16 and are skipped.
  spec.steps = 4;
  TrainedRun run = TrainOneRank(spec);
  ASSERT_TRUE(run.result.ok()) << run.result.status();
  EXPECT_GT(run.result->skipped_steps, 0);
}

}  // namespace
}  // namespace mptrain
