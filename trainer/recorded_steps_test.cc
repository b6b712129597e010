// The trainer's side of record_steps (train_loop.cc), on the CPU: a recording backend
// (tests/recording_backend.h) stores a step's operations with their arguments and replays them,
// as a CUDA graph would. Replayed training must equal training issued op by op exactly — the
// learning rate changing every step, fp16 overflow skips, evaluations between steps (which
// change the model's host-side caches: the step after one is recorded again). The GPU's own
// graphs are held to the same standard in backends/cuda/cuda_backend_test.cc (RecordedSteps).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "io/npy.h"
#include "tests/fake_collectives.h"
#include "tests/recording_backend.h"
#include "trainer/checkpoint.h"
#include "trainer/train_loop.h"

namespace mptrain {
namespace {

class Telemetry : public TrainingObserver {
 public:
  void OnStep(int64_t, const StepTelemetry* record) override {
    if (record != nullptr) records.push_back(*record);
  }
  bool ShouldStop() override { return false; }
  std::vector<StepTelemetry> records;
};

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

// MLP 16 -> 12 -> 4, one synthetic batch used in place (what record_steps needs), fp16 with an
// init scale that overflows (skips, then backoff), AdamW with warm-up then cosine decay.
TrainingConfig Config() {
  TrainingConfig config;
  config.world_size = 1;
  config.model.widths = {16, 12, 4};
  config.data.source = DataConfig::Source::kSynthetic;
  config.data.synthetic_seed = 5;
  config.micro_batch_size = 8;
  config.accumulation_steps = 3;
  config.steps = 12;
  config.compute_dtype = DType::kF16;
  config.loss_scaler.enabled = true;
  config.loss_scaler.init_scale = std::ldexp(1.0, 40);
  config.loss_scaler.growth_interval = 3;
  config.optimizer.type = OptimizerType::kAdamW;
  config.optimizer.lr = 0.01;
  config.optimizer.weight_decay = 0.01;
  config.lr_schedule.type = ScheduleType::kWarmupCosine;
  config.lr_schedule.warmup_steps = 3;
  config.lr_schedule.min_lr = 0.001;
  return config;
}

struct TrainingRun {
  absl::StatusOr<TrainingResult> result;
  Telemetry telemetry;
  int recordings = 0;
  int replays = 0;
};

TrainingRun Train(const TrainingConfig& config, bool record, const std::string& resume = "") {
  TrainingRun run;
  CpuBackend cpu(std::make_unique<testing::SingleRankCollective>());
  testing::RecordingBackend recording(&cpu);
  TrainingConfig with = config;
  with.record_steps = record;
  run.result = RunTraining(with, 0, &recording, &run.telemetry, resume);
  run.recordings = recording.recordings();
  run.replays = recording.replays();
  return run;
}

void ExpectSameTraining(const TrainingRun& replayed, const TrainingRun& issued) {
  ASSERT_TRUE(replayed.result.ok()) << replayed.result.status();
  ASSERT_TRUE(issued.result.ok()) << issued.result.status();
  EXPECT_EQ(replayed.result->parameters, issued.result->parameters);
  EXPECT_EQ(replayed.result->skipped_steps, issued.result->skipped_steps);
  EXPECT_EQ(replayed.result->final_loss_scale, issued.result->final_loss_scale);
  ASSERT_EQ(replayed.telemetry.records.size(), issued.telemetry.records.size());
  for (size_t i = 0; i < issued.telemetry.records.size(); ++i) {
    const StepTelemetry& a = replayed.telemetry.records[i];
    const StepTelemetry& b = issued.telemetry.records[i];
    EXPECT_EQ(a.loss, b.loss) << "step " << i + 1;
    EXPECT_EQ(a.lr, b.lr) << "step " << i + 1;
    EXPECT_EQ(a.loss_scale, b.loss_scale) << "step " << i + 1;
    EXPECT_EQ(a.skipped, b.skipped) << "step " << i + 1;
    EXPECT_EQ(a.has_eval, b.has_eval) << "step " << i + 1;
    if (a.has_eval && b.has_eval) {
      EXPECT_EQ(a.eval_loss, b.eval_loss) << "step " << i + 1;
    }
  }
}

TEST(RecordedSteps, ReplayedStepsEqualStepsIssuedOpByOp_WithAScheduleAndSkips) {
  const TrainingConfig config = Config();
  TrainingRun replayed = Train(config, true);
  TrainingRun issued = Train(config, false);
  ExpectSameTraining(replayed, issued);
  EXPECT_EQ(replayed.recordings, 1);
  EXPECT_EQ(replayed.result->replayed_steps, config.steps - 1) << "the first step is issued";
  EXPECT_EQ(replayed.replays, config.steps - 1);
  EXPECT_EQ(issued.recordings, 0);
  EXPECT_EQ(issued.result->replayed_steps, 0);
  EXPECT_GT(issued.result->skipped_steps, 0);
}

// An evaluation casts its own batches into the model's low-precision input copy; a training
// forward issued op by op notices and casts its batch again, a step recorded before would not:
// the step after an evaluation is recorded again.
TEST(RecordedSteps, AfterAnEvaluation_TheNextStepIsRecordedAgain) {
  TrainingConfig config = Config();
  std::mt19937 generator(11);
  std::normal_distribution<float> normal;
  NpyMatrix x{20, 16, {}}, y{20, 4, {}};
  for (int i = 0; i < 20 * 16; ++i) x.values.push_back(normal(generator));
  for (int i = 0; i < 20 * 4; ++i) y.values.push_back(normal(generator));
  config.eval.features_path = TempPath("recorded_eval_x.npy");
  config.eval.targets_path = TempPath("recorded_eval_y.npy");
  ASSERT_TRUE(WriteNpyMatrix(config.eval.features_path, x).ok());
  ASSERT_TRUE(WriteNpyMatrix(config.eval.targets_path, y).ok());
  config.eval.every = 4;  // After steps 4, 8 and 12.
  TrainingRun replayed = Train(config, true);
  TrainingRun issued = Train(config, false);
  ExpectSameTraining(replayed, issued);
  EXPECT_EQ(replayed.recordings, 3) << "steps 2, 5 and 9";
  EXPECT_EQ(replayed.result->replayed_steps, config.steps - 1);
}

// Copied or shuffled micro-batches are staged into buffers of their own before each step
// (MicroBatches::Stage) and the step reading them is recorded: the same training as op by op,
// micro-batches crossing the data's end (40 rows, 24 per step) and, shuffled, epochs.
TEST(RecordedSteps, ShuffledOrCopiedBatches_AreStagedAndRecorded) {
  TrainingConfig config = Config();
  config.steps = 7;
  std::mt19937 generator(12);
  std::normal_distribution<float> normal;
  NpyMatrix x{40, 16, {}}, y{40, 4, {}};
  for (int i = 0; i < 40 * 16; ++i) x.values.push_back(normal(generator));
  for (int i = 0; i < 40 * 4; ++i) y.values.push_back(normal(generator));
  config.data.source = DataConfig::Source::kNpy;
  config.data.features_path = TempPath("recorded_train_x.npy");
  config.data.targets_path = TempPath("recorded_train_y.npy");
  ASSERT_TRUE(WriteNpyMatrix(config.data.features_path, x).ok());
  ASSERT_TRUE(WriteNpyMatrix(config.data.targets_path, y).ok());
  for (bool shuffle : {false, true}) {
    SCOPED_TRACE(shuffle ? "shuffled" : "copied");
    config.data.shuffle = shuffle;
    TrainingRun replayed = Train(config, true);
    TrainingRun issued = Train(config, false);
    ExpectSameTraining(replayed, issued);
    EXPECT_EQ(replayed.recordings, 1);
    EXPECT_EQ(replayed.result->replayed_steps, config.steps - 1);
  }
}

// A run resumed from a checkpoint continues the data stream where the checkpoint was (the
// staged micro-batches are taken at the start of each step, after the checkpoint of the one
// before): resumed and recorded, it ends exactly where one uninterrupted run issued op by op
// does, shuffled epochs included.
TEST(RecordedSteps, StagedBatches_AResumedRunEndsWhereAnUninterruptedOneDoes) {
  TrainingConfig config = Config();
  config.steps = 8;
  std::mt19937 generator(13);
  std::normal_distribution<float> normal;
  NpyMatrix x{40, 16, {}}, y{40, 4, {}};
  for (int i = 0; i < 40 * 16; ++i) x.values.push_back(normal(generator));
  for (int i = 0; i < 40 * 4; ++i) y.values.push_back(normal(generator));
  config.data.source = DataConfig::Source::kNpy;
  config.data.features_path = TempPath("resumed_train_x.npy");
  config.data.targets_path = TempPath("resumed_train_y.npy");
  ASSERT_TRUE(WriteNpyMatrix(config.data.features_path, x).ok());
  ASSERT_TRUE(WriteNpyMatrix(config.data.targets_path, y).ok());
  config.data.shuffle = true;
  TrainingRun uninterrupted = Train(config, false);
  TrainingConfig first_half = config;
  first_half.checkpoint_every = 3;
  first_half.checkpoint_dir = TempPath("staged_checkpoints");
  std::filesystem::create_directories(first_half.checkpoint_dir);
  first_half.steps = 5;
  TrainingRun interrupted = Train(first_half, true);
  ASSERT_TRUE(interrupted.result.ok()) << interrupted.result.status();
  TrainingRun resumed = Train(config, true, CheckpointPath(first_half.checkpoint_dir, 3));
  ASSERT_TRUE(resumed.result.ok()) << resumed.result.status();
  ASSERT_TRUE(uninterrupted.result.ok()) << uninterrupted.result.status();
  EXPECT_EQ(resumed.result->parameters, uninterrupted.result->parameters);
  EXPECT_EQ(resumed.result->final_loss_scale, uninterrupted.result->final_loss_scale);
  EXPECT_EQ(resumed.recordings, 1);
  EXPECT_EQ(resumed.result->replayed_steps, 4) << "steps 5 to 8, the first issued op by op";
}

// A GPT's steps: each step's token micro-batches are read on the host and uploaded into
// buffers of their own before it (TokenMicroBatches::Stage), the step reading them recorded once
// and replayed: the same training as op by op, fp16 with overflow skips, an evaluation between
// steps (after which the next step is recorded again), a resume in the middle.
TEST(RecordedSteps, GptTokenBatches_AreStagedAndRecorded) {
  const std::string tokens = TempPath("recorded_gpt_tokens.bin");
  {
    FILE* file = std::fopen(tokens.c_str(), "wb");
    std::mt19937 generator(17);
    for (int i = 0; i < 3000; ++i) {
      const uint16_t token = static_cast<uint16_t>(generator() % 3 == 0 ? generator() % 11 : i % 5);
      std::fwrite(&token, sizeof(token), 1, file);
    }
    std::fclose(file);
  }
  TrainingConfig config;
  config.world_size = 1;
  config.model.gpt.vocab_size = 11;
  config.model.gpt.padded_vocab_size = 16;
  config.model.gpt.context_length = 8;
  config.model.gpt.layers = 2;
  config.model.gpt.heads = 2;
  config.model.gpt.width = 16;
  config.loss.type = LossType::kCrossEntropy;
  config.data.source = DataConfig::Source::kTokens;
  config.data.token_files = {tokens};
  config.eval.token_files = {tokens};
  config.eval.batches = 1;
  config.eval.every = 5;
  config.micro_batch_size = 2;
  config.accumulation_steps = 3;
  config.steps = 9;
  config.compute_dtype = DType::kF16;
  config.loss_scaler.enabled = true;
  config.loss_scaler.init_scale = std::ldexp(1.0, 30);
  config.loss_scaler.growth_interval = 2;
  config.optimizer.type = OptimizerType::kAdamW;
  config.optimizer.lr = 1e-2;
  config.optimizer.weight_decay = 0.1;
  config.max_grad_norm = 1.0;
  config.lr_schedule.type = ScheduleType::kWarmupCosine;
  config.lr_schedule.warmup_steps = 2;
  config.seed = 3;
  TrainingRun replayed = Train(config, true);
  TrainingRun issued = Train(config, false);
  ExpectSameTraining(replayed, issued);
  EXPECT_EQ(replayed.recordings, 2) << "step 2, and step 6 after the evaluation of step 5";
  EXPECT_EQ(replayed.result->replayed_steps, config.steps - 1);
  EXPECT_GT(issued.result->skipped_steps, 0);

  TrainingConfig first_half = config;
  first_half.checkpoint_every = 4;
  first_half.checkpoint_dir = TempPath("recorded_gpt_checkpoints");
  std::filesystem::create_directories(first_half.checkpoint_dir);
  first_half.steps = 4;
  TrainingRun interrupted = Train(first_half, true);
  ASSERT_TRUE(interrupted.result.ok()) << interrupted.result.status();
  TrainingRun resumed = Train(config, true, CheckpointPath(first_half.checkpoint_dir, 4));
  ASSERT_TRUE(resumed.result.ok()) << resumed.result.status();
  // wte's padded rows [11, 16) are not in a checkpoint (they start at 0 after a resume and never
  // matter); every other parameter is bit-identical.
  std::vector<float> got = resumed.result->parameters, want = issued.result->parameters;
  ASSERT_EQ(got.size(), want.size());
  std::fill(got.begin() + 11 * 16, got.begin() + 16 * 16, 0.0f);
  std::fill(want.begin() + 11 * 16, want.begin() + 16 * 16, 0.0f);
  EXPECT_EQ(got, want);
  EXPECT_EQ(resumed.result->final_loss_scale, issued.result->final_loss_scale);
  EXPECT_EQ(resumed.result->replayed_steps, 4) << "steps 6 to 9; 5 issued, then evaluated";
}

}  // namespace
}  // namespace mptrain
