#pragma once

// Reading and writing 2-D float32 .npy files (C order), bounds-checked: a truncated or malformed
// file, another dtype, Fortran order or a wrong shape gives an error naming the file.

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

// INVALID_ARGUMENT for anything but a 2-D little-endian float32 C-order array;
// NOT_FOUND when the file cannot be opened.
absl::StatusOr<NpyMatrix> ReadNpyMatrix(const std::string& path);

// Writes a 2-D float32 array (format version 1.0).
absl::Status WriteNpyMatrix(const std::string& path, const NpyMatrix& matrix);

}  // namespace mptrain
