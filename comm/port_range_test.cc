#include "comm/port_range.h"

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(ParsePortRange, Range_Parsed) {
  auto range = ParsePortRange("29500-29599", "--port_range");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->lo, 29500);
  EXPECT_EQ(range->hi, 29599);
  EXPECT_EQ(range->size(), 100);
  EXPECT_TRUE(range->Contains(29500));
  EXPECT_TRUE(range->Contains(29599));
  EXPECT_FALSE(range->Contains(29600));
  EXPECT_EQ(range->ToString(), "29500-29599");
}

TEST(ParsePortRange, OnePort_IsARangeOfOne) {
  auto range = ParsePortRange("40000", "--port_range");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->lo, 40000);
  EXPECT_EQ(range->hi, 40000);
  EXPECT_EQ(range->size(), 1);
  EXPECT_TRUE(ParsePortRange("1024-65535", "--port_range").ok());
}

TEST(ParsePortRange, Malformed_InvalidArgumentNamingTheFlag) {
  for (const char* text : {"", "-", "29500-", "-29500", "a-b", "29500-29599-29600", "29500 - 29599",
                           "+29500-29599", "029500-29599", "1e4-2e4", "123456-123457"}) {
    auto range = ParsePortRange(text, "--port_range");
    ASSERT_FALSE(range.ok()) << text;
    EXPECT_EQ(range.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(range.status().message().find("--port_range must be LO-HI"), std::string::npos)
        << range.status();
  }
}

TEST(ParsePortRange, OutOfBounds_InvalidArgument) {
  for (const char* text : {"80-90", "1023-2000", "60000-65536", "0-0"}) {
    auto range = ParsePortRange(text, "--port_range");
    ASSERT_FALSE(range.ok()) << text;
    EXPECT_NE(range.status().message().find("ports must be in [1024, 65535]"), std::string::npos)
        << range.status();
  }
}

TEST(ParsePortRange, Reversed_InvalidArgument) {
  auto range = ParsePortRange("30000-29999", "MPTRAIN_GLOO_PORT_RANGE");
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.status().message(),
            "MPTRAIN_GLOO_PORT_RANGE 30000-29999: LO must be <= HI (30000 > 29999)");
}

}  // namespace
}  // namespace mptrain
