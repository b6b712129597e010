#include "coordinator/advertised_host.h"

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(PeerIp, ParsesGrpcPeers) {
  EXPECT_EQ(PeerIp("ipv4:10.0.0.3:5123"), "10.0.0.3");
  EXPECT_EQ(PeerIp("ipv6:[::1]:5000"), "::1");
  EXPECT_EQ(PeerIp("ipv6:%5Bfd00::2%5D:77"), "fd00::2");
  EXPECT_EQ(PeerIp("unix:/tmp/socket"), std::nullopt);
}

TEST(IsLoopbackLiteral, KnowsTheLoopbackForms) {
  for (const char* host : {"127.0.0.1", "127.0.1.1", "::1", "[::1]", "localhost", "LOCALHOST",
                           "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackLiteral(host)) << host;
  }
  for (const char* host : {"10.0.0.2", "fd00::1", "h1", "128.0.0.1", ""}) {
    EXPECT_FALSE(IsLoopbackLiteral(host)) << host;
  }
}

TEST(CheckAdvertisedHost, LoopbackFromElsewhere_IsRefusedNamingBoth) {
  absl::Status status = CheckAdvertisedHost("127.0.0.1", "ipv4:10.0.0.3:40000");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("host 127.0.0.1 is a loopback address, but this worker "
                                  "connects from 10.0.0.3"),
            std::string::npos)
      << status;
}

TEST(CheckAdvertisedHost, SameMachineOrRoutableAddress_IsAccepted) {
  EXPECT_TRUE(CheckAdvertisedHost("127.0.0.1", "ipv4:127.0.0.1:40000").ok());
  EXPECT_TRUE(CheckAdvertisedHost("::1", "ipv6:[::1]:40000").ok());
  EXPECT_TRUE(CheckAdvertisedHost("10.0.0.3", "ipv4:10.0.0.3:40000").ok());
  EXPECT_TRUE(CheckAdvertisedHost("h3", "ipv4:10.0.0.3:40000").ok());
  EXPECT_TRUE(CheckAdvertisedHost("127.0.0.1", "unix:/run/x").ok());
}

}  // namespace
}  // namespace mptrain
