#include "io/safetensors.h"

#include <fstream>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

TEST(Safetensors, WriteThenRead_RoundTrips) {
  TensorMap tensors;
  tensors["layers.0.weight"] = {{2, 3}, {1, 2, 3, 4, 5, 6}};
  tensors["layers.0.bias"] = {{2}, {-1, 0.5f}};
  std::string path = TempPath("ckpt.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"step", "7"}}).ok());
  std::map<std::string, std::string> metadata;
  auto read = ReadSafetensors(path, &metadata);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 2u);
  EXPECT_EQ(metadata["step"], "7");
  EXPECT_EQ(read->at("layers.0.weight").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(read->at("layers.0.weight").values, tensors["layers.0.weight"].values);
  EXPECT_EQ(read->at("layers.0.bias").values, tensors["layers.0.bias"].values);
}

TEST(Safetensors, HeaderLayout_MatchesTheFormat) {
  TensorMap tensors;
  tensors["a"] = {{1}, {3.0f}};
  std::string path = TempPath("layout.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  std::ifstream file(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  uint64_t header_len = 0;
  memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_len + 4);
  std::string header = bytes.substr(8, header_len);
  EXPECT_NE(header.find(R"("dtype":"F32")"), std::string::npos) << header;
  EXPECT_NE(header.find(R"("data_offsets":[0,4])"), std::string::npos) << header;
}

TEST(Safetensors, Truncated_IsInvalidNamingFile) {
  TensorMap tensors;
  tensors["a"] = {{4}, {1, 2, 3, 4}};
  std::string path = TempPath("trunc.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 3);
  auto read = ReadSafetensors(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(read.status().message()).find(path), std::string::npos);
}

TEST(Safetensors, HugeHeaderLength_IsInvalid) {
  std::string path = TempPath("huge.safetensors");
  std::string bytes(8, '\xff');
  std::ofstream(path, std::ios::binary) << bytes << "{}";
  EXPECT_EQ(ReadSafetensors(path).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Safetensors, MissingFile_IsNotFound) {
  EXPECT_EQ(ReadSafetensors("/nonexistent.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mptrain
