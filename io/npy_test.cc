#include "io/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A header for `dict`, padded as numpy pads it, in format version `major`.0.
std::string Header(const std::string& dict, int major = 1) {
  const size_t length_bytes = major == 1 ? 2 : 4;
  std::string header = dict;
  size_t total = 8 + length_bytes + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = std::string("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (size_t i = 0; i < length_bytes; ++i) {
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  return out + header;
}

std::string F4Dict(const std::string& shape) {
  return "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
}

std::string Floats(std::vector<float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// Expects `status` to have `code` and a message naming `path` and containing `fragment`.
void ExpectError(const absl::Status& status, absl::StatusCode code, const std::string& path,
                 const std::string& fragment = "") {
  EXPECT_EQ(status.code(), code) << status;
  const std::string message(status.message());
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(fragment), std::string::npos) << "no '" << fragment << "' in " << message;
}

// Writes `dict` + `data` to a fresh file and expects ReadNpyMatrix to refuse it as
// INVALID_ARGUMENT naming the file and `fragment`.
void ExpectMatrixRefused(const std::string& name, const std::string& bytes,
                         const std::string& fragment) {
  const std::string path = TempPath(name);
  WriteRaw(path, bytes);
  ExpectError(ReadNpyMatrix(path).status(), absl::StatusCode::kInvalidArgument, path, fragment);
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

TEST(Npy, ReadNpyMatrix_Version2And3Headers_AreRead) {
  for (int major : {2, 3}) {
    const std::string path = TempPath("v" + std::to_string(major) + ".npy");
    WriteRaw(path, Header(F4Dict("(1, 2)"), major) + Floats({1.5f, -2}));
    auto read = ReadNpyMatrix(path);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->values, (std::vector<float>{1.5f, -2}));
  }
}

TEST(Npy, ReadNpyMatrix_DoubleQuotesAndNoTrailingComma_AreRead) {
  const std::string path = TempPath("quotes.npy");
  WriteRaw(path, Header(R"({"shape": (1, 1), "fortran_order": False, "descr": "<f4"})") +
                     Floats({3}));
  auto read = ReadNpyMatrix(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->values, (std::vector<float>{3}));
}

TEST(Npy, MissingFile_IsNotFound) {
  ExpectError(ReadNpyMatrix("/nonexistent.npy").status(), absl::StatusCode::kNotFound,
              "/nonexistent.npy");
}

TEST(Npy, ReadNpyMatrix_Directory_IsInvalidNotARegularFile) {
  const std::string path = TempPath("a_directory.npy");
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  ExpectError(ReadNpyMatrix(path).status(), absl::StatusCode::kInvalidArgument, path,
              "not a regular file");
}

TEST(Npy, ReadNpyMatrix_FifoWithoutWriter_ReturnsAtOnceAsNotARegularFile) {
  const std::string path = TempPath("fifo.npy");
  ASSERT_EQ(mkfifo(path.c_str(), 0644), 0);
  auto read = std::async(std::launch::async, [&] { return ReadNpyMatrix(path).status(); });
  if (read.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    // The reader is blocked in open() or read(): give it a writer and EOF so the test ends.
    int writer = open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) close(writer);
    ADD_FAILURE() << "ReadNpyMatrix blocked on a FIFO";
  }
  ExpectError(read.get(), absl::StatusCode::kInvalidArgument, path, "not a regular file");
}

TEST(Npy, ReadNpyMatrix_DevZero_IsInvalidNotARegularFile) {
  ExpectError(ReadNpyMatrix("/dev/zero").status(), absl::StatusCode::kInvalidArgument,
              "/dev/zero", "not a regular file");
}

TEST(Npy, ReadNpyMatrix_Symlink_IsPermissionDenied) {
  const std::string target = TempPath("link_target.npy");
  ASSERT_TRUE(WriteNpyMatrix(target, {1, 1, {1}}).ok());
  const std::string path = TempPath("link.npy");
  ASSERT_EQ(symlink(target.c_str(), path.c_str()), 0);
  ExpectError(ReadNpyMatrix(path).status(), absl::StatusCode::kPermissionDenied, path,
              "is a symbolic link");
}

TEST(Npy, ReadNpyMatrix_DimensionBeyondInt64_IsInvalidNamingShape) {
  ExpectMatrixRefused("huge_dim.npy", Header(F4Dict("(99999999999999999999, 1)")) + Floats({1}),
                      "'shape'[0] is too large for int64");
}

TEST(Npy, ReadNpyMatrix_NegativeDimension_IsInvalidNamingShape) {
  // 12 floats: what (3, 4) would need, so only the sign is wrong.
  ExpectMatrixRefused("negative_dim.npy",
                      Header(F4Dict("(-3, 4)")) + Floats(std::vector<float>(12, 1)),
                      "'shape'[0] is negative");
}

TEST(Npy, ReadNpyMatrix_ZeroDimension_IsInvalidNamingShape) {
  ExpectMatrixRefused("zero_dim.npy", Header(F4Dict("(4, 0)")), "'shape'[1] is not > 0");
}

TEST(Npy, ReadNpyMatrix_NonDigitDimension_IsInvalidNamingShape) {
  ExpectMatrixRefused("float_dim.npy", Header(F4Dict("(3.0, 1)")) + Floats({1, 2, 3}),
                      "'shape'[0] is not a decimal integer");
  ExpectMatrixRefused("hex_dim.npy", Header(F4Dict("(1, 0x1)")) + Floats({1}),
                      "'shape'[1] is not a decimal integer");
}

TEST(Npy, ReadNpyMatrix_ElementCountWrapsToZero_IsInvalid) {
  // 2^62 * 4 elements = 2^64: wraps to 0, which an unchecked product would accept with no data.
  ExpectMatrixRefused("wrap_elements.npy", Header(F4Dict("(4611686018427387904, 4)")),
                      "more elements than fit in 64 bits");
}

TEST(Npy, ReadNpyMatrix_ByteSizeWrapsToZero_IsInvalid) {
  // 2^62 elements of 4 bytes = 2^64 bytes: wraps to 0.
  ExpectMatrixRefused("wrap_bytes.npy", Header(F4Dict("(4611686018427387904, 1)")),
                      "needs more bytes than fit in 64 bits");
}

TEST(Npy, Truncated_IsInvalidNamingFile) {
  ExpectMatrixRefused("truncated.npy", Header(F4Dict("(4, 4)")) + std::string(12, '\0'),
                      "truncated: its data is shorter than 'shape' and 'descr' need");
}

TEST(Npy, ReadNpyMatrix_ExtraData_IsInvalidWithByteCounts) {
  ExpectMatrixRefused("extra.npy", Header(F4Dict("(1, 2)")) + Floats({1, 2, 3}),
                      "extra bytes after the array");
}

TEST(Npy, ReadNpyMatrix_HeaderLengthBeyondFile_IsInvalid) {
  std::string bytes = Header(F4Dict("(1, 1)")) + Floats({1});
  bytes[8] = '\xff';  // Header length 0x7fff: under the cap, past the end of the file.
  bytes[9] = '\x7f';
  ExpectMatrixRefused("long_header.npy", bytes, "runs past the end of the file");
}

TEST(Npy, ReadNpyMatrix_HeaderLengthBeyondCap_IsInvalid) {
  std::string bytes = Header(F4Dict("(1, 1)"), 2) + Floats({1});
  bytes[10] = '\x10';  // 1 MiB + the real length.
  ExpectMatrixRefused("capped_header.npy", bytes, "exceeds the limit of 65536 bytes");
}

TEST(Npy, WrongDtype_IsInvalid) {
  ExpectMatrixRefused("f8.npy",
                      Header("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1), }") +
                          std::string(8, '\0'),
                      "'descr' is not '<f4'");
  ExpectMatrixRefused("f4_big_endian.npy",
                      Header("{'descr': '>f4', 'fortran_order': False, 'shape': (1, 1), }") +
                          std::string(4, '\0'),
                      "'descr' is not '<f4'");
}

TEST(Npy, ReadNpyMatrix_StructuredDtype_IsInvalid) {
  ExpectMatrixRefused(
      "structured.npy",
      Header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1, 1), }") +
          Floats({1}),
      "'descr' is not a string");
}

TEST(Npy, OneDimensional_IsInvalid) {
  ExpectMatrixRefused("1d.npy", Header(F4Dict("(3,)")) + std::string(12, '\0'),
                      "'shape' does not have 2 dimensions");
}

TEST(Npy, ReadNpyMatrix_ParenthesisedNumberShape_IsInvalid) {
  ExpectMatrixRefused("paren.npy", Header(F4Dict("(3)")) + Floats({1, 2, 3}), "not a tuple");
}

TEST(Npy, FortranOrder_IsInvalid) {
  ExpectMatrixRefused("fortran.npy",
                      Header("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 1), }") +
                          std::string(4, '\0'),
                      "Fortran order");
}

TEST(Npy, ReadNpyMatrix_DuplicateKey_IsInvalid) {
  ExpectMatrixRefused(
      "dup.npy",
      Header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), 'shape': (1, 1)}") +
          Floats({1}),
      "the key 'shape' appears twice");
}

TEST(Npy, ReadNpyMatrix_UnknownKey_IsInvalid) {
  ExpectMatrixRefused(
      "unknown.npy",
      Header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), 'x': 1}") + Floats({1}),
      "an unexpected key (only");
}

TEST(Npy, ReadNpyMatrix_MissingKey_IsInvalidNamingIt) {
  ExpectMatrixRefused("no_fortran.npy", Header("{'descr': '<f4', 'shape': (1, 1), }") + Floats({1}),
                      "no 'fortran_order'");
}

TEST(Npy, ReadNpyMatrix_TextAfterDict_IsInvalid) {
  ExpectMatrixRefused("after.npy", Header(F4Dict("(1, 1)") + " junk") + Floats({1}),
                      "unexpected text after the header dict");
}

TEST(Npy, ReadNpyMatrix_UnsupportedVersion_IsInvalid) {
  std::string bytes = Header(F4Dict("(1, 1)")) + Floats({1});
  bytes[6] = 4;
  ExpectMatrixRefused("v4.npy", bytes, "an unsupported format version (1.0, 2.0 and 3.0");
}

TEST(Npy, Garbage_IsInvalid) {
  ExpectMatrixRefused("garbage.npy", "this is not numpy at all", "magic");
  ExpectMatrixRefused("empty.npy", "", "magic");
}

// The message of `status` with every occurrence of `path` taken out.
std::string WithoutPath(const absl::Status& status, const std::string& path) {
  std::string message(status.message());
  for (size_t at; (at = message.find(path)) != std::string::npos;) message.erase(at, path.size());
  return message;
}

// An error must not tell whoever submitted the path what the file holds: no key, dtype, token,
// header length, version, shape, byte count or value from it (each planted below).
TEST(Npy, Readers_Errors_QuoteNoByteOrNumberFromTheFile) {
  std::string long_header = Header(F4Dict("(1, 1)"), 2) + Floats({1});
  long_header[8] = 0x21;  // Header length 0x5421 + (0x21 << 16): 2184225, over the cap.
  long_header[9] = 0x54;
  long_header[10] = 0x21;
  std::string past_end = Header(F4Dict("(1, 1)")) + Floats({1});
  past_end[8] = 0x39;  // 0x3039 = 12345, past the end of this file.
  past_end[9] = 0x30;
  std::string version = Header(F4Dict("(1, 1)")) + Floats({1});
  version[6] = 77;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::pair<std::string, std::string>> files = {
      {"key", Header("{'descr': '<f4', 'SECRETKEY': 1, 'shape': (1, 1)}") + Floats({1})},
      {"colon", Header("{'SECRETKEY' 1}") + Floats({1})},
      {"after", Header(F4Dict("(1, 1)") + " SECRETTEXT") + Floats({1})},
      {"quote", Header("{SECRETTEXT: 1}") + Floats({1})},
      {"dtype", Header("{'descr': 'SECRETDTYPE', 'fortran_order': False, 'shape': (1, 1), }") +
                    Floats({1})},
      {"negative", Header(F4Dict("(-987654321, 1)")) + Floats({1})},
      {"token", Header(F4Dict("(SECRET, 1)")) + Floats({1})},
      {"huge", Header(F4Dict("(98765432109876543210, 1)")) + Floats({1})},
      {"dims", Header(F4Dict("(987654, 1, 1)")) + Floats({1})},
      {"truncated", Header(F4Dict("(987654, 3)")) + Floats({1})},
      {"extra", Header(F4Dict("(1, 1)")) + std::string(987654, '\0')},
      {"wrap", Header(F4Dict("(4611686018427387904, 987654)"))},
      {"long_header", long_header},
      {"past_end", past_end},
      {"version", version},
      {"nan", Header(F4Dict("(2, 2)")) + Floats({1, 2, 3, nan})},
  };
  for (const auto& [name, bytes] : files) {
    const std::string path = TempPath("planted_" + name + ".npy");
    WriteRaw(path, bytes);
    for (const absl::Status& status :
         {ReadNpyMatrix(path).status(), ReadNpyLabels(path).status()}) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name << ": " << status;
      const std::string message = WithoutPath(status, path);
      std::vector<std::string> secrets = {"SECRET",  "987654", "98765", "2184225",
                                          "12345",   "77",     "4611686018427387904", "nan"};
      // Sizes of small files could match a limit in a message by chance ("64 bits").
      if (bytes.size() > 1000) secrets.push_back(absl::StrCat(bytes.size()));
      for (const std::string& secret : secrets) {
        EXPECT_EQ(message.find(secret), std::string::npos)
            << name << ": the error quotes '" << secret << "' from the file: " << message;
      }
    }
  }
}

TEST(Npy, ReadNpyMatrix_NonFinite_IsInvalidNamingRowAndColumn) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  ExpectMatrixRefused("nan.npy", Header(F4Dict("(2, 3)")) + Floats({1, 2, 3, 4, nan, 6}),
                      "row 1, column 1 is not finite (NaN or infinity)");
  ExpectMatrixRefused("inf.npy", Header(F4Dict("(2, 3)")) + Floats({1, 2, -inf, 4, 5, 6}),
                      "row 0, column 2 is not finite");
  const std::string path = TempPath("finite.npy");
  WriteRaw(path, Header(F4Dict("(1, 2)")) + Floats({std::numeric_limits<float>::max(), -0.0f}));
  EXPECT_TRUE(ReadNpyMatrix(path).ok());
}

TEST(Npy, WriteNpyMatrix_ValuesDoNotMatchShape_IsInvalid) {
  const std::string path = TempPath("mismatch.npy");
  ExpectError(WriteNpyMatrix(path, {2, 2, {1, 2, 3}}), absl::StatusCode::kInvalidArgument, path,
              "2 x 2 matrix from 3 values");
}

TEST(Npy, WriteNpyLabelsThenRead_RoundTrips) {
  const std::string path = TempPath("labels.npy");
  NpyLabels labels{4, {0, 3, 1, int64_t{1} << 40}};
  ASSERT_TRUE(WriteNpyLabels(path, labels).ok());
  auto read = ReadNpyLabels(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->count, 4);
  EXPECT_EQ(read->values, labels.values);
}

TEST(Npy, ReadNpyLabels_Int32ColumnVector_IsWidened) {
  const std::string path = TempPath("labels_i4.npy");
  const std::vector<int32_t> values = {7, -1, 2};
  WriteRaw(path, Header("{'descr': '<i4', 'fortran_order': False, 'shape': (3, 1), }") +
                     std::string(reinterpret_cast<const char*>(values.data()), 12));
  auto read = ReadNpyLabels(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->count, 3);
  EXPECT_EQ(read->values, (std::vector<int64_t>{7, -1, 2}));
}

TEST(Npy, ReadNpyLabels_FloatDtype_IsInvalidNamingIt) {
  const std::string path = TempPath("labels_f4.npy");
  ASSERT_TRUE(WriteNpyMatrix(path, {2, 1, {0, 1}}).ok());
  ExpectError(ReadNpyLabels(path).status(), absl::StatusCode::kInvalidArgument, path,
              "'descr' is not '<i8' (int64) or '<i4' (int32)");
}

TEST(Npy, ReadNpyLabels_TwoColumns_IsInvalid) {
  const std::string path = TempPath("labels_2col.npy");
  WriteRaw(path, Header("{'descr': '<i8', 'fortran_order': False, 'shape': (1, 2), }") +
                     std::string(16, '\0'));
  ExpectError(ReadNpyLabels(path).status(), absl::StatusCode::kInvalidArgument, path,
              "'shape' is not (N,) or (N, 1)");
}

TEST(Npy, ReadNpyLabels_NegativeDimension_IsInvalid) {
  const std::string path = TempPath("labels_negative.npy");
  WriteRaw(path, Header("{'descr': '<i8', 'fortran_order': False, 'shape': (-1,), }") +
                     std::string(8, '\0'));
  ExpectError(ReadNpyLabels(path).status(), absl::StatusCode::kInvalidArgument, path,
              "'shape'[0] is negative");
}

TEST(Npy, ReadNpyLabels_Directory_IsInvalidNotARegularFile) {
  const std::string path = TempPath("labels_dir.npy");
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  ExpectError(ReadNpyLabels(path).status(), absl::StatusCode::kInvalidArgument, path,
              "not a regular file");
}

}  // namespace
}  // namespace mptrain
