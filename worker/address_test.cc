#include "worker/address.h"

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(LocalAddressTowards, LoopbackCoordinator_IsLoopback) {
  auto address = LocalAddressTowards("127.0.0.1:50051");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "127.0.0.1");
  auto named = LocalAddressTowards("localhost:50051");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_TRUE(ResolvesToLoopback(*named));
}

TEST(LocalAddressTowards, Malformed_InvalidArgument) {
  EXPECT_EQ(LocalAddressTowards("no-port").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LocalAddressTowards("[::1]").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LocalAddressTowards, Unresolvable_Unavailable) {
  EXPECT_EQ(LocalAddressTowards("no-such-host.invalid:1").status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(ResolvesToLoopback, Forms) {
  EXPECT_TRUE(ResolvesToLoopback("127.0.0.1"));
  EXPECT_TRUE(ResolvesToLoopback("127.0.1.1"));  // Debian's /etc/hosts line for the hostname.
  EXPECT_TRUE(ResolvesToLoopback("::1"));
  EXPECT_FALSE(ResolvesToLoopback("10.77.0.11"));
  EXPECT_FALSE(ResolvesToLoopback("no-such-host.invalid"));
}

TEST(ChooseAdvertisedHost, OneMachineCluster_LoopbackIsFine) {
  auto host = ChooseAdvertisedHost("", "127.0.0.1:50051");
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(*host, "127.0.0.1");
  EXPECT_EQ(*ChooseAdvertisedHost("127.0.0.1", "127.0.0.1:50051"), "127.0.0.1");
}

}  // namespace
}  // namespace mptrain
