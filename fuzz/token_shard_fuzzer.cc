// Fuzzes the token file reader (trainer/data/token_shards.h): the input becomes a file that
// InspectTokenFile and TokenBatches read, under options drawn from its size. Whatever the bytes:
// no crash, no allocation beyond the micro-batch; an accepted file gives micro-batches whose
// targets are the inputs shifted by one and whose ids are below vocab_size, and Seek(n) gives
// what n calls of Next() reached; every refusal names the file and never spells a header value
// (the version and count of a magic-bearing input, where they are too large to be a size).

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "trainer/data/token_shards.h"

namespace {

// One file per process (parallel fuzzing jobs must not share it), overwritten each iteration.
const std::string& InputPath() {
  static const std::string* path = [] {
    const char* dir = getenv("TMPDIR");
    return new std::string(std::string(dir != nullptr && dir[0] != '\0' ? dir : "/tmp") +
                           "/mptrain_token_shard_fuzzer." + std::to_string(getpid()) + ".bin");
  }();
  return *path;
}

void RemoveTempFile() { unlink(InputPath().c_str()); }

void WriteFileOrDie(const uint8_t* data, size_t size) {
  FILE* file = fopen(InputPath().c_str(), "wb");
  if (file == nullptr) abort();
  if (size > 0 && fwrite(data, 1, size, file) != size) abort();
  if (fclose(file) != 0) abort();
}

int32_t LittleInt32(const uint8_t* bytes) {
  uint32_t value = uint32_t{bytes[0]} | uint32_t{bytes[1]} << 8 | uint32_t{bytes[2]} << 16 |
                   uint32_t{bytes[3]} << 24;
  int32_t result;
  std::memcpy(&result, &value, sizeof(result));
  return result;
}

// A refusal names the file and spells none of the header's values that no size could be.
void CheckRefusal(const absl::Status& status, const uint8_t* data, size_t size) {
  if (status.ok()) return;
  const std::string message(status.message());
  if (message.find(InputPath()) == std::string::npos) abort();
  if (size >= 12 && LittleInt32(data) == mptrain::kTokenShardMagic) {
    for (int offset : {4, 8}) {
      const int64_t value = LittleInt32(data + offset);
      // Sizes, limits and counts a message may name are below 2^26 for fuzzer inputs.
      if (value >= (int64_t{1} << 26) || value <= -1000) {
        if (message.find(std::to_string(value)) != std::string::npos) abort();
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  atexit(RemoveTempFile);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  WriteFileOrDie(data, size);
  absl::StatusOr<mptrain::TokenFile> file = mptrain::InspectTokenFile("fuzz", InputPath());
  CheckRefusal(file.status(), data, size);
  if (file.ok() && file->first_token_byte + 2 * file->tokens != static_cast<int64_t>(size)) {
    abort();
  }

  mptrain::TokenBatchOptions options;
  options.batch = 1 + size % 3;
  options.context = 1 + (size / 3) % 5;
  options.world_size = 1 + static_cast<int>((size / 15) % 3);
  options.rank = static_cast<int>(size % options.world_size);
  options.vocab_size = (size / 45) % 2 == 0 ? 256 : 65536;
  options.shuffle = (size / 90) % 2 == 1;
  options.shuffle_seed = size;
  absl::StatusOr<mptrain::TokenBatches> batches =
      mptrain::TokenBatches::Open("fuzz", {InputPath()}, options);
  CheckRefusal(batches.status(), data, size);
  if (!batches.ok()) return 0;
  if (!file.ok()) abort();  // Open inspects the same file.

  const int64_t n = batches->tokens_per_micro_batch();
  std::vector<int32_t> x(n), y(n), first_x, sought_x(n), sought_y(n);
  const int64_t count = std::min<int64_t>(2 * batches->windows_per_epoch() + 1, 16);
  int64_t served = 0;
  for (int64_t i = 0; i < count; ++i) {
    absl::Status status = batches->Next(absl::MakeSpan(x), absl::MakeSpan(y));
    CheckRefusal(status, data, size);
    if (!status.ok()) {
      if (status.code() != absl::StatusCode::kInvalidArgument) abort();
      break;
    }
    for (int64_t j = 0; j < n; ++j) {
      if (x[j] < 0 || x[j] >= options.vocab_size || y[j] < 0 || y[j] >= options.vocab_size) {
        abort();
      }
      if (j + 1 < n && y[j] != x[j + 1]) abort();
    }
    if (i == 0) first_x = x;
    ++served;
  }
  if (served > 0) {
    // Back to the start, as every evaluation does: the first micro-batch again.
    if (!batches->Seek(0).ok()) abort();
    if (!batches->Next(absl::MakeSpan(sought_x), absl::MakeSpan(sought_y)).ok()) abort();
    if (sought_x != first_x) abort();
  }
  return 0;
}
