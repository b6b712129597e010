#include "io/npy.h"

#include <fstream>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A v1.0 header for `dict`, padded as numpy pads it.
std::string Header(const std::string& dict) {
  std::string header = dict;
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  return out + header;
}

TEST(Npy, WriteThenRead_RoundTrips) {
  NpyMatrix matrix{2, 3, {1, 2, 3, 4, 5, -6.5f}};
  std::string path = TempPath("roundtrip.npy");
  ASSERT_TRUE(WriteNpyMatrix(path, matrix).ok());
  auto read = ReadNpyMatrix(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->rows, 2);
  EXPECT_EQ(read->cols, 3);
  EXPECT_EQ(read->values, matrix.values);
}

TEST(Npy, MissingFile_IsNotFound) {
  EXPECT_EQ(ReadNpyMatrix("/nonexistent.npy").status().code(), absl::StatusCode::kNotFound);
}

TEST(Npy, Truncated_IsInvalidNamingFile) {
  std::string path = TempPath("truncated.npy");
  WriteRaw(path, Header("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }") +
                     std::string(12, '\0'));
  auto read = ReadNpyMatrix(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(read.status().message()).find(path), std::string::npos);
  EXPECT_NE(std::string(read.status().message()).find("truncated"), std::string::npos);
}

TEST(Npy, WrongDtype_IsInvalid) {
  std::string path = TempPath("f8.npy");
  WriteRaw(path, Header("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1), }") +
                     std::string(8, '\0'));
  auto read = ReadNpyMatrix(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(read.status().message()).find("'<f8'"), std::string::npos);
}

TEST(Npy, OneDimensional_IsInvalid) {
  std::string path = TempPath("1d.npy");
  WriteRaw(path, Header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }") +
                     std::string(12, '\0'));
  EXPECT_EQ(ReadNpyMatrix(path).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Npy, FortranOrder_IsInvalid) {
  std::string path = TempPath("fortran.npy");
  WriteRaw(path, Header("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 1), }") +
                     std::string(4, '\0'));
  EXPECT_EQ(ReadNpyMatrix(path).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Npy, Garbage_IsInvalid) {
  std::string path = TempPath("garbage.npy");
  WriteRaw(path, "this is not numpy at all");
  EXPECT_EQ(ReadNpyMatrix(path).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mptrain
