#include "trainer/data/token_shards.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

void AppendInt32(std::string* out, int32_t value) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((uint32_t(value) >> (8 * i)) & 255));
}

std::string TokenBytes(const std::vector<uint16_t>& tokens) {
  std::string bytes;
  for (uint16_t token : tokens) {
    bytes.push_back(static_cast<char>(token & 255));
    bytes.push_back(static_cast<char>(token >> 8));
  }
  return bytes;
}

std::string ShardBytes(const std::vector<uint16_t>& tokens, int32_t magic = kTokenShardMagic,
                       int32_t version = 1, int64_t count = std::numeric_limits<int64_t>::min()) {
  std::string bytes;
  AppendInt32(&bytes, magic);
  AppendInt32(&bytes, version);
  AppendInt32(&bytes, static_cast<int32_t>(
                          count == std::numeric_limits<int64_t>::min() ? tokens.size() : count));
  bytes.resize(kTokenShardHeaderBytes, '\0');
  return bytes + TokenBytes(tokens);
}

std::string WriteFile(const std::string& name, const std::string& bytes) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

// Tokens 0, 1, 2, ... mod `modulo`, offset by `start`.
std::vector<uint16_t> Ramp(int64_t count, int start = 0, int modulo = 60000) {
  std::vector<uint16_t> tokens;
  for (int64_t i = 0; i < count; ++i) tokens.push_back(static_cast<uint16_t>((start + i) % modulo));
  return tokens;
}

struct Batch {
  std::vector<int32_t> x, y;
  bool operator==(const Batch& other) const { return x == other.x && y == other.y; }
};

// llm.c's DataLoader, unshuffled, written as plainly as possible from llmc/dataloader.h: epoch
// after epoch, shard after shard, sample k of a shard at k*W*B*T + r*B*T while
// k < (ntok - 1) / (W*B*T).
std::vector<Batch> NaiveBatches(const std::vector<std::vector<uint16_t>>& shards, int64_t B,
                                int64_t T, int rank, int world, int64_t count) {
  std::vector<Batch> out;
  while (true) {
    for (const auto& shard : shards) {
      const int64_t samples = (static_cast<int64_t>(shard.size()) - 1) / (world * B * T);
      for (int64_t k = 0; k < samples; ++k) {
        if (static_cast<int64_t>(out.size()) == count) return out;
        Batch batch;
        const int64_t offset = k * world * B * T + rank * B * T;
        for (int64_t i = 0; i < B * T; ++i) {
          batch.x.push_back(shard[offset + i]);
          batch.y.push_back(shard[offset + i + 1]);
        }
        out.push_back(batch);
      }
    }
  }
}

std::vector<Batch> Take(TokenBatches* batches, int64_t count) {
  std::vector<Batch> out;
  for (int64_t i = 0; i < count; ++i) {
    Batch batch;
    const size_t size = batches->tokens_per_micro_batch();
    batch.x.resize(size);
    batch.y.resize(size);
    absl::Status status = batches->Next(absl::MakeSpan(batch.x), absl::MakeSpan(batch.y));
    EXPECT_TRUE(status.ok()) << status;
    out.push_back(batch);
  }
  return out;
}

TokenBatchOptions Options(int64_t B, int64_t T, int rank, int world, int64_t vocab = 65536) {
  TokenBatchOptions options;
  options.batch = B;
  options.context = T;
  options.rank = rank;
  options.world_size = world;
  options.vocab_size = vocab;
  return options;
}

TEST(SplitMix64Test, Next_FromZero_MatchesTheReferenceImplementation) {
  // Vigna's splitmix64.c with x = 0: the first two outputs.
  SplitMix64 rng(0);
  EXPECT_EQ(rng.Next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(rng.Next(), 0x6E789E6AA1B965F4ull);
}

TEST(SplitMix64Test, ShuffledIndices_IsAPermutationThatDependsOnTheState) {
  const std::vector<uint32_t> a = ShuffledIndices(100, 1);
  const std::vector<uint32_t> b = ShuffledIndices(100, 2);
  EXPECT_EQ(std::set<uint32_t>(a.begin(), a.end()).size(), 100u);
  EXPECT_EQ(*std::max_element(a.begin(), a.end()), 99u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a, ShuffledIndices(100, 1));
}

TEST(InspectTokenFileTest, ShardAndRaw_AreToldApartByTheMagic) {
  const std::vector<uint16_t> tokens = Ramp(10);
  absl::StatusOr<TokenFile> shard = InspectTokenFile("f", WriteFile("s.bin", ShardBytes(tokens)));
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->format, TokenFileFormat::kLlmcShard);
  EXPECT_EQ(shard->tokens, 10);
  EXPECT_EQ(shard->first_token_byte, 1024);
  absl::StatusOr<TokenFile> raw = InspectTokenFile("f", WriteFile("r.bin", TokenBytes(tokens)));
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->format, TokenFileFormat::kRawUint16);
  EXPECT_EQ(raw->tokens, 10);
  EXPECT_EQ(raw->first_token_byte, 0);
}

TEST(InspectTokenFileTest, BadHeadersAndSizes_AreInvalidArgumentNamingTheFile) {
  struct Case {
    std::string name, bytes, message;
  };
  const std::vector<uint16_t> tokens = Ramp(10);
  std::string short_header;
  AppendInt32(&short_header, kTokenShardMagic);
  short_header.resize(100, '\0');
  const std::vector<Case> cases = {
      {"version.bin", ShardBytes(tokens, kTokenShardMagic, 2), "version"},
      {"count_high.bin", ShardBytes(tokens, kTokenShardMagic, 1, 11), "does not match"},
      {"count_low.bin", ShardBytes(tokens, kTokenShardMagic, 1, 9), "does not match"},
      {"count_zero.bin", ShardBytes({}, kTokenShardMagic, 1, 0), "not >= 1"},
      {"count_negative.bin", ShardBytes(tokens, kTokenShardMagic, 1, -5), "not >= 1"},
      {"truncated.bin", ShardBytes(tokens).substr(0, 1024 + 19), "does not match"},
      {"short_header.bin", short_header, "shorter than the 1024-byte header"},
      {"odd.bin", TokenBytes(tokens) + "x", "odd size"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TokenFile> file =
        InspectTokenFile("data.tokens.files[4]", WriteFile(c.name, c.bytes));
    ASSERT_FALSE(file.ok()) << c.name;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(file.status().message(), HasSubstr("data.tokens.files[4]")) << c.name;
    EXPECT_THAT(file.status().message(), HasSubstr(c.name)) << c.name;
    EXPECT_THAT(file.status().message(), HasSubstr(c.message)) << c.name;
    // The file's size is a number derived from the file: never spelled (the path aside).
    std::string message(file.status().message());
    message.erase(message.find(TempPath(c.name)), TempPath(c.name).size());
    EXPECT_THAT(message, Not(HasSubstr(std::to_string(c.bytes.size())))) << c.name;
  }
}

TEST(InspectTokenFileTest, HeaderValues_AreNeverEchoed) {
  // A count and a version with distinctive digits: neither may appear in the message.
  const std::vector<uint16_t> tokens = Ramp(10);
  for (const std::string& bytes : {ShardBytes(tokens, kTokenShardMagic, 1, 987654),
                                   ShardBytes(tokens, kTokenShardMagic, 987654)}) {
    absl::StatusOr<TokenFile> file = InspectTokenFile("f", WriteFile("echo.bin", bytes));
    ASSERT_FALSE(file.ok());
    EXPECT_THAT(file.status().message(), Not(HasSubstr("987654")));
  }
}

TEST(InspectTokenFileTest, SymlinkFifoDirectoryAndMissing_AreRefusedWithoutBlocking) {
  const std::string target = WriteFile("target.bin", TokenBytes(Ramp(10)));
  const std::string link = TempPath("link.bin");
  unlink(link.c_str());
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  EXPECT_EQ(InspectTokenFile("f", link).status().code(), absl::StatusCode::kPermissionDenied);
  const std::string fifo = TempPath("fifo.bin");
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // O_NONBLOCK: opening a FIFO with no writer returns at once; then it is not a regular file.
  absl::Status fifo_status = InspectTokenFile("f", fifo).status();
  EXPECT_EQ(fifo_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(fifo_status.message(), HasSubstr("not a regular file"));
  EXPECT_EQ(InspectTokenFile("f", TempPath("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InspectTokenFile("f", TempPath("missing.bin")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TokenBatchesTest, Next_ShardAndRawFile_GiveTheSameShiftedTokens) {
  const std::vector<uint16_t> tokens = Ramp(9, 100);  // one window of 2 x 4 (+1)
  for (const std::string& path :
       {WriteFile("one_s.bin", ShardBytes(tokens)), WriteFile("one_r.bin", TokenBytes(tokens))}) {
    absl::StatusOr<TokenBatches> batches = TokenBatches::Open("f", {path}, Options(2, 4, 0, 1));
    ASSERT_TRUE(batches.ok()) << batches.status();
    std::vector<int32_t> x(8), y(8);
    ASSERT_TRUE(batches->Next(absl::MakeSpan(x), absl::MakeSpan(y)).ok());
    EXPECT_EQ(x, std::vector<int32_t>({100, 101, 102, 103, 104, 105, 106, 107}));
    EXPECT_EQ(y, std::vector<int32_t>({101, 102, 103, 104, 105, 106, 107, 108}));
  }
}

TEST(TokenBatchesTest, Next_MatchesLlmcAcrossRanksShardEndsAndWrapping) {
  // Shards of different sizes: the first a multiple of every window (its last window lacks the
  // last target: skipped, as in llm.c), the second leaves tokens over, the third is exactly one
  // window of world 3 + 1.
  const std::vector<std::vector<uint16_t>> shards = {Ramp(48, 0), Ramp(31, 1000), Ramp(25, 2000)};
  std::vector<std::string> paths;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = "llmc_" + std::to_string(i) + ".bin";
    paths.push_back(WriteFile(name, i == 1 ? TokenBytes(shards[i]) : ShardBytes(shards[i])));
  }
  for (int world : {1, 2, 3}) {
    const int64_t B = 2, T = 4;
    if (world * B * T + 1 > 25) continue;
    for (int rank = 0; rank < world; ++rank) {
      absl::StatusOr<TokenBatches> batches =
          TokenBatches::Open("f", paths, Options(B, T, rank, world));
      ASSERT_TRUE(batches.ok()) << batches.status();
      const std::vector<Batch> expected = NaiveBatches(shards, B, T, rank, world, 40);
      EXPECT_TRUE(Take(&*batches, 40) == expected) << "world " << world << " rank " << rank;
    }
  }
  // World 3 with B*T = 8 needs 25 tokens per shard: exactly the third's size.
  absl::StatusOr<TokenBatches> three = TokenBatches::Open("f", paths, Options(2, 4, 2, 3));
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->windows_per_epoch(), 1 + 1 + 1);
}

TEST(TokenBatchesTest, Open_FileTooSmallForOneWindowOfEveryRank_NamesIt) {
  const std::string big = WriteFile("big.bin", ShardBytes(Ramp(100)));
  const std::string small = WriteFile("small.bin", ShardBytes(Ramp(24)));
  absl::StatusOr<TokenBatches> batches =
      TokenBatches::Open("data.tokens.files", {big, small}, Options(2, 4, 0, 3));
  ASSERT_FALSE(batches.ok());
  EXPECT_EQ(batches.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(batches.status().message(), HasSubstr("data.tokens.files[1]"));
  EXPECT_THAT(batches.status().message(), HasSubstr("small.bin"));
  EXPECT_THAT(batches.status().message(), HasSubstr("25"));
}

TEST(TokenBatchesTest, Open_BadOptions_AreInvalidArgument) {
  const std::string path = WriteFile("opts.bin", ShardBytes(Ramp(100)));
  for (const TokenBatchOptions& options :
       {Options(0, 4, 0, 1), Options(2, 0, 0, 1), Options(2, 4, 1, 1), Options(2, 4, -1, 2),
        Options(2, 4, 0, 0), Options(2, 4, 0, 1, 0), Options(2, 4, 0, 1, (1 << 20) + 1),
        Options(int64_t{1} << 13, int64_t{1} << 12, 0, 1)}) {
    EXPECT_EQ(TokenBatches::Open("f", {path}, options).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(TokenBatches::Open("f", {}, Options(2, 4, 0, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenBatches::Open("f", std::vector<std::string>(kMaxTokenFiles + 1, path),
                               Options(2, 4, 0, 1))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TokenBatchesTest, Next_TokenOutOfVocabulary_NamesFileAndIndexButNotTheValue) {
  std::vector<uint16_t> tokens = Ramp(40, 0, 7);  // ids < 7
  tokens[21] = 54321;
  const std::string path = WriteFile("oov.bin", ShardBytes(tokens));
  absl::StatusOr<TokenBatches> batches =
      TokenBatches::Open("data.tokens.files", {path}, Options(1, 4, 1, 2, 7));
  ASSERT_TRUE(batches.ok()) << batches.status();
  std::vector<int32_t> x(4), y(4);
  // Rank 1 reads tokens [4, 9), [12, 17), [20, 25): the third micro-batch holds token 21.
  ASSERT_TRUE(batches->Next(absl::MakeSpan(x), absl::MakeSpan(y)).ok());
  ASSERT_TRUE(batches->Next(absl::MakeSpan(x), absl::MakeSpan(y)).ok());
  absl::Status status = batches->Next(absl::MakeSpan(x), absl::MakeSpan(y));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("data.tokens.files[0]"));
  EXPECT_THAT(status.message(), HasSubstr("oov.bin"));
  EXPECT_THAT(status.message(), HasSubstr("token 21 "));
  EXPECT_THAT(status.message(), HasSubstr("byte 1066"));
  EXPECT_THAT(status.message(), Not(HasSubstr("54321")));
  // The position did not advance: the same error again.
  EXPECT_EQ(batches->micro_batches_done(), 2);
  EXPECT_EQ(batches->Next(absl::MakeSpan(x), absl::MakeSpan(y)), status);
}

TEST(TokenBatchesTest, Next_WrongBufferSize_IsInvalidArgument) {
  const std::string path = WriteFile("buf.bin", ShardBytes(Ramp(100)));
  absl::StatusOr<TokenBatches> batches = TokenBatches::Open("f", {path}, Options(2, 4, 0, 1));
  ASSERT_TRUE(batches.ok());
  std::vector<int32_t> x(8), y(7);
  EXPECT_EQ(batches->Next(absl::MakeSpan(x), absl::MakeSpan(y)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TokenBatchesTest, Next_FileTruncatedOrReplacedSinceOpen_IsFailedPrecondition) {
  const std::string a = WriteFile("change_a.bin", ShardBytes(Ramp(30)));
  const std::string b = WriteFile("change_b.bin", ShardBytes(Ramp(30)));
  absl::StatusOr<TokenBatches> batches = TokenBatches::Open("f", {a, b}, Options(2, 4, 0, 1));
  ASSERT_TRUE(batches.ok());
  ASSERT_EQ(truncate(b.c_str(), 1024 + 20), 0);
  std::vector<int32_t> x(8), y(8);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(batches->Next(absl::MakeSpan(x), absl::MakeSpan(y)).ok());
  absl::Status status = batches->Next(absl::MakeSpan(x), absl::MakeSpan(y));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("change_b.bin"));
  // Replaced by another file of the same size: refused as well (another inode).
  const std::string c = WriteFile("change_c.bin", ShardBytes(Ramp(30)));
  ASSERT_EQ(rename(c.c_str(), b.c_str()), 0);
  EXPECT_EQ(batches->Next(absl::MakeSpan(x), absl::MakeSpan(y)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(TokenBatchesTest, RawFileStartingWithTheMagic_IsReadAsAShardAndRefused) {
  // Tokens 55432, 308 are the magic's two halves: such a raw file is taken for a bad shard.
  std::vector<uint16_t> tokens = Ramp(600);
  tokens[0] = 55432;
  tokens[1] = 308;
  absl::StatusOr<TokenFile> file =
      InspectTokenFile("f", WriteFile("magic_raw.bin", TokenBytes(tokens)));
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("llm.c shard"));
}

TEST(TokenBatchesTest, Seek_EqualsThatManyNextCalls_ShuffledOrNot) {
  const std::vector<std::string> paths = {WriteFile("seek_0.bin", ShardBytes(Ramp(53, 0))),
                                          WriteFile("seek_1.bin", ShardBytes(Ramp(77, 500))),
                                          WriteFile("seek_2.bin", TokenBytes(Ramp(41, 900)))};
  for (bool shuffle : {false, true}) {
    TokenBatchOptions options = Options(1, 4, 1, 2);
    options.shuffle = shuffle;
    options.shuffle_seed = 7;
    absl::StatusOr<TokenBatches> walked = TokenBatches::Open("f", paths, options);
    ASSERT_TRUE(walked.ok()) << walked.status();
    const std::vector<Batch> all = Take(&*walked, 60);
    for (int64_t start : {0, 1, 6, 15, 16, 17, 40}) {
      absl::StatusOr<TokenBatches> sought = TokenBatches::Open("f", paths, options);
      ASSERT_TRUE(sought.ok());
      ASSERT_TRUE(sought->Seek(start).ok());
      EXPECT_EQ(sought->micro_batches_done(), start);
      const std::vector<Batch> rest = Take(&*sought, 60 - start);
      EXPECT_TRUE(std::equal(rest.begin(), rest.end(), all.begin() + start))
          << "shuffle " << shuffle << " start " << start;
    }
    // Back to the start: the first batches again (what an evaluation does each time).
    ASSERT_TRUE(walked->Seek(0).ok());
    EXPECT_TRUE(Take(&*walked, 5) == std::vector<Batch>(all.begin(), all.begin() + 5));
    EXPECT_EQ(walked->Seek(-1).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(TokenBatchesTest, Shuffle_VisitsEveryWindowOncePerEpochInAnOrderOfTheSeedAndEpoch) {
  // Each window's first input token identifies it (tokens are distinct).
  const std::vector<std::string> paths = {WriteFile("shuf_0.bin", ShardBytes(Ramp(161, 0))),
                                          WriteFile("shuf_1.bin", ShardBytes(Ramp(81, 1000))),
                                          WriteFile("shuf_2.bin", ShardBytes(Ramp(121, 2000)))};
  auto epochs = [&](uint64_t seed, bool shuffle) {
    TokenBatchOptions options = Options(1, 4, 0, 2);
    options.shuffle = shuffle;
    options.shuffle_seed = seed;
    absl::StatusOr<TokenBatches> batches = TokenBatches::Open("f", paths, options);
    EXPECT_TRUE(batches.ok());
    EXPECT_EQ(batches->windows_per_epoch(), 20 + 10 + 15);
    std::vector<std::vector<int32_t>> starts(3);
    for (auto& epoch : starts) {
      for (const Batch& batch : Take(&*batches, 45)) epoch.push_back(batch.x[0]);
    }
    return starts;
  };
  const auto plain = epochs(0, false);
  const auto shuffled = epochs(3, true);
  const std::set<int32_t> windows(plain[0].begin(), plain[0].end());
  ASSERT_EQ(windows.size(), 45u);
  for (const auto& epoch : shuffled) {
    EXPECT_EQ(std::set<int32_t>(epoch.begin(), epoch.end()), windows);
    EXPECT_NE(epoch, plain[0]);
  }
  EXPECT_NE(shuffled[0], shuffled[1]);
  EXPECT_EQ(shuffled, epochs(3, true));
  EXPECT_NE(shuffled[0], epochs(4, true)[0]);
  // Every rank sees the same file and window order: rank 1's window starts 4 tokens later.
  TokenBatchOptions rank1 = Options(1, 4, 1, 2);
  rank1.shuffle = true;
  rank1.shuffle_seed = 3;
  absl::StatusOr<TokenBatches> other = TokenBatches::Open("f", paths, rank1);
  ASSERT_TRUE(other.ok());
  for (int i = 0; i < 45; ++i) {
    std::vector<int32_t> x(4), y(4);
    ASSERT_TRUE(other->Next(absl::MakeSpan(x), absl::MakeSpan(y)).ok());
    EXPECT_EQ(x[0], shuffled[0][i] + 4);
  }
}

TEST(TokenBatchesTest, Open_ShuffleWithTooManyWindowsPerFile_IsRefused) {
  // 2^24 + 1 windows of one token need a file of 2^24 + 2 tokens (32 MiB): sparse.
  const std::string path = TempPath("many_windows.bin");
  { std::ofstream(path, std::ios::binary | std::ios::trunc); }
  ASSERT_EQ(truncate(path.c_str(), 2 * ((int64_t{1} << 24) + 2)), 0);
  TokenBatchOptions options = Options(1, 1, 0, 1);
  EXPECT_TRUE(TokenBatches::Open("f", {path}, options).ok());
  options.shuffle = true;
  absl::Status status = TokenBatches::Open("f", {path}, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("more windows than shuffling allows"));
  EXPECT_THAT(status.message(), Not(HasSubstr("16777217")));  // its window count
}

}  // namespace
}  // namespace mptrain
