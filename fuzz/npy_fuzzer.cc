// Fuzzes the .npy readers (data sets every rank loads): the input becomes a file that
// ReadNpyMatrix and ReadNpyLabels read. They must answer with a value or an error, never crash,
// and what they accept must be self-consistent and survive a write and a re-read bit for bit.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "io/npy.h"

namespace {

// One file per process (parallel fuzzing jobs must not share it), overwritten each iteration.
std::string TempPath(const char* suffix) {
  const char* dir = getenv("TMPDIR");
  return std::string(dir != nullptr && dir[0] != '\0' ? dir : "/tmp") + "/mptrain_npy_fuzzer." +
         std::to_string(getpid()) + suffix;
}

const std::string& InputPath() {
  static const std::string* path = new std::string(TempPath(".npy"));
  return *path;
}

const std::string& RoundTripPath() {
  static const std::string* path = new std::string(TempPath(".rt.npy"));
  return *path;
}

void RemoveTempFiles() {
  unlink(InputPath().c_str());
  unlink(RoundTripPath().c_str());
}

void WriteFileOrDie(const std::string& path, const uint8_t* data, size_t size) {
  FILE* file = fopen(path.c_str(), "wb");
  if (file == nullptr) abort();
  if (size > 0 && fwrite(data, 1, size, file) != size) abort();
  if (fclose(file) != 0) abort();
}

void CheckMatrix(const mptrain::NpyMatrix& matrix) {
  if (matrix.rows <= 0 || matrix.cols <= 0) abort();
  if (static_cast<uint64_t>(matrix.rows) * static_cast<uint64_t>(matrix.cols) !=
      matrix.values.size()) {
    abort();
  }
}

// Every error of a reader names the file.
bool NamesFile(const absl::Status& status, const std::string& path) {
  return std::string(status.message()).find(path) != std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  atexit(RemoveTempFiles);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  WriteFileOrDie(InputPath(), data, size);

  absl::StatusOr<mptrain::NpyMatrix> matrix = mptrain::ReadNpyMatrix(InputPath());
  if (matrix.ok()) {
    CheckMatrix(*matrix);
    if (!mptrain::WriteNpyMatrix(RoundTripPath(), *matrix).ok()) abort();
    absl::StatusOr<mptrain::NpyMatrix> again = mptrain::ReadNpyMatrix(RoundTripPath());
    if (!again.ok() || again->rows != matrix->rows || again->cols != matrix->cols ||
        memcmp(again->values.data(), matrix->values.data(),
               matrix->values.size() * sizeof(float)) != 0) {
      abort();
    }
  } else if (!NamesFile(matrix.status(), InputPath())) {
    abort();
  }

  absl::StatusOr<mptrain::NpyLabels> labels = mptrain::ReadNpyLabels(InputPath());
  if (labels.ok()) {
    if (labels->count <= 0 || static_cast<uint64_t>(labels->count) != labels->values.size()) {
      abort();
    }
    if (!mptrain::WriteNpyLabels(RoundTripPath(), *labels).ok()) abort();
    absl::StatusOr<mptrain::NpyLabels> again = mptrain::ReadNpyLabels(RoundTripPath());
    if (!again.ok() || again->values != labels->values) abort();
  } else if (!NamesFile(labels.status(), InputPath())) {
    abort();
  }
  return 0;
}
