// RunTraining with model.gpt on the CPU backend: a tiny GPT learns a periodic token stream
// (fp32 and bf16), reports eval_loss from eval_tokens, and a run resumed from its checkpoint
// (wte cut to V rows, Conv1D matrices transposed in the file) ends bit-identical to an
// uninterrupted one.

#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gloo_collective.h"
#include "common/resource_estimate.h"
#include "gtest/gtest.h"
#include "io/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/cpu_ranks.h"
#include "tests/fake_collectives.h"
#include "trainer/checkpoint.h"
#include "trainer/train_loop.h"

namespace mptrain {
namespace {

class RecordingObserver : public TrainingObserver {
 public:
  void OnStep(int64_t step, const StepTelemetry* record) override {
    if (record != nullptr) records.push_back(*record);
  }
  bool ShouldStop() override { return false; }
  void OnWarning(const std::string& text) override { warnings.push_back(text); }
  void OnSample(int64_t step, const std::string& text) override { samples.push_back({step, text}); }
  std::vector<StepTelemetry> records;
  std::vector<std::pair<int64_t, std::string>> samples;
  std::vector<std::string> warnings;
};

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

// A raw uint16 token file: 0, 1, ..., 6, 0, 1, ... (period 7, ids < 8: sequences of 8 start
// at every phase, so the model must learn the successor of each token, not of each position).
std::string PeriodicTokens(const std::string& name, int64_t count) {
  const std::string path = TempPath(name);
  FILE* file = std::fopen(path.c_str(), "wb");
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t token = static_cast<uint16_t>(i % 7);
    std::fwrite(&token, sizeof(token), 1, file);
  }
  std::fclose(file);
  return path;
}

TrainingConfig TinyGpt(DType dtype) {
  TrainingConfig config;
  config.world_size = 1;
  config.model.gpt.vocab_size = 8;
  config.model.gpt.padded_vocab_size = 10;
  config.model.gpt.context_length = 8;
  config.model.gpt.layers = 2;
  config.model.gpt.heads = 2;
  config.model.gpt.width = 16;
  config.loss.type = LossType::kCrossEntropy;
  config.data.source = DataConfig::Source::kTokens;
  config.data.token_files = {PeriodicTokens("train.bin", 2000)};
  config.eval.token_files = {PeriodicTokens("val.bin", 200)};
  config.eval.batches = 2;
  config.eval.every = 10;
  config.micro_batch_size = 2;
  config.accumulation_steps = 2;
  config.steps = 30;
  config.compute_dtype = dtype;
  config.optimizer.type = OptimizerType::kAdamW;
  config.optimizer.lr = 1e-2;
  config.optimizer.weight_decay = 0.1;
  config.max_grad_norm = 1.0;
  config.seed = 5;
  return config;
}

absl::StatusOr<TrainingResult> Train(const TrainingConfig& config, RecordingObserver* observer,
                                     const std::string& resume = "") {
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  return RunTraining(config, 0, &backend, observer, resume, {"job-1", "alice"});
}

class GptTraining : public ::testing::TestWithParam<DType> {};

TEST_P(GptTraining, LearnsAPeriodicStream_AndReportsEvalLoss) {
  RecordingObserver observer;
  absl::StatusOr<TrainingResult> result = Train(TinyGpt(GetParam()), &observer);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(observer.records.size(), 30u);
  const double first = observer.records.front().loss, last = observer.records.back().loss;
  EXPECT_NEAR(first, std::log(8.0), 0.3) << "GPT-2's init starts near uniform";
  EXPECT_LT(last, 0.2 * first) << "the next token of a period-7 stream is learnable";
  int evaluations = 0;
  for (const StepTelemetry& record : observer.records) {
    if (!record.has_eval) continue;
    ++evaluations;
    EXPECT_TRUE(std::isfinite(record.eval_loss));
  }
  EXPECT_EQ(evaluations, 3);  // Steps 10, 20, 30.
  EXPECT_LT(observer.records.back().eval_loss, 0.2 * first);
  // Tokens per second: B·T positions per micro-batch.
  EXPECT_GT(observer.records.back().samples_per_second, 0);
}

INSTANTIATE_TEST_SUITE_P(Precisions, GptTraining, ::testing::Values(DType::kF32, DType::kBF16));

TEST(GptTraining, ResumedRunEndsBitIdentical_CheckpointInHuggingFaceLayout) {
  TrainingConfig config = TinyGpt(DType::kBF16);
  config.steps = 6;
  config.eval.token_files.clear();
  config.checkpoint_every = 3;
  config.checkpoint_dir = TempPath("ckpt");
  mkdir(config.checkpoint_dir.c_str(), 0755);
  RecordingObserver full_observer;
  absl::StatusOr<TrainingResult> full = Train(config, &full_observer);
  ASSERT_TRUE(full.ok()) << full.status();

  const std::string step3 = CheckpointPath(config.checkpoint_dir, 3);
  absl::StatusOr<TensorMap> file = ReadSafetensors(step3);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->at("transformer.wte.weight").shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(file->at("transformer.h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{16, 48}));
  EXPECT_EQ(file->at("transformer.h.1.mlp.c_proj.weight").shape, (std::vector<int64_t>{64, 16}));

  RecordingObserver resumed_observer;
  config.overwrite_output = true;
  absl::StatusOr<TrainingResult> resumed = Train(config, &resumed_observer, step3);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  // The padded rows of wte are not in the file (they start at 0 after a resume, and never
  // matter): every other parameter is bit-identical.
  const int64_t padded_begin = 8 * 16, padded_end = 10 * 16;
  ASSERT_EQ(resumed->parameters.size(), full->parameters.size());
  for (size_t i = 0; i < full->parameters.size(); ++i) {
    if (static_cast<int64_t>(i) >= padded_begin && static_cast<int64_t>(i) < padded_end) continue;
    ASSERT_EQ(resumed->parameters[i], full->parameters[i]) << "parameter " << i;
  }
  ASSERT_EQ(resumed_observer.records.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed_observer.records[i].loss, full_observer.records[3 + i].loss) << i;
  }
}

// The output checkpoint gets a config.json beside it (trainer/hf_config.h) whose sizes are
// those of the tensors written: what GPT2LMHeadModel.from_pretrained builds before loading them.
// Another tenant's config.json there stays, and the run says so.
TEST(GptTraining, OutputCheckpointGetsAMatchingHuggingFaceConfig_AForeignOneIsLeftAlone) {
  TrainingConfig config = TinyGpt(DType::kF32);
  config.steps = 2;
  config.eval.token_files.clear();
  const std::string dir = TempPath("hf_out");
  mkdir(dir.c_str(), 0755);
  config.output_checkpoint = dir + "/model.safetensors";
  RecordingObserver observer;
  ASSERT_TRUE(Train(config, &observer).ok());
  EXPECT_TRUE(observer.warnings.empty()) << observer.warnings.front();
  absl::StatusOr<TensorMap> file = ReadSafetensors(config.output_checkpoint);
  ASSERT_TRUE(file.ok()) << file.status();
  std::ifstream in(dir + "/config.json");
  const nlohmann::json hf = nlohmann::json::parse(in);
  const std::vector<int64_t>& wte = file->at("transformer.wte.weight").shape;
  EXPECT_EQ(hf["vocab_size"], wte[0]);
  EXPECT_EQ(hf["n_embd"], wte[1]);
  EXPECT_EQ(hf["n_positions"], file->at("transformer.wpe.weight").shape[0]);
  int64_t blocks = 0;
  while (file->count("transformer.h." + std::to_string(blocks) + ".ln_1.weight")) ++blocks;
  EXPECT_EQ(hf["n_layer"], blocks);
  EXPECT_EQ(hf["n_head"], config.model.gpt.heads);
  // n_inner null: 4 * n_embd, Conv1D [in, out].
  EXPECT_TRUE(hf["n_inner"].is_null());
  EXPECT_EQ(file->at("transformer.h.0.mlp.c_fc.weight").shape,
            (std::vector<int64_t>{wte[1], 4 * wte[1]}));
  EXPECT_EQ(file->count("lm_head.weight"), 0u);
  EXPECT_EQ(hf["tie_word_embeddings"], true);
  EXPECT_EQ(hf["mptrain_job"], "job-1");

  const std::string foreign = R"({"mptrain_job": "job-9/uid-z", "mptrain_owner": "mallory"})";
  std::ofstream(dir + "/config.json", std::ios::trunc) << foreign;
  config.overwrite_output = true;  // Replaces the job's own checkpoint; never mallory's file.
  RecordingObserver again;
  ASSERT_TRUE(Train(config, &again).ok());
  std::ifstream kept(dir + "/config.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), foreign);
  ASSERT_EQ(again.warnings.size(), 1u);
  EXPECT_NE(again.warnings[0].find("config.json not written"), std::string::npos)
      << again.warnings[0];
}

// Sampling: after each evaluation (rank 0), greedy (top_k 1) continues the learned period;
// temperature / top-k draws are a function of the seed and the step.
TEST(GptTraining, SamplesAfterEachEvaluation_GreedyContinuesThePeriod) {
  TrainingConfig config = TinyGpt(DType::kF32);
  config.steps = 60;
  config.eval.every = 30;
  config.sample.enabled = true;
  config.sample.prompt = {5, 6};
  config.sample.max_new_tokens = 12;  // Past the context of 8: the window slides.
  config.sample.top_k = 1;
  RecordingObserver observer;
  ASSERT_TRUE(Train(config, &observer).ok());
  ASSERT_EQ(observer.samples.size(), 2u);
  EXPECT_EQ(observer.samples[0].first, 30);
  EXPECT_EQ(observer.samples[1].first, 60);
  EXPECT_EQ(observer.samples[1].second, "5 6 0 1 2 3 4 5 6 0 1 2 3 4");

  config.sample.top_k = 3;
  config.sample.temperature = 2.0;
  config.sample.seed = 11;
  RecordingObserver first, second;
  ASSERT_TRUE(Train(config, &first).ok());
  ASSERT_TRUE(Train(config, &second).ok());
  ASSERT_EQ(first.samples.size(), 2u);
  EXPECT_EQ(first.samples, second.samples) << "the same seed and step draw the same text";
  // Without evaluation: one sample, after the last step.
  config.eval.token_files.clear();
  RecordingObserver no_eval;
  ASSERT_TRUE(Train(config, &no_eval).ok());
  ASSERT_EQ(no_eval.samples.size(), 1u);
  EXPECT_EQ(no_eval.samples[0].first, 60);
}

// Counts the loop's stop polls (between steps, and between a sample's tokens); stops once
// `stop_after` polls were answered (0: never).
class PollCountingObserver : public RecordingObserver {
 public:
  explicit PollCountingObserver(int64_t stop_after = 0) : stop_after_(stop_after) {}
  bool ShouldStop() override { return stop_after_ > 0 && ++polls > stop_after_; }
  std::string StopReason() override { return "the test stopped it"; }
  int64_t polls = 0;

 private:
  int64_t stop_after_;
};

// Every rank generates the sample (rank 0 shows it): none waits in the next collective while
// rank 0 alone samples, which took longer than collective_timeout_s for thousands of tokens
// and failed the job naming rank 0. Rank 1's polls between tokens show it sampled.
TEST(GptTraining, TwoRanks_BothGenerateTheSample_RankZeroShowsIt) {
  TrainingConfig config = TinyGpt(DType::kF32);
  config.world_size = 2;
  config.steps = 4;
  config.eval.token_files.clear();
  config.sample.enabled = true;
  config.sample.prompt = {1};
  config.sample.max_new_tokens = 40;
  PollCountingObserver observers[2] = {PollCountingObserver(1'000'000),
                                       PollCountingObserver(1'000'000)};
  const auto results = testing::RunCpuRanksOverGloo(2, [&](int rank, Backend* backend) {
    return RunTraining(config, rank, backend, &observers[rank]);
  });
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[0]->checksum, results[1]->checksum);
  ASSERT_EQ(observers[0].samples.size(), 1u);
  EXPECT_EQ(observers[1].samples.size(), 0u) << "only rank 0 shows the sample";
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_GE(observers[rank].polls, config.sample.max_new_tokens) << "rank " << rank;
  }
}

// A stop asked while the sample is being generated ends it there, not thousands of tokens later.
TEST(GptTraining, StopWhileSampling_EndsAtOnceNamingIt) {
  TrainingConfig config = TinyGpt(DType::kF32);
  config.steps = 4;
  config.eval.token_files.clear();
  config.sample.enabled = true;
  config.sample.prompt = {1};
  config.sample.max_new_tokens = 4096;
  PollCountingObserver observer(/*stop_after=*/config.steps + 10);
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  absl::StatusOr<TrainingResult> result =
      RunTraining(config, 0, &backend, &observer, "", {"job-1", "alice"});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted) << result.status();
  EXPECT_NE(result.status().message().find("stopped while sampling after step 4"),
            std::string::npos)
      << result.status();
  EXPECT_NE(result.status().message().find("the test stopped it"), std::string::npos);
  EXPECT_LT(observer.polls, 100) << "the sampling went on after the stop";
}

// Work between optimizer steps is progress the coordinator sees (a long evaluation or sample
// is not a stall): one unit after each evaluation batch and before each sampled token. A
// stop asked during an evaluation ends it after that batch, naming it.
class WorkCountingObserver : public RecordingObserver {
 public:
  explicit WorkCountingObserver(int64_t stop_after_units = 0)
      : stop_after_units_(stop_after_units) {}
  void OnWorkUnit() override { ++units; }
  bool ShouldStop() override { return stop_after_units_ > 0 && units >= stop_after_units_; }
  std::string StopReason() override { return "the test stopped it"; }
  int64_t units = 0;

 private:
  int64_t stop_after_units_;
};

TEST(GptTraining, EvaluationBatchesAndSampledTokensAreWorkUnits_AStopEndsAnEvaluation) {
  TrainingConfig config = TinyGpt(DType::kF32);  // 30 steps, 2 eval batches every 10 steps.
  config.eval.batches = 3;
  config.sample.enabled = true;
  config.sample.prompt = {1};
  config.sample.max_new_tokens = 5;
  WorkCountingObserver observer;
  ASSERT_TRUE(Train(config, &observer).ok());
  // Evaluations at steps 10, 20 and 30, each followed by a sample.
  EXPECT_EQ(observer.units, 3 * (3 + 5));

  config.sample.enabled = false;
  WorkCountingObserver stopping(/*stop_after_units=*/2);
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  absl::StatusOr<TrainingResult> result =
      RunTraining(config, 0, &backend, &stopping, "", {"job-1", "alice"});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted) << result.status();
  EXPECT_NE(result.status().message().find(
                "stopped while evaluating (2 of 3 batches): the test stopped it"),
            std::string::npos)
      << result.status();
  EXPECT_EQ(stopping.units, 2);
}

// Admission's estimate (common/resource_estimate.cc) follows what a GPT rank allocates: at
// least every byte the CPU backend handed out, within a quarter more (its fixed workspace
// aside).
TEST(GptTraining, MemoryEstimateCoversTheAllocations) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    TrainingConfig config = TinyGpt(dtype);
    config.steps = 1;
    CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
    RecordingObserver observer;
    ASSERT_TRUE(RunTraining(config, 0, &backend, &observer).ok());
    v1::JobSpec spec;
    v1::GptSpec* gpt = spec.mutable_model()->mutable_gpt();
    gpt->set_vocab_size(config.model.gpt.vocab_size);
    gpt->set_padded_vocab_size(config.model.gpt.padded_vocab_size);
    gpt->set_context_length(config.model.gpt.context_length);
    gpt->set_layers(config.model.gpt.layers);
    gpt->set_heads(config.model.gpt.heads);
    gpt->set_width(config.model.gpt.width);
    spec.set_micro_batch_size(config.micro_batch_size);
    spec.set_accumulation_steps(config.accumulation_steps);
    spec.set_precision(dtype == DType::kF32 ? v1::FP32 : v1::BF16);
    spec.set_device(v1::CPU);
    spec.mutable_optimizer()->set_kind(v1::ADAMW);
    const RankMemoryEstimate estimate = EstimateRankMemory(spec);
    const double counted = static_cast<double>(estimate.total - estimate.workspace);
    const double allocated = static_cast<double>(backend.allocated_bytes());
    EXPECT_GE(counted, allocated) << estimate.Describe();
    EXPECT_LE(counted, 1.25 * allocated) << estimate.Describe();
  }
}

}  // namespace
}  // namespace mptrain
