// Fuzzes the .npy readers (data sets every rank loads): the input becomes a file that
// ReadNpyMatrix and ReadNpyLabels read. They must answer with a value or an error, never crash,
// and what they accept must be self-consistent and survive a write and a re-read bit for bit.
// No error may quote the file or spell a number read from it (fuzz/error_leak_check.h): the
// input's own header length, and in planted variants a version, a header length of "r:*:" and
// a file size of kPlantedSize bytes.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/error_leak_check.h"

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

// The format's own words, which a message names and a valid file holds.
const std::vector<std::string>& Vocabulary() {
  static const auto* words = new std::vector<std::string>{
      "'descr'", "'fortran_order'", "'shape'", "descr", "fortran_order", "shape", "'<f4'",
      "'<i8'", "'<i4'", "True", "False"};
  return *words;
}

constexpr uint64_t kPlantedSize = 7777777;

void CheckQuotesNothing(const absl::Status& status, std::string_view input) {
  if (status.ok()) return;
  mptrain::fuzz::AbortIfQuotesInput(status, InputPath(), mptrain::fuzz::InputRuns(input),
                                    Vocabulary());
  if (input.size() >= 12) {
    // A version 2.0/3.0 header length; one of 1.0 (< 65536) could be the limit by chance.
    const auto byte = [&](size_t i) { return uint64_t{static_cast<unsigned char>(input[i])}; };
    const uint64_t header_len = byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24;
    if (header_len >= 100000) {
      mptrain::fuzz::AbortIfSpellsNumberIn(status, InputPath(), header_len, header_len,
                                           "the header length");
    }
  }
}

// Reads `bytes` (extended to `size` bytes) with both readers; both must refuse it.
std::vector<absl::Status> RefusalsOf(std::string_view bytes, uint64_t size) {
  mptrain::fuzz::WriteExtendedFileOrDie(InputPath(), bytes, size);
  std::vector<absl::Status> refusals = {mptrain::ReadNpyMatrix(InputPath()).status(),
                                        mptrain::ReadNpyLabels(InputPath()).status()};
  return refusals;
}

void CheckPlantedVariants(std::string_view input) {
  std::string planted(input);
  if (planted.size() < 12) planted.resize(12, '\0');
  std::memcpy(planted.data(), "\x93NUMPY", 6);
  planted[6] = static_cast<char>(202);  // Version 202.254: unsupported.
  planted[7] = static_cast<char>(254);
  for (const absl::Status& status : RefusalsOf(planted, planted.size())) {
    if (status.ok()) abort();
    mptrain::fuzz::AbortIfSpells(status, InputPath(), "202", "a planted version");
    mptrain::fuzz::AbortIfSpells(status, InputPath(), "254", "a planted version");
  }
  planted[6] = 2;
  planted[7] = 0;
  std::memcpy(planted.data() + 8, "r:*:", 4);  // Header length 979,253,874: over the cap.
  for (const absl::Status& status : RefusalsOf(planted, planted.size())) {
    if (status.ok()) abort();
    mptrain::fuzz::AbortIfSpellsNumberIn(status, InputPath(), 979253874, 979253874,
                                         "a planted header length");
    mptrain::fuzz::AbortIfSpells(status, InputPath(), "r:*:", "planted bytes");
  }
  if (input.size() >= kPlantedSize) return;
  for (const absl::Status& status : RefusalsOf(input, kPlantedSize)) {
    // Rows and columns of a NaN lie within the input's bytes, far below the planted size.
    if (!status.ok()) {
      mptrain::fuzz::AbortIfSpellsNumberIn(status, InputPath(), kPlantedSize - input.size(),
                                           kPlantedSize, "a planted file size");
    }
  }
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
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  CheckQuotesNothing(matrix.status(), input);

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
  CheckQuotesNothing(labels.status(), input);
  CheckPlantedVariants(input);
  return 0;
}
