#include "trainer/model/gpt_sampler.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

std::vector<int64_t> Bytes(const std::string& text) {
  return std::vector<int64_t>(text.begin(), text.end());
}

std::vector<int64_t> Concat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(DescribeSample, BytesThatFit_AreThePromptAndItsContinuation) {
  EXPECT_EQ(DescribeSample(Bytes("In the beginning\n\x01\xff"), 10, true, 4096),
            "In the beginning\n??");
}

TEST(DescribeSample, IdsThatFit_AreSeparatedBySpaces) {
  EXPECT_EQ(DescribeSample({5, 17, 0, 3}, 2, false, 4096), "5 17 0 3");
  EXPECT_EQ(DescribeSample({5, 17}, 2, false, 4096), "5 17");   // No continuation yet.
  EXPECT_EQ(DescribeSample({}, 0, false, 4096), "");
}

TEST(DescribeSample, LongBytePrompt_GivesWayToTheContinuation) {
  const std::string prompt(4096, 'p');
  const std::string continuation = "and the earth was without form";
  const std::string text =
      DescribeSample(Concat(Bytes(prompt), Bytes(continuation)), prompt.size(), true, 4096);
  EXPECT_EQ(text.size(), 4096u);
  EXPECT_EQ(text.substr(0, 3), "\u2026");
  EXPECT_EQ(text.substr(text.size() - continuation.size()), continuation);
  EXPECT_EQ(text.substr(3, text.size() - 3 - continuation.size()),
            std::string(4096 - 3 - continuation.size(), 'p'));
}

TEST(DescribeSample, LongContinuation_KeepsAQuarterForThePromptAndIsCutAtItsEnd) {
  const std::string prompt(3000, 'p');
  const std::string continuation(5000, 'c');
  const std::string text =
      DescribeSample(Concat(Bytes(prompt), Bytes(continuation)), prompt.size(), true, 4096);
  ASSERT_EQ(text.size(), 4096u);
  EXPECT_EQ(text.substr(0, 3), "\u2026");
  EXPECT_EQ(text.substr(3, 1024 - 3), std::string(1024 - 3, 'p'));
  EXPECT_EQ(text.substr(1024), std::string(4096 - 1024, 'c'));
}

TEST(DescribeSample, ShortPromptAndLongContinuation_KeepTheWholePrompt) {
  const std::string text = DescribeSample(Concat(Bytes("abc"), Bytes(std::string(9000, 'c'))),
                                          3, true, 4096);
  ASSERT_EQ(text.size(), 4096u);
  EXPECT_EQ(text.substr(0, 4), "abcc");
}

TEST(DescribeSample, LongIdPrompt_KeepsWholeIdsAndTheContinuation) {
  std::vector<int64_t> prompt(1000, 12345);  // 5,999 bytes as text.
  const std::vector<int64_t> continuation = {7, 8, 9};
  const std::string text = DescribeSample(Concat(prompt, continuation), prompt.size(), false, 64);
  EXPECT_LE(text.size(), 64u);
  EXPECT_EQ(text.substr(0, 4), "\u2026 ");
  EXPECT_EQ(text.substr(text.size() - 6), " 7 8 9");
  // Only whole ids between the marker and the continuation.
  const std::string middle = text.substr(4, text.size() - 4 - 6);
  for (size_t i = 0; i < middle.size(); i += 6) EXPECT_EQ(middle.substr(i, 5), "12345") << text;
  EXPECT_EQ(middle.size() % 6, 5u) << text;
}

}  // namespace
}  // namespace mptrain
