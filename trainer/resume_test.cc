#include "trainer/resume.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gloo_collective.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "io/npy.h"
#include "trainer/in_memory_store.h"
#include "trainer/train_loop.h"
#include "trainer/training_config_from_spec.h"

namespace mptrain {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

class NullObserver : public TrainingObserver {
 public:
  void OnStep(int64_t step, const StepTelemetry*) override { last_step = step; }
  bool ShouldStop() override { return false; }
  void OnWarning(const std::string& message) override { warnings.push_back(message); }
  int64_t last_step = 0;
  std::vector<std::string> warnings;
};

// Two CPU ranks over gloo on loopback, each given its own resume path.
struct TwoRanks {
  absl::StatusOr<TrainingResult> results[2];
  double seconds[2] = {0, 0};
  std::vector<std::string> warnings[2];
};

// `stamp`: the job's checkpoint stamp (CheckpointStamp::job), `owner` its owner's.
TwoRanks RunTwoRanks(const v1::JobSpec& spec, const std::string resume[2],
                     const std::string& stamp = "", const std::string& owner = "alice") {
  TwoRanks out;
  InMemoryKeyValueStore store;
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      GlooCollectiveOptions options;
      options.rank = rank;
      options.world_size = 2;
      options.store = &store;
      options.rendezvous_timeout_ms = 30'000;
      options.collective_timeout_ms = 30'000;
      auto collective = GlooCollective::Connect(options);
      if (!collective.ok()) {
        out.results[rank] = collective.status();
        return;
      }
      CpuBackend backend(std::move(*collective));
      NullObserver observer;
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<TrainingConfig> config = TrainingConfigFromSpec(spec);
      if (!config.ok()) {
        out.results[rank] = config.status();
        return;
      }
      out.results[rank] =
          RunTraining(*config, rank, &backend, &observer, resume[rank], CheckpointStamp{stamp, owner});
      out.warnings[rank] = observer.warnings;
      out.seconds[rank] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  for (auto& thread : ranks) thread.join();
  return out;
}

// npy data whose shards are not a multiple of the micro-batch (the data position matters),
// momentum (the optimizer state matters), a short growth interval (the scaler state matters).
v1::JobSpec ResumableSpec(const std::string& checkpoint_dir) {
  const int in = 16, out = 4, rows = 74;
  std::mt19937 generator(5);
  std::normal_distribution<float> normal;
  NpyMatrix features{rows, in, std::vector<float>(rows * in)};
  NpyMatrix targets{rows, out, std::vector<float>(rows * out)};
  for (float& v : features.values) v = normal(generator);
  for (float& v : targets.values) v = normal(generator);
  EXPECT_TRUE(WriteNpyMatrix(TempPath("resume2_x.npy"), features).ok());
  EXPECT_TRUE(WriteNpyMatrix(TempPath("resume2_y.npy"), targets).ok());
  v1::JobSpec spec;
  spec.set_name("resume");
  spec.set_world_size(2);
  spec.set_device(v1::CPU);
  spec.mutable_model()->set_input_dim(in);
  spec.mutable_model()->add_hidden_dims(12);
  spec.mutable_model()->set_output_dim(out);
  spec.mutable_data()->mutable_npy()->set_features_path(TempPath("resume2_x.npy"));
  spec.mutable_data()->mutable_npy()->set_targets_path(TempPath("resume2_y.npy"));
  spec.set_micro_batch_size(8);
  spec.set_accumulation_steps(3);
  spec.set_steps(12);
  spec.set_precision(v1::FP16);
  spec.mutable_optimizer()->set_lr(0.05);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.mutable_loss_scaler()->set_growth_interval(3);
  spec.set_checkpoint_every(5);
  spec.set_checkpoint_dir(checkpoint_dir);
  ApplyJobSpecDefaults(&spec);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  return spec;
}

TEST(LoadResumeState, OnlyRankZeroHasTheCheckpoint_BothRanksEndBitIdenticalToAnUninterruptedRun) {
  const std::string dir = TempPath("resume_rank0_only");
  ::mkdir(dir.c_str(), 0755);
  v1::JobSpec spec = ResumableSpec(dir);
  const std::string fresh[2] = {"", ""};
  TwoRanks whole = RunTwoRanks(spec, fresh);
  ASSERT_TRUE(whole.results[0].ok()) << whole.results[0].status();
  ASSERT_TRUE(whole.results[1].ok()) << whole.results[1].status();

  // Rank 1's path names nothing on its "host": it must not try to open it.
  const std::string resume[2] = {dir + "/step-00000005.safetensors",
                                 "/nonexistent/only-rank-0-has-it/step-00000005.safetensors"};
  TwoRanks resumed = RunTwoRanks(spec, resume);
  ASSERT_TRUE(resumed.results[0].ok()) << resumed.results[0].status();
  ASSERT_TRUE(resumed.results[1].ok()) << resumed.results[1].status();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(resumed.results[rank]->checksum, whole.results[rank]->checksum) << rank;
    EXPECT_EQ(resumed.results[rank]->parameters, whole.results[rank]->parameters) << rank;
    EXPECT_EQ(resumed.results[rank]->final_loss_scale, whole.results[rank]->final_loss_scale);
    EXPECT_EQ(resumed.results[rank]->skipped_steps, whole.results[rank]->skipped_steps);
  }
  EXPECT_EQ(resumed.results[0]->checksum, resumed.results[1]->checksum);
}

TEST(LoadResumeState, RankZeroCannotReadIt_FailsNamingIt_AndTheOtherRankFailsAtOnce) {
  const std::string dir = TempPath("resume_garbage");
  ::mkdir(dir.c_str(), 0755);
  const std::string garbage = dir + "/step-00000005.safetensors";
  std::ofstream(garbage) << "not a checkpoint";
  v1::JobSpec spec = ResumableSpec(dir);
  const std::string resume[2] = {garbage, "/nonexistent/step-00000005.safetensors"};
  TwoRanks run = RunTwoRanks(spec, resume);
  ASSERT_FALSE(run.results[0].ok());
  EXPECT_EQ(run.results[0].status().code(), absl::StatusCode::kInvalidArgument)
      << run.results[0].status();
  EXPECT_NE(std::string(run.results[0].status().message()).find(garbage), std::string::npos)
      << run.results[0].status();
  ASSERT_FALSE(run.results[1].ok());
  // A consequence of rank 0's error (UNAVAILABLE: the coordinator waits for the root cause).
  EXPECT_EQ(run.results[1].status().code(), absl::StatusCode::kUnavailable)
      << run.results[1].status();
  EXPECT_NE(std::string(run.results[1].status().message())
                .find("rank 0 could not read the resume checkpoint"),
            std::string::npos)
      << run.results[1].status();
  EXPECT_LT(run.seconds[1], 10.0) << "not after the 30 s collective timeout";
}

// The checkpoint the coordinator recorded is damaged on disk: rank 0 resumes from the job's
// newest older checkpoint it can read instead (never another job's file, whatever its step),
// says so, and the run still ends bit-identical to an uninterrupted one. With none left the
// job fails naming the recorded file.
TEST(LoadResumeState, RecordedCheckpointDamaged_ResumesFromTheJobsNewestOlderOne) {
  const std::string dir = TempPath("resume_fallback");
  const std::string other_dir = TempPath("resume_fallback_other_job");
  ::mkdir(dir.c_str(), 0755);
  ::mkdir(other_dir.c_str(), 0755);
  v1::JobSpec spec = ResumableSpec(dir);
  spec.set_checkpoint_every(2);
  spec.set_keep_checkpoints(-1);
  const std::string fresh[2] = {"", ""};
  TwoRanks whole = RunTwoRanks(spec, fresh, "job-0001/uid-a");
  ASSERT_TRUE(whole.results[0].ok()) << whole.results[0].status();
  v1::JobSpec other = spec;
  other.set_checkpoint_dir(other_dir);
  TwoRanks other_job = RunTwoRanks(other, fresh, "job-0001/uid-b");  // Same id, another job.
  ASSERT_TRUE(other_job.results[0].ok()) << other_job.results[0].status();

  const std::string recorded = dir + "/step-00000008.safetensors";
  std::ofstream(recorded, std::ios::trunc) << "damaged";
  // Step 6 is now another job's file (the same bytes but its stamp): not a candidate.
  ASSERT_EQ(std::rename((other_dir + "/step-00000006.safetensors").c_str(),
                        (dir + "/step-00000006.safetensors").c_str()),
            0);
  const std::string resume[2] = {recorded, "/nonexistent/step-00000008.safetensors"};
  // On its way the resumed run meets the other job's file at its own step 6: never replaced
  // unasked, even for the same owner (and never for another owner: checkpoint_test): that
  // checkpoint is left out, with a warning, and the run goes on.
  TwoRanks refused = RunTwoRanks(spec, resume, "job-0001/uid-a");
  ASSERT_TRUE(refused.results[0].ok()) << refused.results[0].status();
  ASSERT_EQ(refused.warnings[0].size(), 2u);
  EXPECT_NE(refused.warnings[0][1].find("checkpoint of step 6 not written: " + dir +
                                        "/step-00000006.safetensors holds another job's"),
            std::string::npos)
      << refused.warnings[0][1];
  EXPECT_FALSE(CheckpointWrittenByJob(dir + "/step-00000006.safetensors", "job-0001/uid-a"));
  // With overwrite_output its owner's file may go. (The run above replaced the damaged step 8:
  // damaged again.)
  std::ofstream(recorded, std::ios::trunc) << "damaged";
  spec.set_overwrite_output(true);
  TwoRanks resumed = RunTwoRanks(spec, resume, "job-0001/uid-a");
  ASSERT_TRUE(resumed.results[0].ok()) << resumed.results[0].status();
  ASSERT_TRUE(resumed.results[1].ok()) << resumed.results[1].status();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(resumed.results[rank]->parameters, whole.results[rank]->parameters) << rank;
    EXPECT_EQ(resumed.results[rank]->final_loss_scale, whole.results[rank]->final_loss_scale);
    EXPECT_EQ(resumed.results[rank]->skipped_steps, whole.results[rank]->skipped_steps);
  }
  ASSERT_EQ(resumed.warnings[0].size(), 1u);
  EXPECT_NE(resumed.warnings[0][0].find("resumed from " + dir + "/step-00000004.safetensors"),
            std::string::npos)
      << resumed.warnings[0][0];
  EXPECT_NE(resumed.warnings[0][0].find(recorded), std::string::npos) << resumed.warnings[0][0];
  EXPECT_TRUE(resumed.warnings[1].empty());

  // Nothing of the job's below the recorded step: the recorded file's error, and how many more
  // were tried.
  const std::string lonely_dir = TempPath("resume_fallback_none");
  ::mkdir(lonely_dir.c_str(), 0755);
  const std::string lonely = lonely_dir + "/step-00000008.safetensors";
  std::ofstream(lonely, std::ios::trunc) << "damaged";
  ASSERT_EQ(std::rename((dir + "/step-00000002.safetensors").c_str(),
                        (lonely_dir + "/step-00000002.safetensors").c_str()),
            0);
  std::ofstream(lonely_dir + "/step-00000002.safetensors", std::ios::trunc) << "damaged too";
  const std::string lonely_resume[2] = {lonely, lonely};
  TwoRanks failed = RunTwoRanks(spec, lonely_resume, "job-0001/uid-a");
  ASSERT_FALSE(failed.results[0].ok());
  EXPECT_NE(std::string(failed.results[0].status().message()).find(lonely), std::string::npos)
      << failed.results[0].status();
  ASSERT_FALSE(failed.results[1].ok());
}

// The attack: another tenant's job (same step, a perfectly valid checkpoint) put its
// file where this job's recorded checkpoint was. The restart must not go on from its
// parameters: the file is skipped (the warning says so without echoing its stamp) and the job's
// own older checkpoint is taken; nor is the file replaced when the run reaches that step again
// (it is someone else's): that checkpoint is left out with a warning. The run ends
// bit-identical to an uninterrupted one.
TEST(LoadResumeState, RecordedCheckpointIsAnotherJobsFile_IsIgnoredAndTheJobsOwnOlderOneTaken) {
  const std::string dir = TempPath("resume_foreign");
  const std::string other_dir = TempPath("resume_foreign_other");
  ::mkdir(dir.c_str(), 0755);
  ::mkdir(other_dir.c_str(), 0755);
  v1::JobSpec spec = ResumableSpec(dir);
  spec.set_checkpoint_every(2);
  spec.set_keep_checkpoints(-1);
  const std::string fresh[2] = {"", ""};
  TwoRanks whole = RunTwoRanks(spec, fresh, "job-0019/uid-bob", "bob");
  ASSERT_TRUE(whole.results[0].ok()) << whole.results[0].status();
  v1::JobSpec other = spec;
  other.set_checkpoint_dir(other_dir);
  other.set_seed(spec.seed() + 1);  // Other parameters: taking them would show.
  TwoRanks alices = RunTwoRanks(other, fresh, "job-0020/uid-alice", "alice");
  ASSERT_TRUE(alices.results[0].ok()) << alices.results[0].status();

  const std::string recorded = dir + "/step-00000008.safetensors";
  ASSERT_EQ(std::rename((other_dir + "/step-00000008.safetensors").c_str(), recorded.c_str()), 0);
  const std::string resume[2] = {recorded, "/nonexistent/step-00000008.safetensors"};
  TwoRanks resumed = RunTwoRanks(spec, resume, "job-0019/uid-bob", "bob");
  ASSERT_TRUE(resumed.results[0].ok()) << resumed.results[0].status();
  ASSERT_TRUE(resumed.results[1].ok()) << resumed.results[1].status();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(resumed.results[rank]->parameters, whole.results[rank]->parameters)
        << "resumed from its own step 6, not from alice's parameters: rank " << rank;
  }
  EXPECT_EQ(CheckpointOwnership(recorded, {"job-0020/uid-alice", "alice"}),
            FileOwnership::kThisJob)
      << "alice's file is still hers: never replaced";
  ASSERT_EQ(resumed.warnings[0].size(), 2u);
  EXPECT_NE(resumed.warnings[0][1].find("checkpoint of step 8 not written: " + recorded +
                                        " holds a file no job of this owner wrote"),
            std::string::npos)
      << resumed.warnings[0][1];
  const std::string& warning = resumed.warnings[0][0];
  EXPECT_NE(warning.find("resumed from " + dir + "/step-00000006.safetensors"), std::string::npos)
      << warning;
  EXPECT_NE(warning.find(recorded + " is not a checkpoint of this job"), std::string::npos)
      << warning;
  EXPECT_EQ(warning.find("alice"), std::string::npos) << "the file's stamp is not echoed";
  EXPECT_EQ(warning.find("job-0020"), std::string::npos) << "the file's stamp is not echoed";
}

TEST(ResumeHeader, RoundTripsEveryFieldExactly) {
  TrainingCheckpoint checkpoint;
  checkpoint.step = (int64_t{1} << 40) + 3;
  checkpoint.step_state.scale = std::ldexp(1.0f, -20) * 1.5f;
  checkpoint.step_state.growth_tracker = 2'000'000'001;
  checkpoint.step_state.skipped_total = 65'537;
  checkpoint.step_state.steps_done = (int64_t{1} << 62) + 1;
  auto decoded = DecodeResumeHeader(EncodeResumeHeader(&checkpoint, 1234), 1234);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->step, checkpoint.step);
  EXPECT_EQ(decoded->step_state.scale, checkpoint.step_state.scale);
  EXPECT_EQ(decoded->step_state.growth_tracker, checkpoint.step_state.growth_tracker);
  EXPECT_EQ(decoded->step_state.skipped_total, checkpoint.step_state.skipped_total);
  EXPECT_EQ(decoded->step_state.steps_done, checkpoint.step_state.steps_done);
}

TEST(ResumeHeader, RefusesFailuresMismatchesAndMalformedPieces) {
  EXPECT_EQ(DecodeResumeHeader(EncodeResumeHeader(nullptr, 10), 10).status().code(),
            absl::StatusCode::kUnavailable);
  TrainingCheckpoint checkpoint;
  checkpoint.step_state.scale = 1;
  EXPECT_EQ(DecodeResumeHeader(EncodeResumeHeader(&checkpoint, 10), 11).status().code(),
            absl::StatusCode::kInternal)
      << "another model";
  for (float bad : {NAN, 1.5f, 70000.0f, -1.0f}) {
    std::vector<float> header = EncodeResumeHeader(&checkpoint, 10);
    header[2] = bad;
    EXPECT_EQ(DecodeResumeHeader(header, 10).status().code(), absl::StatusCode::kInternal) << bad;
  }
  checkpoint.step_state.scale = INFINITY;
  EXPECT_EQ(DecodeResumeHeader(EncodeResumeHeader(&checkpoint, 10), 10).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(DecodeResumeHeader(std::vector<float>(3, 0.0f), 10).status().code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace mptrain
