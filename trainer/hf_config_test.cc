// config.json beside a GPT's output checkpoint: GPT2Config's fields with our model's values,
// and the tenancy rule of trainer/checkpoint.h (MayReplace) for an existing file: this job's
// own is replaced, its owner's other jobs' only with overwrite_output, a user's, another
// owner's, a link or an unreadable file never.

#include "trainer/hf_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace mptrain {
namespace {

std::string TempDir(const std::string& name) {
  const std::string dir =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

GptConfig SmallGpt() {
  GptConfig gpt;
  gpt.vocab_size = 50;
  gpt.padded_vocab_size = 64;
  gpt.context_length = 24;
  gpt.layers = 3;
  gpt.heads = 4;
  gpt.width = 32;
  return gpt;
}

const CheckpointStamp kAlice{"job-0007/uid-a1", "alice"};

TEST(HfConfig, WrittenBesideTheCheckpoint_WithGpt2ConfigFieldsAndTheModelsValues) {
  const std::string dir = TempDir("fields");
  const std::string checkpoint = dir + "/model.safetensors";
  ASSERT_EQ(HfConfigPath(checkpoint), dir + "/config.json");
  ASSERT_TRUE(WriteGptHfConfig(checkpoint, SmallGpt(), kAlice, false, true).ok());
  const nlohmann::json config = nlohmann::json::parse(ReadText(dir + "/config.json"));
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(config["vocab_size"], 50) << "V: the checkpoint's wte rows, not the padded 64";
  EXPECT_EQ(config["mptrain_padded_vocab_size"], 64);
  EXPECT_EQ(config["n_positions"], 24);
  EXPECT_EQ(config["n_ctx"], 24);
  EXPECT_EQ(config["n_embd"], 32);
  EXPECT_EQ(config["n_layer"], 3);
  EXPECT_EQ(config["n_head"], 4);
  EXPECT_TRUE(config.contains("n_inner") && config["n_inner"].is_null()) << "4 * n_embd";
  EXPECT_EQ(config["activation_function"], "gelu_new");
  EXPECT_EQ(config["layer_norm_epsilon"].get<double>(), 1e-5);
  EXPECT_EQ(config["initializer_range"].get<double>(), 0.02);
  for (const char* dropout : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) {
    EXPECT_EQ(config[dropout].get<double>(), 0.0) << dropout;
  }
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["scale_attn_weights"], true);
  EXPECT_EQ(config["scale_attn_by_inverse_layer_idx"], false);
  EXPECT_EQ(config["reorder_and_upcast_attn"], false);
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["mptrain_job"], "job-0007/uid-a1");
  EXPECT_EQ(config["mptrain_owner"], "alice");
  // Nothing left behind: the temporary file was renamed.
  EXPECT_NE(access((dir + "/config.json.tmp." + std::to_string(getpid())).c_str(), F_OK), 0);

  // Without padding, Vp is V.
  GptConfig unpadded = SmallGpt();
  unpadded.padded_vocab_size = 0;
  EXPECT_EQ(nlohmann::json::parse(GptHfConfigJson(unpadded, {}))["mptrain_padded_vocab_size"],
            50);
  EXPECT_FALSE(nlohmann::json::parse(GptHfConfigJson(unpadded, {})).contains("mptrain_job"));
}

TEST(HfConfig, ItsOwnFileIsReplaced_ItsOwnersOnlyWithOverwriteOutput) {
  const std::string dir = TempDir("own");
  const std::string checkpoint = dir + "/model.safetensors";
  ASSERT_TRUE(WriteGptHfConfig(checkpoint, SmallGpt(), kAlice, false, false).ok());
  GptConfig wider = SmallGpt();
  wider.width = 64;
  // A later attempt of the same job.
  ASSERT_TRUE(WriteGptHfConfig(checkpoint, wider, kAlice, false, false).ok());
  EXPECT_EQ(nlohmann::json::parse(ReadText(dir + "/config.json"))["n_embd"], 64);
  // Another job of alice's: only with overwrite_output.
  const CheckpointStamp later{"job-0008/uid-a2", "alice"};
  absl::Status refused = WriteGptHfConfig(checkpoint, SmallGpt(), later, false, false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists) << refused;
  EXPECT_NE(refused.message().find("overwrite_output"), std::string::npos) << refused;
  EXPECT_EQ(nlohmann::json::parse(ReadText(dir + "/config.json"))["n_embd"], 64);
  ASSERT_TRUE(WriteGptHfConfig(checkpoint, SmallGpt(), later, true, false).ok());
  const nlohmann::json replaced = nlohmann::json::parse(ReadText(dir + "/config.json"));
  EXPECT_EQ(replaced["n_embd"], 32);
  EXPECT_EQ(replaced["mptrain_job"], "job-0008/uid-a2");
}

// Another tenant's file (or a user's own HF config.json) in the output directory: never
// replaced, whatever overwrite_output says, and its contents never quoted.
TEST(HfConfig, AnotherTenantsOrAnUnstampedFileIsNeverReplaced) {
  const std::string dir = TempDir("hostile");
  const std::string checkpoint = dir + "/model.safetensors";
  const std::string path = dir + "/config.json";
  const std::string mallorys =
      R"({"mptrain_job": "job-0001/uid-m", "mptrain_owner": "mallory", "vocab_size": 7})";
  const std::string users = R"({"model_type": "gpt2", "n_embd": 768, "secret": "s3cr3t"})";
  for (const std::string& existing : {mallorys, users}) {
    WriteText(path, existing);
    for (bool overwrite : {false, true}) {
      absl::Status status = WriteGptHfConfig(checkpoint, SmallGpt(), kAlice, overwrite, true);
      EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
      EXPECT_EQ(ReadText(path), existing) << "replaced with overwrite_output " << overwrite;
      EXPECT_EQ(status.message().find("mallory"), std::string::npos) << status;
      EXPECT_EQ(status.message().find("s3cr3t"), std::string::npos) << status;
    }
  }
  // A job claiming mallory's owner name may not take the file either, unless it is hers.
  WriteText(path, mallorys);
  EXPECT_EQ(HfConfigOwnership(path, kAlice), FileOwnership::kSomeoneElse);
  EXPECT_EQ(HfConfigOwnership(path, {"job-0002/uid-m2", "mallory"}), FileOwnership::kSameOwner);
  EXPECT_EQ(HfConfigOwnership(path, {"job-0001/uid-m", "mallory"}), FileOwnership::kThisJob);
  // A stamp that is not a string is no stamp.
  WriteText(path, R"({"mptrain_job": 1, "mptrain_owner": ["alice"]})");
  EXPECT_EQ(HfConfigOwnership(path, kAlice), FileOwnership::kSomeoneElse);
}

TEST(HfConfig, ALinkADirectoryOrAnUnreadableFileIsLeftAlone) {
  const std::string dir = TempDir("odd");
  const std::string checkpoint = dir + "/model.safetensors";
  const std::string path = dir + "/config.json";
  // A link to a file of the job's owner's (stamped as this job's!): the link is not followed.
  const std::string target = dir + "/elsewhere.json";
  WriteText(target, GptHfConfigJson(SmallGpt(), kAlice));
  const std::string before = ReadText(target);
  ASSERT_EQ(symlink(target.c_str(), path.c_str()), 0);
  absl::Status status = WriteGptHfConfig(checkpoint, SmallGpt(), kAlice, true, false);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_EQ(ReadText(target), before);
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link itself stays too";
  unlink(path.c_str());

  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  EXPECT_EQ(WriteGptHfConfig(checkpoint, SmallGpt(), kAlice, true, false).code(),
            absl::StatusCode::kPermissionDenied);
  rmdir(path.c_str());

  for (const std::string& garbage :
       {std::string("not json {"), std::string("[1, 2]"),
        // Over the bound, even though it would parse and carry the job's own stamp.
        R"({"mptrain_job": "job-0007/uid-a1", "pad": ")" + std::string(kMaxHfConfigBytes, 'x') +
            "\"}"}) {
    WriteText(path, garbage);
    status = WriteGptHfConfig(checkpoint, SmallGpt(), kAlice, true, false);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_EQ(ReadText(path), garbage);
    EXPECT_EQ(status.message().find("not json"), std::string::npos) << status;
  }

  // A checkpoint named config.json is not overwritten by its own config.
  EXPECT_EQ(WriteGptHfConfig(dir + "/config.json", SmallGpt(), kAlice, true, false).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(HfConfig, AWriteThroughALinkedDirectoryIsRefusedWithNoSymlinks) {
  const std::string real = TempDir("real_dir");
  const std::string linked = TempDir("links") + "/to_real";
  ASSERT_EQ(symlink(real.c_str(), linked.c_str()), 0);
  absl::Status status =
      WriteGptHfConfig(linked + "/model.safetensors", SmallGpt(), kAlice, false, true);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_NE(access((real + "/config.json").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace mptrain
