// Fuzzes the token file reader (trainer/data/token_shards.h): the input becomes a file that
// InspectTokenFile and TokenBatches read, under options drawn from its size. Whatever the bytes:
// no crash, no allocation beyond the micro-batch; an accepted file gives micro-batches whose
// targets are the inputs shifted by one and whose ids are below vocab_size, and Seek(n) gives
// what n calls of Next() reached. Every refusal names the file, quotes no run of its bytes and
// spells no number read from it (fuzz/error_leak_check.h): the input's own header values where
// no limit could spell them, and in planted variants a version, a token count and a file size.

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

constexpr uint64_t kPlantedSize = 7777777;  // odd: refused as a raw file too
constexpr int32_t kPlantedVersion = 987654;
constexpr int32_t kPlantedCount = 876543210;

// A refusal names the file, quotes none of its bytes and spells none of the header's values
// that no limit, window or position of a fuzzer input could be.
void CheckRefusal(const absl::Status& status, std::string_view input) {
  if (status.ok()) return;
  if (std::string(status.message()).find(InputPath()) == std::string::npos) abort();
  mptrain::fuzz::AbortIfQuotesInput(status, InputPath(), mptrain::fuzz::InputRuns(input), {});
  const auto* bytes = reinterpret_cast<const uint8_t*>(input.data());
  if (input.size() >= 12 && LittleInt32(bytes) == mptrain::kTokenShardMagic) {
    for (int offset : {4, 8}) {
      const int64_t value = LittleInt32(bytes + offset);
      if (value >= (int64_t{1} << 26)) {
        mptrain::fuzz::AbortIfSpellsNumberIn(status, InputPath(), value, value, "a header value");
      }
    }
  }
}

// Planted values the refusals must not spell: a shard header with a version, then a token
// count, of distinctive digits; the input extended to an odd planted size.
void CheckPlantedVariants(std::string_view input) {
  std::string planted(input);
  if (planted.size() < 1024) planted.resize(1024, '\0');
  const auto put = [&](size_t at, int32_t value) {
    for (int i = 0; i < 4; ++i) planted[at + i] = static_cast<char>((uint32_t(value) >> (8 * i)));
  };
  put(0, mptrain::kTokenShardMagic);
  put(4, kPlantedVersion);
  mptrain::fuzz::WriteExtendedFileOrDie(InputPath(), planted, planted.size());
  absl::Status version = mptrain::InspectTokenFile("fuzz", InputPath()).status();
  if (version.ok()) abort();
  mptrain::fuzz::AbortIfSpellsNumberIn(version, InputPath(), kPlantedVersion, kPlantedVersion,
                                       "a planted version");
  put(4, mptrain::kTokenShardVersion);
  put(8, kPlantedCount);
  mptrain::fuzz::WriteExtendedFileOrDie(InputPath(), planted, planted.size());
  absl::Status count = mptrain::InspectTokenFile("fuzz", InputPath()).status();
  if (count.ok()) abort();
  mptrain::fuzz::AbortIfSpellsNumberIn(count, InputPath(), kPlantedCount, kPlantedCount,
                                       "a planted token count");
  if (input.size() >= kPlantedSize) return;
  mptrain::fuzz::WriteExtendedFileOrDie(InputPath(), input, kPlantedSize);
  absl::Status sized = mptrain::InspectTokenFile("fuzz", InputPath()).status();
  // Odd: refused whether it reads as a raw file or a shard (1024 + 2n is even).
  if (sized.ok()) abort();
  mptrain::fuzz::AbortIfSpellsNumberIn(sized, InputPath(), kPlantedSize - input.size(),
                                       kPlantedSize, "a planted file size");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  atexit(RemoveTempFile);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  WriteFileOrDie(data, size);
  absl::StatusOr<mptrain::TokenFile> file = mptrain::InspectTokenFile("fuzz", InputPath());
  CheckRefusal(file.status(), input);
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
  CheckRefusal(batches.status(), input);
  if (!batches.ok()) return 0;
  if (!file.ok()) abort();  // Open inspects the same file.

  const int64_t n = batches->tokens_per_micro_batch();
  std::vector<int32_t> x(n), y(n), first_x, sought_x(n), sought_y(n);
  const int64_t count = std::min<int64_t>(2 * batches->windows_per_epoch() + 1, 16);
  int64_t served = 0;
  for (int64_t i = 0; i < count; ++i) {
    absl::Status status = batches->Next(absl::MakeSpan(x), absl::MakeSpan(y));
    CheckRefusal(status, input);
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
  CheckPlantedVariants(input);
  return 0;
}
