#include "fuzz/error_leak_check.h"

#include <string>

#include "gtest/gtest.h"

namespace mptrain::fuzz {
namespace {

const std::string kPath = "/data/file.safetensors";

// The message the old safetensors reader gave for the first 8 bytes of /etc/shadow.
TEST(ErrorLeakCheck, SpellsNumberIn_FindsAPlantedHeaderLength) {
  const absl::Status old = absl::InvalidArgumentError(
      kPath + ": not a valid safetensors file: header length 3619251681095544690 exceeds the "
              "file (1026 bytes) or the limit of 104857600");
  EXPECT_TRUE(SpellsNumberIn(old, kPath, 3619251681095544690u, 3619251681095544690u));
  EXPECT_TRUE(SpellsNumberIn(old, kPath, 1000, 1100)) << "the file size";
  const absl::Status now = absl::InvalidArgumentError(
      kPath + ": not a valid safetensors file: its header length (the first 8 bytes) exceeds "
              "the rest of the file or the limit of 104857600 bytes");
  EXPECT_FALSE(SpellsNumberIn(now, kPath, 3619251681095544690u, 3619251681095544690u));
  EXPECT_FALSE(SpellsNumberIn(now, kPath, 1000, 1100));
}

TEST(ErrorLeakCheck, SpellsNumberIn_IgnoresThePath) {
  const std::string path = "/data/7777777.npy";
  EXPECT_FALSE(SpellsNumberIn(absl::InvalidArgumentError(path + ": truncated"), path, 7777777,
                              7777777));
}

TEST(ErrorLeakCheckDeathTest, AbortIfQuotesInput_AbortsOnAQuotedName) {
  const std::string input = R"(....{"secret-tensor-name": {"dtype": "F16"}})";
  const absl::Status old = absl::InvalidArgumentError(
      kPath + ": tensor 'secret-tensor-name' has dtype \"F16\", expected \"F32\"");
  EXPECT_DEATH(AbortIfQuotesInput(old, kPath, InputRuns(input), {"dtype"}), "a run of its bytes");
}

TEST(ErrorLeakCheck, AbortIfQuotesInput_AllowsThePathAndTheFormatsWords) {
  // The input holds the path and "data_offsets"; the message names both, and quotes nothing
  // else.
  const std::string input = kPath + R"( {"w": {"data_offsets": [0, 4]}})";
  const absl::Status status = absl::InvalidArgumentError(
      kPath + ": tensor #0 (in name order) has data_offsets that do not lie within the data");
  AbortIfQuotesInput(status, kPath, InputRuns(input), {"data_offsets"});  // Returns.
}

}  // namespace
}  // namespace mptrain::fuzz
