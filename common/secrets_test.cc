#include "common/secrets.h"

#include <set>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(RandomSecret, Always_Is32HexDigitsAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    std::string secret = RandomSecret();
    ASSERT_EQ(secret.size(), 32u);
    EXPECT_EQ(secret.find_first_not_of("0123456789abcdef"), std::string::npos) << secret;
    EXPECT_TRUE(seen.insert(secret).second) << "repeated " << secret;
  }
}

TEST(SecretsEqual, SameText_True) { EXPECT_TRUE(SecretsEqual("abc123", "abc123")); }

TEST(SecretsEqual, DifferentTextOrLength_False) {
  EXPECT_FALSE(SecretsEqual("abc123", "abc124"));
  EXPECT_FALSE(SecretsEqual("abc123", "abc12"));
  EXPECT_FALSE(SecretsEqual("", "x"));
}

TEST(SecretsEqual, BothEmpty_FalseSoAnUnsetSecretNeverMatches) {
  EXPECT_FALSE(SecretsEqual("", ""));
}

}  // namespace
}  // namespace mptrain
