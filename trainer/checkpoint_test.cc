#include "trainer/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "io/safetensors.h"
#include "trainer/parameter_layout.h"

namespace mptrain {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

// One Linear layer 3 -> 2: weight [2, 3] at 0, bias [2] at 6.
ParameterLayout SmallLayout() {
  ParameterLayout layout;
  layout.layers.push_back(LayerLayout{3, 2, 0, 6});
  layout.total = 8;
  return layout;
}

TrainingCheckpoint SmallCheckpoint() {
  TrainingCheckpoint checkpoint;
  checkpoint.step = 12;
  checkpoint.data_cursor = 5;
  checkpoint.parameters = {0.5f, -1, 2, 3, 4, 5, 6, 7};
  checkpoint.optimizer_state["momentum"] = {0.25f, 0, 0, 1, 0, 0, 0, -2};
  checkpoint.step_state.scale = 0x1.8p+14f;
  checkpoint.step_state.growth_tracker = 3;
  checkpoint.step_state.skipped_total = 2;
  checkpoint.step_state.steps_done = 12;
  return checkpoint;
}

// The metadata WriteTrainingCheckpoint writes for SmallCheckpoint(), for tests to spoil.
std::map<std::string, std::string> ValidMetadata() {
  return {{"format", "mptrain-checkpoint-v1"}, {"step", "12"},         {"data_cursor", "5"},
          {"scale", "0x1.8p+14"},              {"growth_tracker", "3"}, {"skipped_total", "2"},
          {"steps_done", "12"}};
}

// Writes SmallCheckpoint()'s tensors with `metadata`; returns the path.
std::string WriteWithMetadata(const std::string& name,
                              const std::map<std::string, std::string>& metadata) {
  const ParameterLayout layout = SmallLayout();
  const TrainingCheckpoint checkpoint = SmallCheckpoint();
  TensorMap tensors = ParametersToTensors(layout, checkpoint.parameters);
  const std::vector<float>& momentum = checkpoint.optimizer_state.at("momentum");
  for (auto& [tensor_name, tensor] : ParametersToTensors(layout, momentum)) {
    tensors["momentum." + tensor_name] = tensor;
  }
  const std::string path = TempPath(name);
  EXPECT_TRUE(WriteSafetensors(path, tensors, metadata).ok());
  return path;
}

void ExpectInvalid(const absl::Status& status, const std::string& path,
                   const std::string& fragment) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  const std::string message(status.message());
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(fragment), std::string::npos) << "no '" << fragment << "' in " << message;
}

// Expects ReadTrainingCheckpoint to refuse the checkpoint whose metadata `key` is `value`.
void ExpectMetadataRefused(const std::string& key, const std::string& value,
                           const std::string& fragment) {
  std::map<std::string, std::string> metadata = ValidMetadata();
  metadata[key] = value;
  const std::string path = WriteWithMetadata("bad_" + key + ".safetensors", metadata);
  const absl::Status status = ReadTrainingCheckpoint(path, SmallLayout()).status();
  ExpectInvalid(status, path, fragment);
  // The value is the file's content: never echoed.
  std::string message(status.message());
  message.erase(0, message.find(path) + path.size());
  if (value.size() >= 2) {
    EXPECT_EQ(message.find(value), std::string::npos) << "the error echoes '" << value << "'";
  }
}

TEST(Checkpoint, WriteThenRead_RoundTripsEverything) {
  const std::string path = TempPath("roundtrip.safetensors");
  const TrainingCheckpoint written = SmallCheckpoint();
  ASSERT_TRUE(WriteTrainingCheckpoint(path, SmallLayout(), written).ok());
  auto read = ReadTrainingCheckpoint(path, SmallLayout());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->step, 12);
  EXPECT_EQ(read->data_cursor, 5);
  EXPECT_EQ(read->parameters, written.parameters);
  EXPECT_EQ(read->optimizer_state, written.optimizer_state);
  EXPECT_EQ(read->step_state.scale, written.step_state.scale);
  EXPECT_EQ(read->step_state.growth_tracker, 3);
  EXPECT_EQ(read->step_state.skipped_total, 2);
  EXPECT_EQ(read->step_state.steps_done, 12);
}

TEST(Checkpoint, JobStamp_TellsTheJobsOwnFilesFromOthers) {
  const std::string path = TempPath("stamped.safetensors");
  TrainingCheckpoint written = SmallCheckpoint();
  written.job_id = "job-0042";
  SafetensorsWriteOptions replace;
  replace.replace_existing = true;
  ASSERT_TRUE(WriteTrainingCheckpoint(path, SmallLayout(), written, replace).ok());
  EXPECT_TRUE(CheckpointWrittenByJob(path, "job-0042"));
  EXPECT_FALSE(CheckpointWrittenByJob(path, "job-0043"));
  EXPECT_FALSE(CheckpointWrittenByJob(path, ""));
  EXPECT_FALSE(CheckpointWrittenByJob(TempPath("missing.safetensors"), "job-0042"));
  const std::string unstamped = TempPath("unstamped.safetensors");
  ASSERT_TRUE(WriteTrainingCheckpoint(unstamped, SmallLayout(), SmallCheckpoint(), replace).ok());
  EXPECT_FALSE(CheckpointWrittenByJob(unstamped, "job-0042"));
  EXPECT_TRUE(ReadTrainingCheckpoint(path, SmallLayout()).ok()) << "the stamp reads back fine";
}

// Whose file is at a path decides whether a job may replace it: its own always, its owner's
// other jobs' only with overwrite_output, another owner's or an unstamped file never (a
// tenant's overwrite_output once replaced another tenant's checkpoint and poisoned its restart).
TEST(Checkpoint, Ownership_OnlyTheJobAndWithOverwriteItsOwnerMayReplaceAFile) {
  SafetensorsWriteOptions replace;
  replace.replace_existing = true;
  const std::string bobs = TempPath("bobs.safetensors");
  TrainingCheckpoint written = SmallCheckpoint();
  written.job_id = "job-0019/uid-bob";
  written.owner = "bob";
  ASSERT_TRUE(WriteTrainingCheckpoint(bobs, SmallLayout(), written, replace).ok());
  auto read = ReadTrainingCheckpoint(bobs, SmallLayout());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->job_id, "job-0019/uid-bob");
  EXPECT_EQ(read->owner, "bob");

  EXPECT_EQ(CheckpointOwnership(bobs, {"job-0019/uid-bob", "bob"}), FileOwnership::kThisJob);
  EXPECT_EQ(CheckpointOwnership(bobs, {"job-0020/uid-x", "bob"}), FileOwnership::kSameOwner);
  EXPECT_EQ(CheckpointOwnership(bobs, {"job-0021/uid-y", "alice"}), FileOwnership::kSomeoneElse);
  EXPECT_EQ(CheckpointOwnership(TempPath("nobody.safetensors"), {"job-1/u", "alice"}),
            FileOwnership::kAbsent);
  const std::string unstamped = TempPath("unstamped_owner.safetensors");
  ASSERT_TRUE(WriteTrainingCheckpoint(unstamped, SmallLayout(), SmallCheckpoint(), replace).ok());
  EXPECT_EQ(CheckpointOwnership(unstamped, {"job-1/u", "alice"}), FileOwnership::kSomeoneElse);
  EXPECT_EQ(CheckpointOwnership(unstamped, {"", ""}), FileOwnership::kThisJob)
      << "a run with no stamp (a library caller) owns unstamped files";
  const std::string garbage = TempPath("garbage_owner.safetensors");
  std::ofstream(garbage) << "not a checkpoint";
  EXPECT_EQ(CheckpointOwnership(garbage, {"job-1/u", "alice"}), FileOwnership::kUnreadable);
  const std::string link = TempPath("link_owner.safetensors");
  ASSERT_EQ(::symlink(bobs.c_str(), link.c_str()), 0);
  EXPECT_EQ(CheckpointOwnership(link, {"job-0019/uid-bob", "bob"}), FileOwnership::kSomeoneElse)
      << "a link is never followed";

  EXPECT_TRUE(MayReplace(FileOwnership::kAbsent, false, false));
  EXPECT_TRUE(MayReplace(FileOwnership::kThisJob, false, false));
  EXPECT_FALSE(MayReplace(FileOwnership::kSameOwner, false, true));
  EXPECT_TRUE(MayReplace(FileOwnership::kSameOwner, true, false));
  EXPECT_FALSE(MayReplace(FileOwnership::kSomeoneElse, true, true)) << "whatever the spec says";
  EXPECT_FALSE(MayReplace(FileOwnership::kUnreadable, true, false));
  EXPECT_TRUE(MayReplace(FileOwnership::kUnreadable, false, true));
}

// A job keeps its newest checkpoints and the ones a restart may need; nothing that is not its
// own goes, whatever it is named.
TEST(Checkpoint, Retention_KeepsTheNewestAndTheAcknowledged_LeavesEverythingElse) {
  const std::string dir = TempPath("retention");
  ASSERT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir + "/elsewhere").c_str()), 0);
  const ParameterLayout layout = SmallLayout();
  TrainingCheckpoint mine = SmallCheckpoint();
  mine.job_id = "job-0007/aaaa";
  auto write = [&](int64_t step, const TrainingCheckpoint& checkpoint) {
    ASSERT_TRUE(WriteTrainingCheckpoint(CheckpointPath(dir, step), layout, checkpoint).ok());
  };
  // An earlier attempt's files, one of them past where this attempt is.
  for (int64_t step : {10, 20, 30, 40, 90}) write(step, mine);
  TrainingCheckpoint theirs = SmallCheckpoint();
  theirs.job_id = "job-0007/bbbb";  // The same id from another coordinator: not ours.
  write(5, theirs);
  write(6, SmallCheckpoint());  // Unstamped.
  // Named like ours but not quite (a ninth digit), and a link to one of ours elsewhere.
  ASSERT_TRUE(WriteTrainingCheckpoint(dir + "/step-000000001.safetensors", layout, mine).ok());
  ASSERT_TRUE(WriteTrainingCheckpoint(dir + "/elsewhere/kept.safetensors", layout, mine).ok());
  ASSERT_EQ(
      symlink((dir + "/elsewhere/kept.safetensors").c_str(), CheckpointPath(dir, 2).c_str()), 0);
  auto exists = [](const std::string& path) {
    struct stat info;
    return lstat(path.c_str(), &info) == 0;
  };

  CheckpointRetention retention(dir, "job-0007/aaaa", 2, /*no_symlinks=*/true);
  // This attempt wrote step 50; the coordinator has heard of step 20 only: 20 and newer stay.
  write(50, mine);
  auto removed = retention.Written(50, /*protected_from=*/20);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 1);
  EXPECT_FALSE(exists(CheckpointPath(dir, 10)));
  for (int64_t step : {20, 30, 40, 50, 90}) EXPECT_TRUE(exists(CheckpointPath(dir, step))) << step;
  // Now it knows 60: the newest two at or below 60 stay; 90, ahead of this attempt, too.
  write(60, mine);
  removed = retention.Written(60, 60);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 3);
  for (int64_t step : {20, 30, 40}) EXPECT_FALSE(exists(CheckpointPath(dir, step))) << step;
  for (int64_t step : {50, 60, 90, 5, 6, 2}) EXPECT_TRUE(exists(CheckpointPath(dir, step))) << step;
  EXPECT_TRUE(exists(dir + "/step-000000001.safetensors"));
  EXPECT_TRUE(exists(dir + "/elsewhere/kept.safetensors"));
  // A file replaced by someone else's since the directory was read is not removed.
  write(70, mine);
  ASSERT_TRUE(retention.Written(70, 70).ok());
  EXPECT_FALSE(exists(CheckpointPath(dir, 50)));
  write(60, theirs);
  write(80, mine);
  removed = retention.Written(80, 80);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, 0);
  EXPECT_TRUE(exists(CheckpointPath(dir, 60))) << "another job's file went";

  // Keep every one; no stamp; no directory.
  write(100, mine);
  CheckpointRetention all(dir, "job-0007/aaaa", -1, true);
  EXPECT_EQ(*all.Written(100, 100), 0);
  CheckpointRetention unstamped(dir, "", 1, true);
  EXPECT_EQ(*unstamped.Written(100, 100), 0);
  EXPECT_TRUE(exists(CheckpointPath(dir, 70)));
  CheckpointRetention missing(dir + "/missing", "job-0007/aaaa", 2, true);
  EXPECT_EQ(missing.Written(1, 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Checkpoint, ReadTrainingCheckpoint_NaNParameter_IsInvalidNamingFileAndTensor) {
  TrainingCheckpoint checkpoint = SmallCheckpoint();
  checkpoint.parameters[7] = std::numeric_limits<float>::quiet_NaN();  // bias[1]
  const std::string path = TempPath("nan_parameter.safetensors");
  ASSERT_TRUE(WriteTrainingCheckpoint(path, SmallLayout(), checkpoint).ok());
  ExpectInvalid(ReadTrainingCheckpoint(path, SmallLayout()).status(), path,
                "tensor 'layers.0.bias' holds a NaN or infinity at index 1");
}

TEST(Checkpoint, BatchNormRunningStatistics_RoundTrip_AndANegativeVarianceIsRefused) {
  const ParameterLayout layout = MakeParameterLayout({3, 2, 1}, NormKind::kBatchNorm);
  TrainingCheckpoint checkpoint;
  checkpoint.step = 4;
  checkpoint.parameters = InitialLayoutParameters(layout, 1);
  checkpoint.optimizer_state["momentum"] = std::vector<float>(layout.total, 0.5f);
  checkpoint.step_state.scale = 1024;
  checkpoint.buffers = {0.25f, -0.5f, /*running_var*/ 1.5f, 0.75f};
  checkpoint.num_batches_tracked = 16;
  const std::string path = TempPath("bn_stats.safetensors");
  ASSERT_TRUE(WriteTrainingCheckpoint(path, layout, checkpoint).ok());
  auto read = ReadTrainingCheckpoint(path, layout);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->buffers, checkpoint.buffers);

  checkpoint.buffers[3] = -1e-12f;  // What a constant feature can leave: harmless, kept.
  const std::string tiny = TempPath("bn_tiny_negative_var.safetensors");
  ASSERT_TRUE(WriteTrainingCheckpoint(tiny, layout, checkpoint).ok());
  EXPECT_TRUE(ReadTrainingCheckpoint(tiny, layout).ok());

  checkpoint.buffers[3] = -0.125f;  // A hostile file: sqrt(running_var + eps) of a negative.
  const std::string bad = TempPath("bn_negative_var.safetensors");
  ASSERT_TRUE(WriteTrainingCheckpoint(bad, layout, checkpoint).ok());
  ExpectInvalid(ReadTrainingCheckpoint(bad, layout).status(), bad,
                "tensor norms.0.running_var has a value at or below -eps");
}

TEST(Checkpoint, ReadTrainingCheckpoint_InfMomentum_IsInvalidNamingFileAndTensor) {
  TrainingCheckpoint checkpoint = SmallCheckpoint();
  // weight[1][1]
  checkpoint.optimizer_state["momentum"][4] = std::numeric_limits<float>::infinity();
  const std::string path = TempPath("inf_momentum.safetensors");
  ASSERT_TRUE(WriteTrainingCheckpoint(path, SmallLayout(), checkpoint).ok());
  ExpectInvalid(ReadTrainingCheckpoint(path, SmallLayout()).status(), path,
                "tensor 'momentum.layers.0.weight' holds a NaN or infinity at index 4");
}

TEST(Checkpoint, AdamState_RoundTrips_AndAMissingBufferIsNamed) {
  TrainingCheckpoint checkpoint = SmallCheckpoint();
  checkpoint.optimizer_state.clear();
  checkpoint.optimizer_state["exp_avg"] = {1, 2, 3, 4, 5, 6, 7, 8};
  checkpoint.optimizer_state["exp_avg_sq"] = {0.5f, 0, 0, 0, 0, 0, 0, 9};
  const std::string path = TempPath("adam.safetensors");
  ASSERT_TRUE(WriteTrainingCheckpoint(path, SmallLayout(), checkpoint).ok());
  auto read = ReadTrainingCheckpoint(path, SmallLayout(), {"exp_avg", "exp_avg_sq"});
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->optimizer_state, checkpoint.optimizer_state);
  // An SGD run cannot resume from it: no momentum.
  ExpectInvalid(ReadTrainingCheckpoint(path, SmallLayout(), {"momentum"}).status(), path,
                "(momentum): tensor layers.0.weight is missing");
}

TEST(Checkpoint, ReadTrainingCheckpoint_Directory_IsInvalidNotARegularFile) {
  const std::string path = TempPath("checkpoint_dir.safetensors");
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  ExpectInvalid(ReadTrainingCheckpoint(path, SmallLayout()).status(), path, "not a regular file");
}

TEST(Checkpoint, ReadTrainingCheckpoint_MissingKey_IsInvalidNamingIt) {
  std::map<std::string, std::string> metadata = ValidMetadata();
  metadata.erase("data_cursor");
  const std::string path = WriteWithMetadata("no_cursor.safetensors", metadata);
  ExpectInvalid(ReadTrainingCheckpoint(path, SmallLayout()).status(), path,
                "no data_cursor in __metadata__");
}

TEST(Checkpoint, ReadTrainingCheckpoint_NegativeStepOrCursor_IsInvalid) {
  ExpectMetadataRefused("step", "-1", "__metadata__ step is out of range");
  ExpectMetadataRefused("data_cursor", "-5", "__metadata__ data_cursor is out of range");
  ExpectMetadataRefused("skipped_total", "-2", "__metadata__ skipped_total is ");
}

TEST(Checkpoint, ReadTrainingCheckpoint_MalformedInteger_IsInvalidNamingKey) {
  ExpectMetadataRefused("step", "12abc", "__metadata__ step is not a decimal integer");
  ExpectMetadataRefused("step", " 12", "__metadata__ step is not a decimal integer");
  ExpectMetadataRefused("step", "+12", "__metadata__ step is not a decimal integer");
  ExpectMetadataRefused("step", "", "__metadata__ step is not a decimal integer");
  ExpectMetadataRefused("steps_done", "1e3", "__metadata__ steps_done is ");
}

TEST(Checkpoint, ReadTrainingCheckpoint_OtherFormat_IsInvalidWithoutEchoingIt) {
  ExpectMetadataRefused("format", "SECRET-format-of-another-file",
                        "not a training checkpoint (its format is not mptrain-checkpoint-v1)");
}

TEST(Checkpoint, ReadTrainingCheckpoint_IntegerOverflow_IsInvalidNamingKey) {
  ExpectMetadataRefused("step", "99999999999999999999",
                        "__metadata__ step is too large for int64");
  ExpectMetadataRefused("growth_tracker", "2147483648",
                        "__metadata__ growth_tracker is out of range");
}

TEST(Checkpoint, ReadTrainingCheckpoint_BadScale_IsInvalidNamingKey) {
  ExpectMetadataRefused("scale", "nan", "__metadata__ scale is ");
  ExpectMetadataRefused("scale", "inf", "__metadata__ scale is ");
  ExpectMetadataRefused("scale", "0x0p+0", "__metadata__ scale is ");
  ExpectMetadataRefused("scale", "-0x1p+0", "__metadata__ scale is ");
  ExpectMetadataRefused("scale", "0x1p+200", "finite float > 0");  // Overflows float.
  ExpectMetadataRefused("scale", "0x1p+0junk", "__metadata__ scale is not a number");
}

TEST(Checkpoint, WriteTrainingCheckpoint_NoReplaceOverExisting_IsAlreadyExists) {
  const std::string path = TempPath("no_replace.safetensors");
  ASSERT_TRUE(WriteTrainingCheckpoint(path, SmallLayout(), SmallCheckpoint()).ok());
  SafetensorsWriteOptions options;
  options.replace_existing = false;
  absl::Status status = WriteTrainingCheckpoint(path, SmallLayout(), SmallCheckpoint(), options);
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists) << status;
  EXPECT_NE(std::string(status.message()).find(path), std::string::npos) << status;
}

TEST(Checkpoint, ReadInitialParameters_Finite_ReturnsFlatParameters) {
  const std::vector<float> parameters = {1, 2, 3, 4, 5, 6, -7, 8};
  const std::string path = TempPath("init.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, ParametersToTensors(SmallLayout(), parameters)).ok());
  auto read = ReadInitialParameters(path, SmallLayout());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, parameters);
}

TEST(Checkpoint, ReadInitialParameters_NaN_IsInvalidNamingFileAndTensor) {
  std::vector<float> parameters = {1, 2, 3, 4, 5, 6, 7, 8};
  parameters[2] = std::numeric_limits<float>::quiet_NaN();  // weight[0][2]
  const std::string path = TempPath("init_nan.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, ParametersToTensors(SmallLayout(), parameters)).ok());
  ExpectInvalid(ReadInitialParameters(path, SmallLayout()).status(), path,
                "tensor 'layers.0.weight' holds a NaN or infinity at index 2");
}

TEST(Checkpoint, ReadInitialParameters_Directory_IsInvalidNotARegularFile) {
  const std::string path = TempPath("init_dir.safetensors");
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  ExpectInvalid(ReadInitialParameters(path, SmallLayout()).status(), path, "not a regular file");
}

// The model's names may be said; a name only the file holds may not.
TEST(Checkpoint, ReadInitialParameters_ForeignTensorName_IsNotQuoted) {
  TensorMap tensors = ParametersToTensors(SmallLayout(), std::vector<float>(8, 1));
  tensors["SECRET.tensor.of.another.user"] = {{1}, {std::numeric_limits<float>::quiet_NaN()}};
  const std::string path = TempPath("init_foreign.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  const absl::Status status = ReadInitialParameters(path, SmallLayout()).status();
  ExpectInvalid(status, path, "tensor #0 (in name order) holds a NaN or infinity at index 0");
  EXPECT_EQ(std::string(status.message()).find("SECRET"), std::string::npos) << status;
}

// TensorNames lists exactly the names the writers give, without copying values.
TEST(Checkpoint, TensorNames_AreTheWrittenNames) {
  for (NormKind norm : {NormKind::kNone, NormKind::kLayerNorm, NormKind::kBatchNorm}) {
    const ParameterLayout layout = MakeParameterLayout({3, 4, 2}, norm);
    std::set<std::string> written;
    for (const auto& [name, tensor] :
         ParametersToTensors(layout, std::vector<float>(layout.total))) {
      written.insert(name);
      written.insert("momentum." + name);
    }
    for (const auto& [name, tensor] :
         BuffersToTensors(layout, std::vector<float>(layout.buffers_total), 0)) {
      written.insert(name);
      written.insert("momentum." + name);
    }
    EXPECT_EQ(TensorNames(layout, {"momentum"}), written);
  }
}

TEST(Checkpoint, ReadInitialParameters_WrongShape_IsInvalidNamingTensor) {
  TensorMap tensors = ParametersToTensors(SmallLayout(), std::vector<float>(8, 1));
  tensors["layers.0.bias"] = {{3}, {1, 2, 3}};
  const std::string path = TempPath("init_shape.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  ExpectInvalid(ReadInitialParameters(path, SmallLayout()).status(), path,
                "tensor layers.0.bias does not have the model's shape [2]");
}

}  // namespace
}  // namespace mptrain
