#include "io/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "absl/strings/str_cat.h"

namespace mptrain {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

absl::Status Bad(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": not a 2-D float32 .npy file: ", why));
}

}  // namespace

absl::StatusOr<NpyMatrix> ReadNpyMatrix(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (bytes.size() < kMagicSize + 4 || bytes.compare(0, kMagicSize, kMagic, kMagicSize) != 0) {
    return Bad(path, "missing the \\x93NUMPY magic");
  }
  const uint8_t major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0;
  size_t header_start = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Bad(path, "truncated header");
    uint32_t len32 = 0;
    std::memcpy(&len32, bytes.data() + 8, 4);
    header_len = len32;
    header_start = 12;
  } else {
    return Bad(path, absl::StrCat("unsupported format version ", int{major}));
  }
  if (header_start + header_len > bytes.size()) return Bad(path, "truncated header");
  const std::string header = bytes.substr(header_start, header_len);

  std::smatch match;
  if (!std::regex_search(header, match, std::regex(R"('descr'\s*:\s*'([^']*)')"))) {
    return Bad(path, "header has no 'descr'");
  }
  const std::string descr = match[1];
  if (descr != "<f4" && descr != "=f4") {
    return Bad(path, absl::StrCat("dtype is '", descr, "', expected '<f4' (float32)"));
  }
  if (!std::regex_search(header, match, std::regex(R"('fortran_order'\s*:\s*(True|False))"))) {
    return Bad(path, "header has no 'fortran_order'");
  }
  if (match[1] == "True") return Bad(path, "Fortran order; save it in C order");
  if (!std::regex_search(header, match, std::regex(R"('shape'\s*:\s*\(([^)]*)\))"))) {
    return Bad(path, "header has no 'shape'");
  }
  std::vector<int64_t> shape;
  const std::string dims = match[1];
  std::regex number(R"(\d+)");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), number);
       it != std::sregex_iterator(); ++it) {
    shape.push_back(std::stoll(it->str()));
  }
  if (shape.size() != 2) {
    return Bad(path, absl::StrCat("shape has ", shape.size(), " dimensions, expected 2"));
  }
  NpyMatrix matrix;
  matrix.rows = shape[0];
  matrix.cols = shape[1];
  const size_t data_start = header_start + header_len;
  const size_t expected = static_cast<size_t>(matrix.rows) * matrix.cols * sizeof(float);
  if (bytes.size() - data_start < expected) {
    return Bad(path, absl::StrCat("truncated: shape (", matrix.rows, ", ", matrix.cols,
                                  ") needs ", expected, " bytes of data, file has ",
                                  bytes.size() - data_start));
  }
  matrix.values.resize(static_cast<size_t>(matrix.rows) * matrix.cols);
  std::memcpy(matrix.values.data(), bytes.data() + data_start, expected);
  return matrix;
}

absl::Status WriteNpyMatrix(const std::string& path, const NpyMatrix& matrix) {
  std::string header = absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (",
                                    matrix.rows, ", ", matrix.cols, "), }");
  // Pad so that the data starts on a 64-byte boundary, ending the header with '\n'.
  size_t total = kMagicSize + 4 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  file.write(kMagic, kMagicSize);
  const char version[2] = {1, 0};
  file.write(version, 2);
  const uint16_t header_len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(header_len & 0xff),
                             static_cast<char>(header_len >> 8)};
  file.write(len_bytes, 2);
  file.write(header.data(), header.size());
  file.write(reinterpret_cast<const char*>(matrix.values.data()),
             matrix.values.size() * sizeof(float));
  if (!file) return absl::DataLossError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

}  // namespace mptrain
