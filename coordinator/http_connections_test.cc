// The address ranges the HTTP server counts connections in.

#include "coordinator/http_connections.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <string>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

std::string RangeOf(const char* text) {
  sockaddr_in6 v6{};
  if (inet_pton(AF_INET6, text, &v6.sin6_addr) == 1) {
    v6.sin6_family = AF_INET6;
    return AddressRange(reinterpret_cast<sockaddr*>(&v6), sizeof(v6));
  }
  sockaddr_in v4{};
  EXPECT_EQ(inet_pton(AF_INET, text, &v4.sin_addr), 1) << text;
  v4.sin_family = AF_INET;
  return AddressRange(reinterpret_cast<sockaddr*>(&v4), sizeof(v4));
}

TEST(AddressRangeTest, Ipv4_CountsPer24) {
  EXPECT_EQ(RangeOf("10.1.2.3"), RangeOf("10.1.2.250"));
  EXPECT_NE(RangeOf("10.1.2.3"), RangeOf("10.1.3.3"));
  EXPECT_NE(RangeOf("10.1.2.3"), RangeOf("11.1.2.3"));
}

TEST(AddressRangeTest, Ipv4Mapped_CountsAsIpv4) {
  EXPECT_EQ(RangeOf("::ffff:10.1.2.3"), RangeOf("10.1.2.99"));
  EXPECT_NE(RangeOf("::ffff:10.1.2.3"), RangeOf("::ffff:10.1.4.3"));
}

TEST(AddressRangeTest, Ipv6_CountsPer64) {
  EXPECT_EQ(RangeOf("2001:db8:1:2::1"), RangeOf("2001:db8:1:2:ffff:ffff:ffff:ffff"));
  EXPECT_NE(RangeOf("2001:db8:1:2::1"), RangeOf("2001:db8:1:3::1"));
  // An IPv6 address whose first bytes look like an IPv4 range is not in it.
  EXPECT_NE(RangeOf("a01:203::"), RangeOf("10.1.2.3"));
}

TEST(AddressRangeTest, ShortOrOtherAddresses_ShareOneRange) {
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  EXPECT_EQ(AddressRange(reinterpret_cast<sockaddr*>(&v4), 4), "");
  EXPECT_EQ(AddressRange(nullptr, 0), "");
}

}  // namespace
}  // namespace mptrain
