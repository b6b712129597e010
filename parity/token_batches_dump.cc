// Writes the micro-batches TokenBatches cuts (trainer/data/token_shards.h) to stdout as
// little-endian int32, inputs then targets of each micro-batch, for token_batches_test.py to
// compare with parity/token_batches.py.
//
//   token_batches_dump B T RANK WORLD COUNT SHUFFLE SEED SEEK FILE...
//
// SEEK > 0: Seek(SEEK) first, then write COUNT - SEEK micro-batches (the resume path).

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trainer/data/token_shards.h"

int main(int argc, char** argv) {
  if (argc < 10) {
    std::fprintf(stderr, "usage: %s B T RANK WORLD COUNT SHUFFLE SEED SEEK FILE...\n", argv[0]);
    return 2;
  }
  mptrain::TokenBatchOptions options;
  options.batch = std::atoll(argv[1]);
  options.context = std::atoll(argv[2]);
  options.rank = std::atoi(argv[3]);
  options.world_size = std::atoi(argv[4]);
  const long long count = std::atoll(argv[5]);
  options.shuffle = std::atoi(argv[6]) != 0;
  options.shuffle_seed = std::strtoull(argv[7], nullptr, 10);
  const long long seek = std::atoll(argv[8]);
  options.vocab_size = 65536;
  const std::vector<std::string> files(argv + 9, argv + argc);
  absl::StatusOr<mptrain::TokenBatches> batches =
      mptrain::TokenBatches::Open("files", files, options);
  if (!batches.ok()) {
    std::fprintf(stderr, "%s\n", batches.status().ToString().c_str());
    return 1;
  }
  if (seek > 0) {
    if (absl::Status status = batches->Seek(seek); !status.ok()) {
      std::fprintf(stderr, "%s\n", status.ToString().c_str());
      return 1;
    }
  }
  std::vector<int32_t> x(batches->tokens_per_micro_batch()), y(x.size());
  for (long long i = seek; i < count; ++i) {
    if (absl::Status status = batches->Next(absl::MakeSpan(x), absl::MakeSpan(y)); !status.ok()) {
      std::fprintf(stderr, "%s\n", status.ToString().c_str());
      return 1;
    }
    // x86 and aarch64 are little-endian: the int32 in memory are the bytes to write.
    std::fwrite(x.data(), sizeof(int32_t), x.size(), stdout);
    std::fwrite(y.data(), sizeof(int32_t), y.size(), stdout);
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}
