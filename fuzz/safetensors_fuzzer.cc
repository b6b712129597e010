// Fuzzes the safetensors reader (checkpoints and initial weights): the input becomes a file
// that ReadSafetensors reads, with and without require_finite. It must answer with tensors or
// an error naming the file, never crash, and the tensors it accepts must match their shapes.

#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "io/safetensors.h"

namespace {

// One file per process (parallel fuzzing jobs must not share it), overwritten each iteration.
const std::string& InputPath() {
  static const std::string* path = [] {
    const char* dir = getenv("TMPDIR");
    return new std::string(std::string(dir != nullptr && dir[0] != '\0' ? dir : "/tmp") +
                           "/mptrain_safetensors_fuzzer." + std::to_string(getpid()) +
                           ".safetensors");
  }();
  return *path;
}

void RemoveTempFile() { unlink(InputPath().c_str()); }

void WriteFileOrDie(const std::string& path, const uint8_t* data, size_t size) {
  FILE* file = fopen(path.c_str(), "wb");
  if (file == nullptr) abort();
  if (size > 0 && fwrite(data, 1, size, file) != size) abort();
  if (fclose(file) != 0) abort();
}

bool NamesFile(const absl::Status& status) {
  return std::string(status.message()).find(InputPath()) != std::string::npos;
}

// Shapes are non-negative and their product is the number of values.
bool AllFinite(const mptrain::TensorMap& tensors) {
  bool finite = true;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") abort();
    uint64_t count = 1;
    for (int64_t dim : tensor.shape) {
      if (dim < 0) abort();
      if (__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &count)) abort();
    }
    if (count != tensor.values.size()) abort();
    for (float value : tensor.values) finite &= std::isfinite(value);
  }
  return finite;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  atexit(RemoveTempFile);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  WriteFileOrDie(InputPath(), data, size);

  std::map<std::string, std::string> metadata;
  absl::StatusOr<mptrain::TensorMap> tensors = mptrain::ReadSafetensors(InputPath(), &metadata);
  if (!tensors.ok()) {
    if (!NamesFile(tensors.status())) abort();
  }
  const bool finite = tensors.ok() && AllFinite(*tensors);

  mptrain::SafetensorsReadOptions options;
  options.require_finite = true;
  absl::StatusOr<mptrain::TensorMap> checked =
      mptrain::ReadSafetensors(InputPath(), nullptr, options);
  // require_finite refuses exactly the files whose tensors hold a NaN or an Inf.
  if (checked.ok() != finite) abort();
  if (!checked.ok() && !NamesFile(checked.status())) abort();
  if (checked.ok() && checked->size() != tensors->size()) abort();
  return 0;
}
