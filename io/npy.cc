#include "io/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "io/regular_file.h"

namespace mptrain {
namespace {

// The data is copied byte for byte into host integers and floats.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the .npy readers assume little-endian");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
// numpy refuses headers over 10,000 bytes by default; 64 KiB leaves room for other writers
// while a corrupt length field can make us read or allocate no more than that.
constexpr uint64_t kMaxHeaderBytes = 64 * 1024;

constexpr char kMatrixKind[] = "2-D float32";
constexpr char kLabelsKind[] = "int64/int32 label";

// ---------------------------------------------------------------------------------------------
// The header: a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and a newline. numpy reads it with ast.literal_eval; we accept the subset
// that numpy writes, and refuse everything else with the reason.

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  uint64_t data_offset = 0;  // From the start of the file.
};

std::string ShapeText(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  // INVALID_ARGUMENT with the reason only; the caller adds the path.
  absl::Status Parse(NpyHeader* header) {
    SkipSpace();
    if (!Consume('{')) return Error("the header is not a dict literal (no '{')");
    bool has_descr = false, has_fortran_order = false, has_shape = false;
    SkipSpace();
    while (!Consume('}')) {
      absl::StatusOr<std::string> key = QuotedString("a key");
      if (!key.ok()) return key.status();
      SkipSpace();
      if (!Consume(':')) return Error("no ':' after a key");
      SkipSpace();
      if (*key == "descr") {
        if (has_descr) return Error("the key 'descr' appears twice");
        has_descr = true;
        if (AtEnd() || (Peek() != '\'' && Peek() != '"')) {
          return Error("'descr' is not a string (structured dtypes are not supported)");
        }
        absl::StatusOr<std::string> descr = QuotedString("'descr'");
        if (!descr.ok()) return descr.status();
        header->descr = *std::move(descr);
      } else if (*key == "fortran_order") {
        if (has_fortran_order) return Error("the key 'fortran_order' appears twice");
        has_fortran_order = true;
        absl::StatusOr<bool> fortran_order = Boolean("'fortran_order'");
        if (!fortran_order.ok()) return fortran_order.status();
        header->fortran_order = *fortran_order;
      } else if (*key == "shape") {
        if (has_shape) return Error("the key 'shape' appears twice");
        has_shape = true;
        absl::Status status = Shape(&header->shape);
        if (!status.ok()) return status;
      } else {
        return Error("an unexpected key (only 'descr', 'fortran_order' and 'shape' are allowed)");
      }
      SkipSpace();
      if (Consume(',')) {
        SkipSpace();
        continue;
      }
      if (Consume('}')) break;
      // `key` is one of the three above (any other was refused): not the file's to name.
      return Error(absl::StrCat("no ',' or '}' after the value of '", *key, "'"));
    }
    SkipSpace();
    if (!AtEnd()) {
      return Error("unexpected text after the header dict");
    }
    if (!has_descr) return Error("the header has no 'descr'");
    if (!has_fortran_order) return Error("the header has no 'fortran_order'");
    if (!has_shape) return Error("the header has no 'shape'");
    return absl::OkStatus();
  }

 private:
  static absl::Status Error(const std::string& why) { return absl::InvalidArgumentError(why); }
  static bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }
  void SkipSpace() {
    while (!AtEnd() && IsSpace(Peek())) ++pos_;
  }
  bool Consume(char c) {
    if (AtEnd() || Peek() != c) return false;
    ++pos_;
    return true;
  }

  // A '...' or "..." string of printable ASCII without escapes.
  absl::StatusOr<std::string> QuotedString(const char* what) {
    if (AtEnd() || (Peek() != '\'' && Peek() != '"')) {
      return Error(absl::StrCat("expected a quoted string for ", what));
    }
    const char quote = text_[pos_++];
    const size_t start = pos_;
    while (!AtEnd() && Peek() != quote) {
      const unsigned char c = static_cast<unsigned char>(Peek());
      if (c == '\\' || c < 0x20 || c >= 0x7f) {
        return Error(absl::StrCat("the string for ", what, " has an escape or a non-ASCII byte"));
      }
      ++pos_;
    }
    if (AtEnd()) return Error(absl::StrCat("the string for ", what, " is not closed"));
    std::string value(text_.substr(start, pos_ - start));
    ++pos_;
    return value;
  }

  absl::StatusOr<bool> Boolean(const char* what) {
    for (const auto& [word, value] : {std::pair<absl::string_view, bool>{"True", true},
                                      std::pair<absl::string_view, bool>{"False", false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    return Error(absl::StrCat(what, " is not True or False"));
  }

  // A tuple of dimensions: (), (N,), (N, M), ... with an optional trailing comma.
  absl::Status Shape(std::vector<int64_t>* shape) {
    if (!Consume('(')) return Error("'shape' is not a tuple");
    bool comma_after_last = false;
    while (true) {
      SkipSpace();
      if (Consume(')')) break;
      if (AtEnd()) return Error("'shape' is not closed");
      const size_t start = pos_;
      while (!AtEnd() && !IsSpace(Peek()) && Peek() != ',' && Peek() != ')') ++pos_;
      const absl::string_view token = text_.substr(start, pos_ - start);
      if (token.empty()) return Error("'shape' has an empty element");
      absl::StatusOr<int64_t> dimension = Dimension(token, shape->size());
      if (!dimension.ok()) return dimension.status();
      shape->push_back(*dimension);
      SkipSpace();
      if (Consume(',')) {
        comma_after_last = true;
        continue;
      }
      if (Consume(')')) {
        comma_after_last = false;
        break;
      }
      return Error(absl::StrCat("'shape'[", shape->size() - 1, "] is not followed by ',' or ')'"));
    }
    if (shape->size() == 1 && !comma_after_last) {
      return Error("'shape' is a parenthesised number, not a tuple (a 1-D shape is written (N,))");
    }
    return absl::OkStatus();
  }

  // A decimal integer > 0 that fits in int64, parsed with overflow checks.
  static absl::StatusOr<int64_t> Dimension(absl::string_view token, size_t index) {
    const std::string field = absl::StrCat("'shape'[", index, "]");
    if (token[0] == '-') {
      return Error(absl::StrCat(field, " is negative; every dimension must be > 0"));
    }
    const bool leading_zero = token.size() > 1 && token[0] == '0';
    for (char c : token) {
      if (c < '0' || c > '9' || leading_zero) {
        return Error(absl::StrCat(field, " is not a decimal integer"));
      }
    }
    int64_t value = 0;
    for (char c : token) {
      if (__builtin_mul_overflow(value, int64_t{10}, &value) ||
          __builtin_add_overflow(value, int64_t{c - '0'}, &value)) {
        return Error(absl::StrCat(field, " is too large for int64"));
      }
    }
    if (value == 0) return Error(absl::StrCat(field, " is not > 0; every dimension must be"));
    return value;
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

absl::Status Bad(const std::string& path, const char* kind, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": not a ", kind, " .npy file: ", why));
}

// Reads the preamble and parses the header, reading no more than the header's declared length
// after checking it against the cap and the file size.
absl::StatusOr<NpyHeader> ReadHeader(const RegularFile& file, const std::string& path,
                                     const char* kind) {
  unsigned char preamble[12] = {};
  const uint64_t preamble_read = file.size < sizeof(preamble) ? file.size : sizeof(preamble);
  absl::Status status = ReadAt(file, path, 0, preamble, preamble_read);
  if (!status.ok()) return status;
  if (preamble_read < kMagicSize + 4 || std::memcmp(preamble, kMagic, kMagicSize) != 0) {
    return Bad(path, kind, "missing the \\x93NUMPY magic");
  }
  const int major = preamble[6];
  const int minor = preamble[7];
  uint64_t header_start = 0;
  uint64_t header_len = 0;
  if (major == 1 && minor == 0) {
    header_start = 10;
    header_len = uint64_t{preamble[8]} | (uint64_t{preamble[9]} << 8);
  } else if ((major == 2 || major == 3) && minor == 0) {
    if (preamble_read < 12) return Bad(path, kind, "the file ends inside the preamble");
    header_start = 12;
    header_len = uint64_t{preamble[8]} | (uint64_t{preamble[9]} << 8) |
                 (uint64_t{preamble[10]} << 16) | (uint64_t{preamble[11]} << 24);
  } else {
    return Bad(path, kind, "an unsupported format version (1.0, 2.0 and 3.0 are supported)");
  }
  if (header_len > kMaxHeaderBytes) {
    return Bad(path, kind,
               absl::StrCat("its header length exceeds the limit of ", kMaxHeaderBytes, " bytes"));
  }
  if (header_len > file.size - header_start) {
    return Bad(path, kind, "its header length runs past the end of the file");
  }
  std::string text(header_len, '\0');
  status = ReadAt(file, path, header_start, text.data(), header_len);
  if (!status.ok()) return status;
  NpyHeader header;
  status = HeaderParser(text).Parse(&header);
  if (!status.ok()) return Bad(path, kind, status.message());
  header.data_offset = header_start + header_len;
  return header;
}

// The element count of `header.shape`, after checking that the data after the header holds
// exactly count * item_size bytes. Every product is overflow-checked: a shape whose byte size
// wraps around must not pass as a small one.
absl::StatusOr<uint64_t> CheckDataSize(const RegularFile& file, const std::string& path,
                                       const char* kind, const NpyHeader& header,
                                       uint64_t item_size) {
  uint64_t count = 1;
  for (int64_t dimension : header.shape) {
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(dimension), &count)) {
      return Bad(path, kind, "'shape' has more elements than fit in 64 bits");
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(count, item_size, &bytes)) {
    return Bad(path, kind,
               absl::StrCat("'shape' of ", item_size,
                            "-byte elements needs more bytes than fit in 64 bits"));
  }
  const uint64_t available = file.size - header.data_offset;
  if (available < bytes) {
    return Bad(path, kind, "truncated: its data is shorter than 'shape' and 'descr' need");
  }
  if (available > bytes) {
    return Bad(path, kind,
               "extra bytes after the array: its data is longer than 'shape' and 'descr' need");
  }
  return count;
}

absl::StatusOr<NpyMatrix> ReadNpyMatrixOrThrow(const std::string& path) {
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<NpyHeader> header = ReadHeader(*file, path, kMatrixKind);
  if (!header.ok()) return header.status();
  if (header->descr != "<f4") {
    return Bad(path, kMatrixKind, "'descr' is not '<f4' (little-endian float32)");
  }
  if (header->fortran_order) return Bad(path, kMatrixKind, "Fortran order; save it in C order");
  if (header->shape.size() != 2) {
    return Bad(path, kMatrixKind, "'shape' does not have 2 dimensions (rows, columns)");
  }
  absl::StatusOr<uint64_t> count = CheckDataSize(*file, path, kMatrixKind, *header, sizeof(float));
  if (!count.ok()) return count.status();
  NpyMatrix matrix;
  matrix.rows = header->shape[0];
  matrix.cols = header->shape[1];
  matrix.values.resize(*count);
  absl::Status status =
      ReadAt(*file, path, header->data_offset, matrix.values.data(), *count * sizeof(float));
  if (!status.ok()) return status;
  // A NaN or infinity would make every loss NaN and the run "succeed" at nothing. The position
  // only: the value is the file's.
  for (size_t i = 0; i < matrix.values.size(); ++i) {
    if (!std::isfinite(matrix.values[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": row ", i / matrix.cols, ", column ", i % matrix.cols,
          " is not finite (NaN or infinity); every value must be finite"));
    }
  }
  return matrix;
}

absl::StatusOr<NpyLabels> ReadNpyLabelsOrThrow(const std::string& path) {
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<NpyHeader> header = ReadHeader(*file, path, kLabelsKind);
  if (!header.ok()) return header.status();
  const bool is_int64 = header->descr == "<i8";
  if (!is_int64 && header->descr != "<i4") {
    return Bad(path, kLabelsKind, "'descr' is not '<i8' (int64) or '<i4' (int32)");
  }
  if (header->fortran_order) return Bad(path, kLabelsKind, "Fortran order; save it in C order");
  const std::vector<int64_t>& shape = header->shape;
  if (!(shape.size() == 1 || (shape.size() == 2 && shape[1] == 1))) {
    return Bad(path, kLabelsKind, "'shape' is not (N,) or (N, 1)");
  }
  const uint64_t item_size = is_int64 ? sizeof(int64_t) : sizeof(int32_t);
  absl::StatusOr<uint64_t> count = CheckDataSize(*file, path, kLabelsKind, *header, item_size);
  if (!count.ok()) return count.status();
  NpyLabels labels;
  labels.count = shape[0];
  labels.values.resize(*count);
  if (is_int64) {
    absl::Status status = ReadAt(*file, path, header->data_offset, labels.values.data(),
                                 *count * sizeof(int64_t));
    if (!status.ok()) return status;
  } else {
    std::vector<int32_t> narrow(*count);
    absl::Status status =
        ReadAt(*file, path, header->data_offset, narrow.data(), *count * sizeof(int32_t));
    if (!status.ok()) return status;
    std::copy(narrow.begin(), narrow.end(), labels.values.begin());
  }
  return labels;
}

// Format version 1.0: magic, version, 2-byte header length, header padded with spaces and a
// newline so that the data starts on a 64-byte boundary (as numpy writes it).
absl::Status WriteNpy(const std::string& path, const char* descr, const std::string& shape,
                      const void* data, size_t bytes) {
  std::string header = absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': ",
                                    shape, ", }");
  const size_t total = kMagicSize + 4 + header.size() + 1;
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
  file.write(static_cast<const char*>(data), bytes);
  file.close();
  if (!file) return absl::DataLossError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NpyMatrix> ReadNpyMatrix(const std::string& path) {
  return NoThrow(path, [&] { return ReadNpyMatrixOrThrow(path); });
}

absl::StatusOr<NpyLabels> ReadNpyLabels(const std::string& path) {
  return NoThrow(path, [&] { return ReadNpyLabelsOrThrow(path); });
}

absl::Status WriteNpyMatrix(const std::string& path, const NpyMatrix& matrix) {
  int64_t count = 0;
  if (matrix.rows < 0 || matrix.cols < 0 ||
      __builtin_mul_overflow(matrix.rows, matrix.cols, &count) ||
      static_cast<uint64_t>(count) != matrix.values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot write a ", matrix.rows, " x ",
                                                   matrix.cols, " matrix from ",
                                                   matrix.values.size(), " values"));
  }
  return WriteNpy(path, "<f4", ShapeText({matrix.rows, matrix.cols}), matrix.values.data(),
                  matrix.values.size() * sizeof(float));
}

absl::Status WriteNpyLabels(const std::string& path, const NpyLabels& labels) {
  if (labels.count < 0 || static_cast<uint64_t>(labels.count) != labels.values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot write ", labels.count,
                                                   " labels from ", labels.values.size(),
                                                   " values"));
  }
  return WriteNpy(path, "<i8", ShapeText({labels.count}), labels.values.data(),
                  labels.values.size() * sizeof(int64_t));
}

}  // namespace mptrain
