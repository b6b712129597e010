#include "trainer/data/token_shards.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/path_rules.h"
#include "common/status_macros.h"

namespace mptrain {
namespace {

constexpr int kMaxWorldSize = 1024;
constexpr int64_t kMaxVocabSize = int64_t{1} << 20;

std::string Named(const std::string& field, const std::string& path) {
  return absl::StrCat(field, " ", QuotePathForMessage(path));
}

// Reads exactly `size` bytes at `offset`; a file that ends early is FAILED_PRECONDITION (it was
// long enough when inspected: it changed since).
absl::Status ReadExactly(int fd, void* out, size_t size, int64_t offset, const std::string& field,
                         const std::string& path) {
  auto* bytes = static_cast<unsigned char*>(out);
  size_t got = 0;
  while (got < size) {
    const ssize_t n = pread(fd, bytes + got, size - got, static_cast<off_t>(offset + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::FailedPreconditionError(
          absl::StrCat(Named(field, path), ": read failed: ", std::strerror(errno)));
    }
    if (n == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(Named(field, path), " is shorter than when it was opened (changed since)"));
    }
    got += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

int32_t LittleInt32(const unsigned char* bytes) {
  const uint32_t value = uint32_t{bytes[0]} | uint32_t{bytes[1]} << 8 | uint32_t{bytes[2]} << 16 |
                         uint32_t{bytes[3]} << 24;
  int32_t result;
  std::memcpy(&result, &value, sizeof(result));
  return result;
}

absl::StatusOr<int> OpenForReading(const std::string& field, const std::string& path) {
  // O_NOFOLLOW: a symbolic link put in place of a checked file is refused; O_NONBLOCK: a FIFO
  // does not block the open (fstat then refuses it).
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    const std::string what = absl::StrCat(Named(field, path), ": ", std::strerror(error));
    if (error == ENOENT || error == ENOTDIR) return absl::NotFoundError(what);
    if (error == ELOOP || error == EACCES || error == EPERM) {
      return absl::PermissionDeniedError(what);
    }
    return absl::InvalidArgumentError(what);
  }
  return fd;
}

// The header and size rules of the file open on `fd` (already fstat'ed as `st`).
absl::StatusOr<TokenFile> CheckTokenFile(int fd, const struct stat& st, const std::string& field,
                                         const std::string& path) {
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(Named(field, path), " is not a regular file"));
  }
  TokenFile file;
  file.path = path;
  file.size_bytes = st.st_size;
  file.device = st.st_dev;
  file.inode = st.st_ino;
  unsigned char header[12] = {};
  const bool has_magic_room = file.size_bytes >= 4;
  if (has_magic_room) {
    RETURN_IF_ERROR(ReadExactly(fd, header, 4, 0, field, path));
  }
  if (has_magic_room && LittleInt32(header) == kTokenShardMagic) {
    file.format = TokenFileFormat::kLlmcShard;
    file.first_token_byte = kTokenShardHeaderBytes;
    if (file.size_bytes < kTokenShardHeaderBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(Named(field, path),
                       " starts with the llm.c shard magic but is shorter "
                       "than the 1024-byte header"));
    }
    RETURN_IF_ERROR(ReadExactly(fd, header, sizeof(header), 0, field, path));
    // The header's values are the file's contents: named, never echoed.
    if (LittleInt32(header + 4) != kTokenShardVersion) {
      return absl::InvalidArgumentError(absl::StrCat(
          Named(field, path), ": llm.c shard header's version (int32 at byte 4) is not ",
          kTokenShardVersion, " (uint16 tokens)"));
    }
    const int32_t count = LittleInt32(header + 8);
    if (count < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          Named(field, path), ": llm.c shard header's token count (int32 at byte 8) is not >= 1"));
    }
    if (file.size_bytes != kTokenShardHeaderBytes + 2 * int64_t{count}) {
      return absl::InvalidArgumentError(
          absl::StrCat(Named(field, path),
                       ": llm.c shard header's token count (int32 at byte 8) does not "
                       "match the file's size (a shard of n tokens is 1024 + 2n bytes)"));
    }
    file.tokens = count;
    return file;
  }
  file.format = TokenFileFormat::kRawUint16;
  file.first_token_byte = 0;
  if (file.size_bytes % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(field, path),
                     " has an odd size: a raw uint16 token file (no llm.c "
                     "magic) holds 2 bytes a token"));
  }
  if (file.size_bytes / 2 > kMaxTokensPerFile) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(field, path), " is larger than ", 2 * kMaxTokensPerFile,
                     " bytes: a raw token file holds at most ", kMaxTokensPerFile, " tokens"));
  }
  file.tokens = file.size_bytes / 2;
  return file;
}

uint64_t Mix(uint64_t x) { return SplitMix64(x).Next(); }

}  // namespace

uint64_t SplitMix64::Next() {
  state_ += 0x9E3779B97F4A7C15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::Below(uint64_t bound) {
  // 2^64 mod bound, computed in 64 bits: (2^64 - bound) mod bound.
  const uint64_t excess = (0 - bound) % bound;
  const uint64_t limit = 0 - excess;  // 2^64 - excess (0 means every value is fine)
  while (true) {
    const uint64_t value = Next();
    if (excess == 0 || value < limit) return value % bound;
  }
}

uint64_t ShuffleStreamState(uint64_t seed, uint64_t epoch, uint64_t stream) {
  return Mix(Mix(Mix(seed) ^ epoch) ^ stream);
}

std::vector<uint32_t> ShuffledIndices(uint64_t n, uint64_t state) {
  std::vector<uint32_t> indices(n);
  std::iota(indices.begin(), indices.end(), 0u);
  SplitMix64 rng(state);
  for (uint64_t i = n; i-- > 1;) std::swap(indices[i], indices[rng.Below(i + 1)]);
  return indices;
}

absl::StatusOr<TokenFile> InspectTokenFile(const std::string& field, const std::string& path) {
  ASSIGN_OR_RETURN(const int fd, OpenForReading(field, path));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(Named(field, path), ": fstat failed: ", std::strerror(error)));
  }
  absl::StatusOr<TokenFile> file = CheckTokenFile(fd, st, field, path);
  close(fd);
  return file;
}

TokenBatches::TokenBatches(std::string field, std::vector<TokenFile> files,
                           const TokenBatchOptions& options)
    : field_(std::move(field)), files_(std::move(files)), options_(options) {
  tokens_per_rank_ = options_.batch * options_.context;
  tokens_per_window_ = tokens_per_rank_ * options_.world_size;
  for (const TokenFile& file : files_) {
    windows_.push_back(WindowsOf(file));
    windows_per_epoch_ += windows_.back();
  }
  buffer_.resize(static_cast<size_t>(tokens_per_rank_) + 1);
}

TokenBatches::TokenBatches(TokenBatches&& other) noexcept { *this = std::move(other); }

TokenBatches& TokenBatches::operator=(TokenBatches&& other) noexcept {
  if (this == &other) return *this;
  if (fd_ >= 0) close(fd_);
  field_ = std::move(other.field_);
  files_ = std::move(other.files_);
  options_ = other.options_;
  tokens_per_rank_ = other.tokens_per_rank_;
  tokens_per_window_ = other.tokens_per_window_;
  windows_per_epoch_ = other.windows_per_epoch_;
  windows_ = std::move(other.windows_);
  done_ = other.done_;
  epoch_ = other.epoch_;
  order_ = std::move(other.order_);
  slot_ = other.slot_;
  window_in_slot_ = other.window_in_slot_;
  permuted_epoch_ = other.permuted_epoch_;
  permuted_slot_ = other.permuted_slot_;
  window_order_ = std::move(other.window_order_);
  fd_ = std::exchange(other.fd_, -1);
  open_index_ = std::exchange(other.open_index_, -1);
  buffer_ = std::move(other.buffer_);
  return *this;
}

TokenBatches::~TokenBatches() {
  if (fd_ >= 0) close(fd_);
}

int64_t TokenBatches::WindowsOf(const TokenFile& file) const {
  // llm.c: (ntok * 2 - 2) / total_batch_size_bytes, the last window's +1 token included.
  return (file.tokens - 1) / tokens_per_window_;
}

int64_t TokenBatches::total_tokens() const {
  int64_t total = 0;
  for (const TokenFile& file : files_) total += file.tokens;
  return total;
}

std::string TokenBatches::FileField(int64_t index) const {
  return absl::StrCat(field_, "[", index, "]");
}

absl::StatusOr<TokenBatches> TokenBatches::Open(const std::string& field,
                                                const std::vector<std::string>& paths,
                                                const TokenBatchOptions& options) {
  if (paths.empty() || static_cast<int64_t>(paths.size()) > kMaxTokenFiles) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must name 1 to ", kMaxTokenFiles,
                                                   " token files, got ", paths.size()));
  }
  if (options.batch < 1 || options.context < 1 ||
      options.batch > kMaxTokensPerMicroBatch / options.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": micro-batch of ", options.batch, " sequences x ", options.context,
        " tokens must have both >= 1 and at most ", kMaxTokensPerMicroBatch, " tokens"));
  }
  if (options.world_size < 1 || options.world_size > kMaxWorldSize || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": rank ", options.rank,
                                                   " of world size ", options.world_size,
                                                   " (world size in [1, ", kMaxWorldSize, "])"));
  }
  if (options.vocab_size < 1 || options.vocab_size > kMaxVocabSize) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": vocab_size must be in [1, ",
                                                   kMaxVocabSize, "], got ", options.vocab_size));
  }
  std::vector<TokenFile> files;
  files.reserve(paths.size());
  const int64_t window = options.batch * options.context * options.world_size;
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string file_field = absl::StrCat(field, "[", i, "]");
    ASSIGN_OR_RETURN(TokenFile file, InspectTokenFile(file_field, paths[i]));
    if (file.tokens < window + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(Named(file_field, paths[i]), " holds fewer tokens than one window of ",
                       window + 1, " (world_size ", options.world_size, " x ", options.batch,
                       " sequences x ", options.context, " tokens, + 1 for the last target)"));
    }
    if (options.shuffle && (file.tokens - 1) / window > kMaxShuffledWindowsPerShard) {
      return absl::InvalidArgumentError(absl::StrCat(
          Named(file_field, paths[i]), " has more windows than shuffling allows (",
          kMaxShuffledWindowsPerShard, " per file): split it, or use larger micro-batches"));
    }
    files.push_back(std::move(file));
  }
  TokenBatches batches(field, std::move(files), options);
  batches.PlaceCursor();
  return batches;
}

absl::Status TokenBatches::Seek(int64_t micro_batches_done) {
  if (micro_batches_done < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field_, ": cannot seek to micro-batch ", micro_batches_done));
  }
  done_ = micro_batches_done;
  PlaceCursor();
  return absl::OkStatus();
}

void TokenBatches::PlaceCursor() {
  const int64_t epoch = done_ / windows_per_epoch_;
  int64_t rest = done_ % windows_per_epoch_;
  if (epoch != epoch_ || order_.empty()) {
    epoch_ = epoch;
    order_.resize(files_.size());
    if (options_.shuffle) {
      const std::vector<uint32_t> order = ShuffledIndices(
          files_.size(),
          ShuffleStreamState(options_.shuffle_seed, static_cast<uint64_t>(epoch), 0));
      order_.assign(order.begin(), order.end());
    } else {
      std::iota(order_.begin(), order_.end(), int64_t{0});
    }
  }
  slot_ = 0;
  while (rest >= windows_[order_[slot_]]) rest -= windows_[order_[slot_++]];
  window_in_slot_ = rest;
}

absl::Status TokenBatches::OpenFile(int64_t index) {
  if (open_index_ == index) return absl::OkStatus();
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  open_index_ = -1;
  const TokenFile& expected = files_[index];
  const std::string field = FileField(index);
  ASSIGN_OR_RETURN(const int fd, OpenForReading(field, expected.path));
  struct stat st;
  absl::StatusOr<TokenFile> seen =
      fstat(fd, &st) == 0
          ? CheckTokenFile(fd, st, field, expected.path)
          : absl::StatusOr<TokenFile>(absl::FailedPreconditionError(absl::StrCat(
                Named(field, expected.path), ": fstat failed: ", std::strerror(errno))));
  if (!seen.ok() || seen->device != expected.device || seen->inode != expected.inode ||
      seen->size_bytes != expected.size_bytes || seen->format != expected.format ||
      seen->tokens != expected.tokens) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(Named(field, expected.path), " changed since it was opened",
                     seen.ok() ? "" : absl::StrCat(": ", seen.status().message())));
  }
  fd_ = fd;
  open_index_ = index;
  return absl::OkStatus();
}

absl::Status TokenBatches::Next(absl::Span<int32_t> inputs, absl::Span<int32_t> targets) {
  if (static_cast<int64_t>(inputs.size()) != tokens_per_rank_ ||
      static_cast<int64_t>(targets.size()) != tokens_per_rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat(field_, ": inputs and targets must hold B*T = ", tokens_per_rank_,
                     " tokens, got ", inputs.size(), " and ", targets.size()));
  }
  const int64_t file_index = order_[slot_];
  if (options_.shuffle && (permuted_epoch_ != epoch_ || permuted_slot_ != slot_)) {
    window_order_ =
        ShuffledIndices(static_cast<uint64_t>(windows_[file_index]),
                        ShuffleStreamState(options_.shuffle_seed, static_cast<uint64_t>(epoch_),
                                           static_cast<uint64_t>(slot_) + 1));
    permuted_epoch_ = epoch_;
    permuted_slot_ = slot_;
  }
  const int64_t window =
      options_.shuffle ? int64_t{window_order_[window_in_slot_]} : window_in_slot_;
  const TokenFile& file = files_[file_index];
  const int64_t first_token = window * tokens_per_window_ + options_.rank * tokens_per_rank_;
  RETURN_IF_ERROR(OpenFile(file_index));
  static_assert(sizeof(uint16_t) == 2);
  RETURN_IF_ERROR(ReadExactly(fd_, buffer_.data(), buffer_.size() * 2,
                              file.first_token_byte + 2 * first_token, FileField(file_index),
                              file.path));
  const int64_t vocab = options_.vocab_size;
  for (size_t i = 0; i < buffer_.size(); ++i) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(&buffer_[i]);
    const uint16_t token = static_cast<uint16_t>(bytes[0] | bytes[1] << 8);  // little-endian
    if (token >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(Named(FileField(file_index), file.path), ": token ",
                       first_token + static_cast<int64_t>(i), " (counting from 0, at byte ",
                       file.first_token_byte + 2 * (first_token + static_cast<int64_t>(i)),
                       ") is not below vocab_size ", vocab));
    }
    buffer_[i] = token;
  }
  for (int64_t i = 0; i < tokens_per_rank_; ++i) {
    inputs[i] = buffer_[i];
    targets[i] = buffer_[i + 1];
  }
  ++done_;
  if (++window_in_slot_ == windows_[file_index]) {
    window_in_slot_ = 0;
    if (++slot_ == static_cast<int64_t>(files_.size())) PlaceCursor();  // the next epoch
  }
  return absl::OkStatus();
}

}  // namespace mptrain
