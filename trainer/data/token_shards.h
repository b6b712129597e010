#pragma once

// Token files for a language model, and the micro-batches cut from them as llm.c's DataLoader
// (llmc/dataloader.h) cuts them. README "Token data" says it bit for bit; parity/token_batches.py
// is an independent implementation of the same, for the PyTorch reference.
//
// Formats, told apart by the first 4 bytes:
//   - llm.c shard: a header of 256 little-endian int32 (magic 20240520, version 1, token count;
//     the other 253 are ignored), then exactly `count` little-endian uint16 tokens: the file's
//     size must be 1024 + 2 * count.
//   - raw uint16 (nanoGPT's train.bin / val.bin): no header; every 2 bytes are a token; the size
//     must be even.
//   A file whose first int32 is the magic is a shard and must then be a valid one (a raw file
//   starting with the tokens 55432, 308 is refused as a bad shard: with a vocabulary of at most
//   55432 tokens, as GPT-2's 50257, no valid raw file starts so).
//
// Token ids are checked against vocab_size window by window, as each is read (B*T+1 tokens, so
// opening a 10 GB shard does not scan it); an id out of range fails that Next() with an error
// naming the file and the token's index in it, never its value. No error echoes a file's bytes.
//
// Files are read with pread into a buffer of B*T+1 tokens (never mapped: a file truncated under
// a mapping would kill the process with SIGBUS); one file is open at a time, reopened (O_NOFOLLOW,
// O_NONBLOCK, then fstat: a regular file of the size and identity seen at Open) when the batches
// move to it.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mptrain {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderBytes = 256 * 4;
// At most this many files per split (after glob expansion).
inline constexpr int64_t kMaxTokenFiles = 4096;
// A raw file holds at most 2^32 tokens (8 GiB); a shard's count is an int32 in [1, 2^31 - 1].
inline constexpr int64_t kMaxTokensPerFile = int64_t{1} << 32;
// B*T: the buffers of one micro-batch stay bounded (int32 inputs and targets: 128 MiB at most).
inline constexpr int64_t kMaxTokensPerMicroBatch = int64_t{1} << 24;
// Shuffling keeps a permutation of one shard's windows (4 bytes each): at most 64 MiB.
inline constexpr int64_t kMaxShuffledWindowsPerShard = int64_t{1} << 24;

enum class TokenFileFormat {
  kLlmcShard,  // 1024-byte header, then uint16 tokens.
  kRawUint16,  // uint16 tokens only.
};

// One validated token file, as Open saw it.
struct TokenFile {
  std::string path;
  TokenFileFormat format = TokenFileFormat::kRawUint16;
  int64_t tokens = 0;            // How many uint16 tokens it holds.
  int64_t first_token_byte = 0;  // kTokenShardHeaderBytes for a shard, 0 for a raw file.
  int64_t size_bytes = 0;
  uint64_t device = 0;  // st_dev and st_ino: a file swapped since Open is refused.
  uint64_t inode = 0;
};

// Opens `path` (O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC; a regular file) and checks its
// header and size; reads no token. `field` names it in errors ("data.tokens.files[3]").
// INVALID_ARGUMENT: not a regular file, a bad magic-bearing header (version, count < 1,
// size != 1024 + 2 * count), an odd-sized or too large raw file. NOT_FOUND: missing.
// PERMISSION_DENIED: a symbolic link (O_NOFOLLOW) or unreadable. Messages name the file (quoted,
// cut short), the rule and its limit, never a number read or derived from the file (a header
// value, its size, its token count): README "Job spec".
absl::StatusOr<TokenFile> InspectTokenFile(const std::string& field, const std::string& path);

struct TokenBatchOptions {
  int64_t batch = 0;       // B: sequences per micro-batch, >= 1.
  int64_t context = 0;     // T: tokens per sequence, >= 1; B*T <= kMaxTokensPerMicroBatch.
  int rank = 0;            // r in [0, world_size).
  int world_size = 1;      // W in [1, 1024].
  int64_t vocab_size = 0;  // Every token read must be < vocab_size; in [1, 2^20].
  bool shuffle = false;    // Never for evaluation (see TokenBatches).
  uint64_t shuffle_seed = 0;
};

// Rank r's micro-batches over a list of token files, as llm.c's DataLoader serves them:
//   - window k of a file covers its tokens [k*W*B*T, (k+1)*W*B*T + 1); a file of n tokens has
//     floor((n - 1) / (W*B*T)) windows, the same for every rank. A file with none (n < W*B*T + 1)
//     is refused at Open, naming it.
//   - rank r's micro-batch from window k reads the B*T+1 tokens at k*W*B*T + r*B*T: inputs are
//     the first B*T, targets the last B*T (the inputs shifted by one token).
//   - the windows of a file are visited k = 0, 1, ...; after its last window the next file's
//     first window follows; after the last file, the first file again (a new epoch).
//   - shuffled: epoch e visits the files in the order SplitMix64-Fisher-Yates(seed, e) and the
//     windows of the file at position p of that order in the order of (seed, e, p + 1); the same
//     for every rank (README "Token data" has the bits).
// Evaluation: the same class over the eval files, shuffle off, Seek(0) before each evaluation
// (every evaluation reads the same first batches).
//
// Not thread-safe; movable.
class TokenBatches {
 public:
  // Inspects every file (InspectTokenFile) and checks the options. `field` names the list in
  // errors ("data.tokens.files"; a file is "<field>[i]"). INVALID_ARGUMENT: no file or more than
  // kMaxTokenFiles, options out of range, a file too small for one window of every rank, with
  // shuffle a file of more than kMaxShuffledWindowsPerShard windows; else InspectTokenFile's.
  static absl::StatusOr<TokenBatches> Open(const std::string& field,
                                           const std::vector<std::string>& paths,
                                           const TokenBatchOptions& options);

  TokenBatches(TokenBatches&& other) noexcept;
  TokenBatches& operator=(TokenBatches&& other) noexcept;
  TokenBatches(const TokenBatches&) = delete;
  TokenBatches& operator=(const TokenBatches&) = delete;
  ~TokenBatches();

  // Writes the next micro-batch, B*T int32 each, into the caller's buffers and advances.
  // INVALID_ARGUMENT: a buffer is not B*T long; a token >= vocab_size (naming the file and the
  // token's index in it). FAILED_PRECONDITION: the file changed since Open (size, identity,
  // header, or a short read). On an error the position does not advance.
  absl::Status Next(absl::Span<int32_t> inputs, absl::Span<int32_t> targets);

  // Puts the position where it is after `micro_batches_done` micro-batches from the start
  // (a resume at step s: s * accumulation_steps). Costs O(files) plus, shuffled, one file's
  // window permutation; independent of micro_batches_done. INVALID_ARGUMENT if negative.
  absl::Status Seek(int64_t micro_batches_done);

  // Micro-batches served since the start (what Seek takes).
  int64_t micro_batches_done() const { return done_; }
  // Micro-batches of one pass over every file (per rank; the same for every rank).
  int64_t windows_per_epoch() const { return windows_per_epoch_; }
  const std::vector<TokenFile>& files() const { return files_; }
  // B*T: the length Next() fills.
  int64_t tokens_per_micro_batch() const { return tokens_per_rank_; }
  int64_t total_tokens() const;

 private:
  TokenBatches(std::string field, std::vector<TokenFile> files, const TokenBatchOptions& options);

  int64_t WindowsOf(const TokenFile& file) const;
  // File order and window order for the position in done_ (epoch_, slot_, window_in_slot_).
  void PlaceCursor();
  // (Re)opens files_[index] when it is not the open one, checking it is the file Open saw.
  absl::Status OpenFile(int64_t index);
  std::string FileField(int64_t index) const;

  std::string field_;
  std::vector<TokenFile> files_;
  TokenBatchOptions options_;
  int64_t tokens_per_rank_ = 0;    // B*T
  int64_t tokens_per_window_ = 0;  // W*B*T
  int64_t windows_per_epoch_ = 0;
  std::vector<int64_t> windows_;  // windows_[i]: windows of files_[i]

  // The position: micro-batches done, and where the next one comes from.
  int64_t done_ = 0;
  int64_t epoch_ = -1;           // The epoch whose file order is in order_.
  std::vector<int64_t> order_;   // File indices in this epoch's order.
  int64_t slot_ = 0;             // Position in order_ of the next micro-batch's file.
  int64_t window_in_slot_ = 0;   // Its position in that file's window order.
  int64_t permuted_epoch_ = -1;  // The (epoch, slot) whose window order is in
  int64_t permuted_slot_ = -1;   // window_order_ (shuffled only).
  std::vector<uint32_t> window_order_;

  int fd_ = -1;
  int64_t open_index_ = -1;
  std::vector<uint16_t> buffer_;  // B*T+1 tokens
};

// The shuffles of TokenBatches, exposed for the tests and the README's description.
// SplitMix64 (Steele, Lea, Flood 2014; Vigna's splitmix64.c): state += 0x9E3779B97F4A7C15, then
// z = state; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9; z = (z ^ z>>27) * 0x94D049BB133111EB;
// return z ^ z>>31 (all mod 2^64).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next();
  // Uniform in [0, bound), bound >= 1: draws until a value below 2^64 - (2^64 mod bound), then
  // returns it mod bound.
  uint64_t Below(uint64_t bound);

 private:
  uint64_t state_;
};

// The generator's start for stream (seed, epoch, stream): SplitMix64 finalisers chained,
// Mix(Mix(Mix(seed) ^ epoch) ^ stream), where Mix(x) is one SplitMix64 Next() from state x.
uint64_t ShuffleStreamState(uint64_t seed, uint64_t epoch, uint64_t stream);
// Fisher-Yates: for i = n-1 down to 1, j = Below(i + 1), swap(a[i], a[j]), on a = [0, n).
std::vector<uint32_t> ShuffledIndices(uint64_t n, uint64_t state);

}  // namespace mptrain
