#pragma once

// Reading and writing .npy files: 2-D float32 matrices (features, targets) and 1-D int64/int32
// labels. The readers are total: any file — a directory, a FIFO, a device, a symbolic link, a
// hostile or truncated header, a shape whose size overflows — gives an error naming the file,
// never an exception, a crash or a blocked rank.
//
// What a reader accepts: a regular file (not a symbolic link) holding format version 1.0, 2.0 or
// 3.0; a header of at most 64 KiB that is a Python dict literal with exactly the keys 'descr',
// 'fortran_order' and 'shape'; fortran_order False; every dimension a decimal integer > 0; and
// exactly as many data bytes as the shape and dtype need.
//
// Errors of every reader: NOT_FOUND when the file does not exist; PERMISSION_DENIED when it is
// a symbolic link ("<path>: is a symbolic link") or cannot be read; INVALID_ARGUMENT when it is
// not a regular file ("<path>: not a regular file") or its contents are not what the reader
// accepts (the message names the file, the header field at fault and the rule or limit).
//
// No error quotes or derives a value from the file: not a byte, a key, a dtype, a shape, a
// header length, a version, a byte count, a value, nor the file's size (the file may be
// anyone's). At most a position: a dimension's index, a row and a column.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mptrain {

struct NpyMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> values;  // rows * cols, row-major.
};

struct NpyLabels {
  int64_t count = 0;
  std::vector<int64_t> values;  // count class indices; their range is the caller's to check.
};

// A 2-D array of dtype '<f4' (little-endian float32) in C order, every value finite (a NaN
// or infinity is INVALID_ARGUMENT naming its row and column).
absl::StatusOr<NpyMatrix> ReadNpyMatrix(const std::string& path);

// A 1-D array of shape (N,), or a 2-D one of shape (N, 1), of dtype '<i8' or '<i4' (int32
// values are widened); any other dtype is refused.
absl::StatusOr<NpyLabels> ReadNpyLabels(const std::string& path);

// Writes a 2-D float32 array (format version 1.0). INVALID_ARGUMENT when values.size() is not
// rows * cols.
absl::Status WriteNpyMatrix(const std::string& path, const NpyMatrix& matrix);

// Writes a 1-D '<i8' array of shape (count,) (format version 1.0). INVALID_ARGUMENT when
// values.size() is not count.
absl::Status WriteNpyLabels(const std::string& path, const NpyLabels& labels);

}  // namespace mptrain
