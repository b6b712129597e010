#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

// A safetensors file with the given header text and `data_bytes` bytes of data.
std::string Raw(const std::string& header, size_t data_bytes) {
  uint64_t length = header.size();
  return std::string(reinterpret_cast<const char*>(&length), 8) + header +
         std::string(data_bytes, '\0');
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Expects `status` to have `code` and a message naming `path` and containing `fragment`.
void ExpectError(const absl::Status& status, absl::StatusCode code, const std::string& path,
                 const std::string& fragment = "") {
  EXPECT_EQ(status.code(), code) << status;
  const std::string message(status.message());
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(fragment), std::string::npos) << "no '" << fragment << "' in " << message;
}

// Writes a file with `header` and `data_bytes` of data and expects ReadSafetensors to refuse it
// as INVALID_ARGUMENT naming the file and `fragment`.
void ExpectRefused(const std::string& name, const std::string& header, size_t data_bytes,
                   const std::string& fragment) {
  const std::string path = TempPath(name);
  WriteRaw(path, Raw(header, data_bytes));
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path, fragment);
}

TEST(Safetensors, WriteThenRead_RoundTrips) {
  TensorMap tensors;
  tensors["layers.0.weight"] = {{2, 3}, {1, 2, 3, 4, 5, 6}};
  tensors["layers.0.bias"] = {{2}, {-1, 0.5f}};
  tensors["empty"] = {{0, 3}, {}};
  std::string path = TempPath("ckpt.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"step", "7"}}).ok());
  std::map<std::string, std::string> metadata;
  auto read = ReadSafetensors(path, &metadata);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 3u);
  EXPECT_EQ(metadata["step"], "7");
  EXPECT_EQ(read->at("layers.0.weight").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(read->at("layers.0.weight").values, tensors["layers.0.weight"].values);
  EXPECT_EQ(read->at("layers.0.bias").values, tensors["layers.0.bias"].values);
  EXPECT_EQ(read->at("empty").shape, (std::vector<int64_t>{0, 3}));
}

// Every file carries a digest of its data: one flipped bit (a mantissa's lowest, which loads
// as a plausible weight) is refused naming the file; the header alone still reads; a file
// without a digest (another writer's) reads unchecked.
TEST(Safetensors, OneFlippedDataBit_IsRefusedAsDamaged_FilesWithoutADigestReadUnchecked) {
  TensorMap tensors;
  tensors["a"] = {{3}, {1.0f, 2.0f, 3.0f}};
  tensors["b"] = {{2}, {-4.0f, 5.5f}};
  const std::string path = TempPath("digest.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"step", "3"}}).ok());
  std::map<std::string, std::string> metadata;
  ASSERT_TRUE(ReadSafetensors(path, &metadata).ok());
  EXPECT_EQ(metadata[kDataDigestKey].size(), 16u);
  std::string bytes = ReadAll(path);
  bytes[bytes.size() - 5] ^= 0x01;  // b[0]'s lowest mantissa bit.
  WriteRaw(path, bytes);
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              "the file is damaged");
  SafetensorsReadOptions header_only;
  header_only.header_only = true;
  EXPECT_TRUE(ReadSafetensors(path, nullptr, header_only).ok());
  // A flipped bit in the header's metadata ("step":"3" -> "7") shows too.
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"step", "3"}}).ok());
  bytes = ReadAll(path);
  const size_t step = bytes.find(R"("step":"3")");
  ASSERT_NE(step, std::string::npos);
  bytes[step + 8] ^= 0x04;
  WriteRaw(path, bytes);
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              "the file is damaged");

  const std::string plain = TempPath("no_digest.safetensors");
  std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  WriteRaw(plain, Raw(header, 4));
  auto read = ReadSafetensors(plain);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->at("a").values, std::vector<float>{0.0f});
}

TEST(Safetensors, HeaderLayout_MatchesTheFormat) {
  TensorMap tensors;
  tensors["a"] = {{1}, {3.0f}};
  std::string path = TempPath("layout.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  std::string bytes = ReadAll(path);
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
  std::string bytes = ReadAll(path);
  WriteRaw(path, bytes.substr(0, bytes.size() - 3));
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              "tensor #0 (in name order) has data_offsets that do not lie within the data");
}

TEST(Safetensors, HugeHeaderLength_IsInvalid) {
  const std::string path = TempPath("huge.safetensors");
  WriteRaw(path, std::string(8, '\xff') + "{}");
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              "its header length (the first 8 bytes) exceeds the rest of the file or the limit");
}

TEST(Safetensors, ReadSafetensors_HeaderLengthOneBeyondFile_IsInvalid) {
  const std::string path = TempPath("header_past_end.safetensors");
  std::string bytes = Raw("{}", 0);
  bytes[0] = 3;
  WriteRaw(path, bytes);
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              "its header length (the first 8 bytes) exceeds the rest of the file");
}

TEST(Safetensors, ReadSafetensors_ShorterThanLengthField_IsInvalid) {
  const std::string path = TempPath("short.safetensors");
  WriteRaw(path, "abc");
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              "shorter than the 8-byte header length");
}

TEST(Safetensors, MissingFile_IsNotFound) {
  ExpectError(ReadSafetensors("/nonexistent.safetensors").status(), absl::StatusCode::kNotFound,
              "/nonexistent.safetensors");
}

TEST(Safetensors, ReadSafetensors_Directory_IsInvalidNotARegularFile) {
  const std::string path = TempPath("dir.safetensors");
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              "not a regular file");
}

TEST(Safetensors, ReadSafetensors_FifoWithoutWriter_ReturnsAtOnceAsNotARegularFile) {
  const std::string path = TempPath("fifo.safetensors");
  ASSERT_EQ(mkfifo(path.c_str(), 0644), 0);
  auto read = std::async(std::launch::async, [&] { return ReadSafetensors(path).status(); });
  if (read.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    // The reader is blocked in open() or read(): give it a writer and EOF so the test ends.
    int writer = open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) close(writer);
    ADD_FAILURE() << "ReadSafetensors blocked on a FIFO";
  }
  ExpectError(read.get(), absl::StatusCode::kInvalidArgument, path, "not a regular file");
}

TEST(Safetensors, ReadSafetensors_DevZero_IsInvalidNotARegularFile) {
  ExpectError(ReadSafetensors("/dev/zero").status(), absl::StatusCode::kInvalidArgument,
              "/dev/zero", "not a regular file");
}

TEST(Safetensors, ReadSafetensors_Symlink_IsPermissionDenied) {
  const std::string target = TempPath("target.safetensors");
  ASSERT_TRUE(WriteSafetensors(target, {}).ok());
  const std::string path = TempPath("link.safetensors");
  ASSERT_EQ(symlink(target.c_str(), path.c_str()), 0);
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kPermissionDenied, path,
              "is a symbolic link");
}

TEST(Safetensors, ReadSafetensors_HeaderNotJson_IsInvalid) {
  ExpectRefused("not_json.safetensors", "{\"a\": ", 0, "the header is not valid JSON");
  ExpectRefused("binary.safetensors", std::string("\x01\x02\xff{", 4), 0,
                "the header is not valid JSON");
}

TEST(Safetensors, ReadSafetensors_HeaderJsonArray_IsInvalid) {
  ExpectRefused("array.safetensors", "[1, 2, 3]", 0,
                "the header is a JSON array, expected an object");
  ExpectRefused("number.safetensors", "42", 0, "the header is a JSON number, expected an object");
}

TEST(Safetensors, ReadSafetensors_NegativeShape_IsInvalidNamingTensor) {
  ExpectRefused("negative_shape.safetensors",
                R"({"w": {"dtype": "F32", "shape": [-3, 4], "data_offsets": [0, 48]}})", 48,
                "tensor #0 (in name order) shape[0] is not a non-negative integer");
}

TEST(Safetensors, ReadSafetensors_NonIntegerShape_IsInvalidNamingTensor) {
  ExpectRefused("float_shape.safetensors",
                R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
                "tensor #0 (in name order) shape[0] is not a non-negative integer");
  ExpectRefused("string_shape.safetensors",
                R"({"w": {"dtype": "F32", "shape": "[1]", "data_offsets": [0, 4]}})", 4,
                "tensor #0 (in name order) has a shape that is a JSON string");
}

TEST(Safetensors, ReadSafetensors_ShapeOverflow_IsInvalidNamingTensor) {
  // 2^32 * 2^32 elements = 2^64: wraps to 0, which [0, 0] would match if unchecked.
  ExpectRefused("overflow.safetensors",
                R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], )"
                R"("data_offsets": [0, 0]}})",
                0, "tensor #0 (in name order) has a shape with more elements than fit");
  // 2^62 elements of 4 bytes.
  ExpectRefused("overflow_bytes.safetensors",
                R"({"w": {"dtype": "F32", "shape": [4611686018427387904], )"
                R"("data_offsets": [0, 0]}})",
                0, "tensor #0 (in name order) has a shape that needs more bytes than fit");
}

TEST(Safetensors, ReadSafetensors_OffsetsOutOfRange_IsInvalidNamingTensor) {
  ExpectRefused("out_of_range.safetensors",
                R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 8,
                "tensor #0 (in name order) has data_offsets that do not lie within the data");
  ExpectRefused("reversed.safetensors",
                R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 8,
                "tensor #0 (in name order) has data_offsets that do not lie within");
  ExpectRefused("negative_offset.safetensors",
                R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 8,
                "tensor #0 (in name order) has data_offsets that are not [begin, end]");
}

TEST(Safetensors, ReadSafetensors_OverlappingTensors_IsInvalidNamingBoth) {
  ExpectRefused("overlap.safetensors",
                R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                12, "the data_offsets of two tensors overlap");
}

TEST(Safetensors, ReadSafetensors_OffsetsDisagreeWithShape_IsInvalidNamingTensor) {
  ExpectRefused("wrong_size.safetensors",
                R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8,
                "tensor #0 (in name order) has data_offsets that do not span the 4 bytes per "
                "element");
}

TEST(Safetensors, ReadSafetensors_OtherDtype_IsInvalidNamingTensor) {
  ExpectRefused("f16.safetensors",
                R"({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})", 4,
                "tensor #0 (in name order) has a dtype other than \"F32\"");
}

TEST(Safetensors, ReadSafetensors_MissingField_IsInvalidNamingIt) {
  ExpectRefused("no_offsets.safetensors", R"({"w": {"dtype": "F32", "shape": [1]}})", 4,
                "tensor #0 (in name order) lacks data_offsets");
  ExpectRefused("not_object.safetensors", R"({"w": 3})", 0,
                "tensor #0 (in name order) is a JSON number, expected an object");
}

TEST(Safetensors, ReadSafetensors_DuplicateKeys_AreInvalid) {
  ExpectRefused("dup_tensor.safetensors",
                R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                8, "a top-level key appears twice");
  ExpectRefused("dup_field.safetensors",
                R"({"w": {"dtype": "F32", "shape": [1], "shape": [2], "data_offsets": [0, 4]}})",
                8, "a tensor entry has a key twice");
}

TEST(Safetensors, ReadSafetensors_MetadataWithNonString_IsInvalidNamingKey) {
  ExpectRefused("meta_number.safetensors", R"({"__metadata__": {"step": 7}})", 0,
                "a __metadata__ value is a JSON number, expected a string");
  ExpectRefused("meta_array.safetensors", R"({"__metadata__": ["a"]})", 0,
                "'__metadata__' is a JSON array, expected an object");
  ExpectRefused("meta_string.safetensors", R"({"__metadata__": "x"})", 0,
                "__metadata__ is a JSON string, expected an object of strings");
}

TEST(Safetensors, ReadSafetensors_DeepNesting_IsInvalid) {
  ExpectRefused("deep.safetensors",
                R"({"w": {"dtype": "F32", "shape": [[[[1]]]], "data_offsets": [0, 4]}})", 4,
                "a tensor entry field 'shape' nests arrays too deeply");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  ExpectRefused("very_deep.safetensors", "{\"w\": {\"x\": " + deep + "}}", 0,
                "nests arrays too deeply");
}

TEST(Safetensors, ReadSafetensors_LongShape_IsInvalid) {
  std::string shape = "1";
  for (int i = 0; i < 100; ++i) shape += ", 1";
  ExpectRefused("long_shape.safetensors",
                R"({"w": {"dtype": "F32", "shape": [)" + shape + R"(], "data_offsets": [0, 4]}})",
                4, "a tensor entry field 'shape' has more than 64 elements");
}

// A header of `count` empty tensors and a __metadata__.
std::string ManyTensors(int count) {
  std::string header = R"({"__metadata__":{"k":"v"})";
  for (int i = 0; i < count; ++i) {
    absl::StrAppend(&header, ",\"t", i, R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})");
  }
  return header + "}";
}

TEST(Safetensors, ReadSafetensors_TooManyTensors_IsInvalid) {
  ExpectRefused("many.safetensors", ManyTensors(100001), 0, "more than 100000 tensors");
}

TEST(Safetensors, ReadSafetensors_TensorCountAtTheCap_IsRead) {
  const std::string path = TempPath("at_cap.safetensors");
  WriteRaw(path, Raw(ManyTensors(100000), 0));
  auto read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->size(), 100000u);
}

// Millions of short keys would make the parser allocate tens of times the file's size.
TEST(Safetensors, ReadSafetensors_TooManyKeysInAnObject_IsInvalid) {
  auto metadata = [](int keys) {
    std::string header = R"({"__metadata__":{)";
    for (int i = 0; i < keys; ++i) absl::StrAppend(&header, i ? "," : "", "\"k", i, "\":\"v\"");
    return header + "}}";
  };
  ExpectRefused("many_metadata.safetensors", metadata(1025), 0,
                "'__metadata__' has more than 1024 keys");
  const std::string path = TempPath("metadata_at_cap.safetensors");
  WriteRaw(path, Raw(metadata(1024), 0));
  std::map<std::string, std::string> read_metadata;
  auto read = ReadSafetensors(path, &read_metadata);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read_metadata.size(), 1024u);

  std::string fields;
  for (int i = 0; i < 6; ++i) absl::StrAppend(&fields, ",\"x", i, "\":1");
  ExpectRefused("many_fields.safetensors",
                R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4])" + fields + "}}",
                4, "a tensor entry has more than 8 keys");
}

// The message of `status` with every occurrence of `path` taken out.
std::string WithoutPath(const absl::Status& status, const std::string& path) {
  std::string message(status.message());
  for (size_t at; (at = message.find(path)) != std::string::npos;) message.erase(at, path.size());
  return message;
}

// Expects ReadSafetensors (with require_finite) to refuse `bytes` as INVALID_ARGUMENT with a
// message that contains none of `secrets` (planted in the file: names, values, numbers) once
// the path (which may contain anything) is taken out.
void ExpectRefusedQuotingNothing(const std::string& name, const std::string& bytes,
                                 const std::vector<std::string>& secrets) {
  const std::string path = TempPath(name);
  WriteRaw(path, bytes);
  SafetensorsReadOptions finite;
  finite.require_finite = true;
  for (const SafetensorsReadOptions& options : {SafetensorsReadOptions{}, finite}) {
    const absl::Status status = ReadSafetensors(path, nullptr, options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name << ": " << status;
    const std::string message = WithoutPath(status, path);
    for (const std::string& secret : secrets) {
      EXPECT_EQ(message.find(secret), std::string::npos)
          << name << ": the error quotes '" << secret << "' from the file: " << message;
    }
  }
}

// An error must not tell whoever submitted the path what the file holds: the first 8 bytes of
// /etc/shadow read as a header length spelled "root:*:2" in decimal.
TEST(Safetensors, ReadSafetensors_Errors_QuoteNoByteNumberOrNameFromTheFile) {
  const std::string shadow = "root:*:20000:0:99999:7:::\n" + std::string(1000, 'x');
  ExpectRefusedQuotingNothing(
      "shadow", shadow,
      {"3619251681095544690", "323a2a3a746f6f72", "root", absl::StrCat(shadow.size())});
  // Each header breaks one rule with a planted name or number; the data section is 77777 bytes.
  const std::vector<std::string> headers = {
      R"({"SECRETNAME": {"dtype": "SECRETDTYPE", "shape": [1], "data_offsets": [0, 4]}})",
      R"({"SECRETNAME": {"dtype": "F32", "shape": [-987654321], "data_offsets": [0, 4]}})",
      R"({"SECRETNAME": {"dtype": "F32", "shape": [98765.4321], "data_offsets": [0, 4]}})",
      R"({"SECRETNAME": {"dtype": "F32", "shape": [987654321], "data_offsets": [0, 4]}})",
      R"({"SECRETNAME": {"dtype": "F32", "shape": [1], "data_offsets": [987654321, 987654325]}})",
      R"({"SECRETNAME": {"dtype": "F32", "shape": [1], "data_offsets": "SECRETOFFSETS"}})",
      R"({"SECRETNAME": {"dtype": "F32", "shape": [4294967296, 4294967296], )"
      R"("data_offsets": [0, 0]}})",
      R"({"SECRETNAME": {"dtype": "F32", "shape": [1], "SECRETFIELD": 1, "SECRETFIELD": 2,)"
      R"( "data_offsets": [0, 4]}})",
      R"({"SECRETNAME": 1, "SECRETNAME": 2})",
      R"({"SECRETNAME": [1]})",
      R"({"SECRETNAME": {"SECRETFIELD": [[[[1]]]]}})",
      R"({"SECRETNAME": {"dtype": "F32", "shape": [1]}})",
      R"({"__metadata__": {"SECRETKEY": 987654321}})",
      R"({"__metadata__": {"mptrain_data_xxh3": "SECRETDIGEST"}})",
      R"({"SECRETNAMEA": {"dtype": "F32", "shape": [2], "data_offsets": [987654321, 987654329]},)"
      R"( "SECRETNAMEB": {"dtype": "F32", "shape": [2], "data_offsets": [987654325, 987654333]}})",
      R"({"SECRETNAME": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, SECRETJSON)",
      "{\"SECRETNAME\xff\": 1}",
  };
  for (size_t i = 0; i < headers.size(); ++i) {
    std::string header = headers[i];
    // Large offsets need a data section that holds them: 987654333 bytes would be a big file,
    // so those headers are checked against a small one (their offsets lie outside it).
    ExpectRefusedQuotingNothing(absl::StrCat("planted_", i), Raw(header, 77777),
                                {"SECRET", "987654", "98765", "77777", "4294967296"});
  }
  // A NaN: neither the value nor the tensor's name.
  std::string nan_data(4, '\0');
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan_data.data(), &nan, 4);
  const std::string nan_file =
      Raw(R"({"SECRETNAME": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 0) +
      nan_data;
  const std::string path = TempPath("planted_nan");
  WriteRaw(path, nan_file);
  SafetensorsReadOptions finite;
  finite.require_finite = true;
  const std::string message = WithoutPath(ReadSafetensors(path, nullptr, finite).status(), path);
  EXPECT_NE(message.find("tensor #0 (in name order) holds a NaN or infinity at index 0"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("SECRET"), std::string::npos) << message;
  EXPECT_EQ(message.find("nan"), std::string::npos) << message;
}

TEST(Safetensors, ReadSafetensors_KnownNames_AreQuotedOthersAreNot) {
  const std::string path = TempPath("known.safetensors");
  WriteRaw(path, Raw(R"({"expected": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]},)"
                     R"( "unexpected": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})",
                     6));
  const std::set<std::string> known = {"expected"};
  SafetensorsReadOptions options;
  options.known_names = &known;
  ExpectError(ReadSafetensors(path, nullptr, options).status(),
              absl::StatusCode::kInvalidArgument, path,
              "tensor 'expected' has a dtype other than \"F32\"");
  WriteRaw(path, Raw(R"({"expected": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                     R"( "unexpected": {"dtype": "F16", "shape": [1], "data_offsets": [4, 6]}})",
                     6));
  const absl::Status status = ReadSafetensors(path, nullptr, options).status();
  ExpectError(status, absl::StatusCode::kInvalidArgument, path,
              "tensor #1 (in name order) has a dtype other than");
  EXPECT_EQ(WithoutPath(status, path).find("unexpected"), std::string::npos) << status;
}

TEST(Safetensors, ReadSafetensors_NonFiniteWithRequireFinite_IsInvalidNamingTensorAndIndex) {
  TensorMap tensors;
  tensors["ok"] = {{2}, {1, 2}};
  tensors["w"] = {{3}, {1, 2, std::numeric_limits<float>::quiet_NaN()}};
  const std::string path = TempPath("nan.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  EXPECT_TRUE(ReadSafetensors(path).ok()) << "NaN is allowed unless refused";
  SafetensorsReadOptions options;
  options.require_finite = true;
  ExpectError(ReadSafetensors(path, nullptr, options).status(),
              absl::StatusCode::kInvalidArgument, path, "tensor #1 (in name order) holds a NaN or infinity at index 2");

  tensors["w"].values[0] = -std::numeric_limits<float>::infinity();
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  ExpectError(ReadSafetensors(path, nullptr, options).status(),
              absl::StatusCode::kInvalidArgument, path, "tensor #1 (in name order) holds a NaN or infinity at index 0");
}

TEST(Safetensors, WriteSafetensors_NoReplaceOverExistingFile_IsAlreadyExistsAndKeepsIt) {
  const std::string path = TempPath("existing.safetensors");
  TensorMap first;
  first["a"] = {{1}, {1}};
  ASSERT_TRUE(WriteSafetensors(path, first).ok());
  TensorMap second;
  second["a"] = {{1}, {2}};
  SafetensorsWriteOptions options;
  options.replace_existing = false;
  absl::Status status = WriteSafetensors(path, second, {}, options);
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists) << status;
  EXPECT_EQ(status.message(), path + " exists");
  auto read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->at("a").values, (std::vector<float>{1}));

  // The default replaces, as before.
  ASSERT_TRUE(WriteSafetensors(path, second).ok());
  EXPECT_EQ(ReadSafetensors(path)->at("a").values, (std::vector<float>{2}));
}

TEST(Safetensors, WriteSafetensors_NoReplaceToNewPath_Writes) {
  const std::string path = TempPath("fresh.safetensors");
  TensorMap tensors;
  tensors["a"] = {{1}, {5}};
  SafetensorsWriteOptions options;
  options.replace_existing = false;
  ASSERT_TRUE(WriteSafetensors(path, tensors, {}, options).ok());
  EXPECT_EQ(ReadSafetensors(path)->at("a").values, (std::vector<float>{5}));
}

TEST(Safetensors, WriteSafetensors_ValuesDoNotMatchShape_IsInvalidNamingTensor) {
  const std::string path = TempPath("mismatch.safetensors");
  TensorMap tensors;
  tensors["w"] = {{2, 2}, {1, 2, 3}};
  ExpectError(WriteSafetensors(path, tensors), absl::StatusCode::kInvalidArgument, path,
              "tensor 'w' has shape [2, 2] but 3 values");
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "nothing is written";
}

TEST(Safetensors, WriteSafetensors_MissingDirectory_IsNotFoundSayingSo) {
  const std::string directory = TempPath("no-such-dir");
  const std::string path = directory + "/step-00000001.safetensors";
  TensorMap tensors;
  tensors["a"] = {{1}, {5}};
  ExpectError(WriteSafetensors(path, tensors), absl::StatusCode::kNotFound, path,
              "(directory " + directory + " does not exist)");
}

// A directory swapped for a symbolic link after the path was resolved: with no_symlinks the
// write follows no link on the way (PERMISSION_DENIED, nothing written where the link points).
TEST(Safetensors, WriteSafetensors_NoSymlinks_RefusesALinkOnThePath) {
  const std::string real = TempPath("real-dir");
  const std::string elsewhere = TempPath("elsewhere");
  const std::string link = TempPath("swapped");
  std::filesystem::create_directories(real);
  std::filesystem::create_directories(elsewhere);
  std::filesystem::remove(link);
  TensorMap tensors;
  tensors["a"] = {{1}, {5}};
  SafetensorsWriteOptions options;
  options.no_symlinks = true;
  const std::string real_dir = std::filesystem::canonical(real).string();
  ASSERT_TRUE(WriteSafetensors(real_dir + "/ok.safetensors", tensors, {}, options).ok());
  std::filesystem::create_directory_symlink(std::filesystem::canonical(elsewhere), link);
  const std::string through_link =
      std::filesystem::canonical(TempPath("")).string() + "/swapped/out.safetensors";
  ExpectError(WriteSafetensors(through_link, tensors, {}, options),
              absl::StatusCode::kPermissionDenied, through_link, "symbolic link");
  EXPECT_FALSE(std::filesystem::exists(elsewhere + "/out.safetensors"));
  // Without the option a link is followed, as for any path a user gives.
  EXPECT_TRUE(WriteSafetensors(through_link, tensors).ok());
  EXPECT_TRUE(std::filesystem::exists(elsewhere + "/out.safetensors"));
}

TEST(Safetensors, WriteSafetensors_DirectoryIsAFile_IsFailedPrecondition) {
  const std::string file = TempPath("plain-file");
  WriteRaw(file, "x");
  TensorMap tensors;
  tensors["a"] = {{1}, {5}};
  ExpectError(WriteSafetensors(file + "/out.safetensors", tensors),
              absl::StatusCode::kFailedPrecondition, file + "/out.safetensors", "Not a directory");
}

}  // namespace
}  // namespace mptrain
