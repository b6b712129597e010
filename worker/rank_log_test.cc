#include "worker/rank_log.h"

#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(RankLogTap, KeepsWhatWasWritten_UntilTaken_WithOffsets) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  RankLogTap tap(fds[0]);
  const std::string text = "line one\nline two\n";
  ASSERT_EQ(write(fds[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fds[1]);
  tap.WaitClosed(5'000);
  RankLogTap::Chunk first = tap.Take(5);
  EXPECT_EQ(first.offset, 0);
  EXPECT_EQ(first.data, "line ");
  RankLogTap::Chunk rest = tap.Take(1 << 20);
  EXPECT_EQ(rest.offset, 5);
  EXPECT_EQ(rest.data, "one\nline two\n");
  EXPECT_TRUE(tap.Drained());
  EXPECT_TRUE(tap.Take(10).data.empty());
}

TEST(RankLogTap, DropsTheOldestUnsentBytesPastTheBound) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  RankLogTap tap(fds[0]);
  const std::string block(64 << 10, 'x');
  const size_t blocks = RankLogTap::kMaxUnsentBytes / block.size() + 2;
  // Written from a thread: the pipe holds only 64 KiB while the tap copies it out.
  std::thread writer([&] {
    for (size_t i = 0; i < blocks; ++i) {
      ASSERT_EQ(write(fds[1], block.data(), block.size()), static_cast<ssize_t>(block.size()));
    }
    close(fds[1]);
  });
  writer.join();
  tap.WaitClosed(5'000);
  RankLogTap::Chunk chunk = tap.Take(1 << 30);
  EXPECT_EQ(chunk.data.size(), RankLogTap::kMaxUnsentBytes);
  EXPECT_EQ(chunk.offset, static_cast<int64_t>(blocks * block.size() - RankLogTap::kMaxUnsentBytes));
}

}  // namespace
}  // namespace mptrain
