// Fuzzes the safetensors reader (checkpoints and initial weights): the input becomes a file
// that ReadSafetensors reads, with and without require_finite. It must answer with tensors or
// an error naming the file, never crash, and the tensors it accepts must match their shapes.
// No error may quote the file or spell a number read from it (fuzz/error_leak_check.h): the
// input's own header length, and in two planted variants a header length of "root:*:2" (as
// /etc/shadow's first 8 bytes read) and a file size of kPlantedSize bytes.

#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "fuzz/error_leak_check.h"

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

// The format's own words, which a message names and a valid file holds.
const std::vector<std::string>& Vocabulary() {
  static const auto* words = new std::vector<std::string>{
      "__metadata__", "data_offsets", mptrain::kDataDigestKey, "dtype", "shape", "F32"};
  return *words;
}

constexpr uint64_t kPlantedSize = 7777777;

// Every check of fuzz/error_leak_check.h on an error of reading `input`.
void CheckQuotesNothing(const absl::Status& status, std::string_view input) {
  if (status.ok()) return;
  mptrain::fuzz::AbortIfQuotesInput(status, InputPath(), mptrain::fuzz::InputRuns(input),
                                    Vocabulary());
  if (input.size() >= 8) {
    uint64_t header_len = 0;
    std::memcpy(&header_len, input.data(), 8);
    // Shorter values could be a limit or a position by chance; these no message spells.
    if (header_len >= 10'000'000'000u) {
      mptrain::fuzz::AbortIfSpellsNumberIn(status, InputPath(), header_len, header_len,
                                           "the header length");
    }
    if (header_len >= 0x10000000u) {
      mptrain::fuzz::AbortIfSpells(status, InputPath(), absl::StrFormat("%x", header_len),
                                   "the header length in hex");
    }
  }
}

// The planted variants: the message must spell neither the planted header length nor the
// planted size or anything the size minus at most the input's bytes could be.
void CheckPlantedVariants(std::string_view input) {
  std::string shadow(input);
  if (shadow.size() < 8) shadow.resize(8, '\0');
  std::memcpy(shadow.data(), "root:*:2", 8);
  mptrain::fuzz::WriteExtendedFileOrDie(InputPath(), shadow, shadow.size());
  absl::Status status = mptrain::ReadSafetensors(InputPath()).status();
  if (status.ok()) abort();  // 3619251681095544690 bytes of header cannot fit.
  mptrain::fuzz::AbortIfSpellsNumberIn(status, InputPath(), 3619251681095544690u,
                                       3619251681095544690u, "a planted header length");
  mptrain::fuzz::AbortIfSpells(status, InputPath(), "323a2a3a746f6f72",
                               "a planted header length in hex");
  mptrain::fuzz::AbortIfSpells(status, InputPath(), "root", "planted bytes");

  if (input.size() >= kPlantedSize) return;
  mptrain::fuzz::WriteExtendedFileOrDie(InputPath(), input, kPlantedSize);
  status = mptrain::ReadSafetensors(InputPath()).status();
  if (status.ok()) return;
  mptrain::fuzz::AbortIfSpellsNumberIn(status, InputPath(), kPlantedSize - input.size(),
                                       kPlantedSize, "a planted file size");
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
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (!tensors.ok()) {
    if (!NamesFile(tensors.status())) abort();
    CheckQuotesNothing(tensors.status(), input);
  }
  const bool finite = tensors.ok() && AllFinite(*tensors);

  mptrain::SafetensorsReadOptions options;
  options.require_finite = true;
  absl::StatusOr<mptrain::TensorMap> checked =
      mptrain::ReadSafetensors(InputPath(), nullptr, options);
  // require_finite refuses exactly the files whose tensors hold a NaN or an Inf.
  if (checked.ok() != finite) abort();
  if (!checked.ok() && !NamesFile(checked.status())) abort();
  CheckQuotesNothing(checked.status(), input);
  if (checked.ok() && checked->size() != tensors->size()) abort();
  CheckPlantedVariants(input);
  return 0;
}
