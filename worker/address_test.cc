#include "worker/address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>

#include <map>

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

TEST(InterfaceForAddress, Loopback_IsLo) {
  for (const char* address : {"127.0.0.1", "127.0.1.1", "localhost"}) {
    auto name = InterfaceForAddress(address);
    ASSERT_TRUE(name.ok()) << address << ": " << name.status();
    EXPECT_EQ(*name, "lo") << address;
  }
}

TEST(InterfaceForAddress, EveryAddressOfThisMachine_ItsInterface) {
  // What getifaddrs lists, read independently: each IPv4 address held by one interface.
  std::map<std::string, std::vector<std::string>> holders;
  ifaddrs* interfaces = nullptr;
  ASSERT_EQ(getifaddrs(&interfaces), 0);
  for (ifaddrs* entry = interfaces; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr, text,
              sizeof(text));
    holders[text].push_back(entry->ifa_name);
  }
  freeifaddrs(interfaces);
  ASSERT_FALSE(holders.empty());
  for (const auto& [address, names] : holders) {
    if (names.size() != 1) continue;
    auto name = InterfaceForAddress(address);
    ASSERT_TRUE(name.ok()) << address << ": " << name.status();
    EXPECT_EQ(*name, names[0]) << address;
  }
}

TEST(InterfaceForAddress, NotHere_NotFound) {
  auto name = InterfaceForAddress("203.0.113.254");  // TEST-NET-3: on no machine.
  EXPECT_EQ(name.status().code(), absl::StatusCode::kNotFound) << name.status();
  EXPECT_EQ(name.status().message(), "no network interface of this machine holds 203.0.113.254");
  EXPECT_EQ(InterfaceForAddress("no-such-host.invalid").status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(NcclInterfaceEnvironment, Unset_PinsTheInterfaceAndFamily) {
  char* none[] = {nullptr};
  EXPECT_EQ(NcclInterfaceEnvironment("10.0.0.2", "eth0", none),
            (std::vector<std::string>{"NCCL_SOCKET_IFNAME==eth0", "NCCL_SOCKET_FAMILY=AF_INET"}));
  EXPECT_EQ(NcclInterfaceEnvironment("fd00::2", "ib0", none),
            (std::vector<std::string>{"NCCL_SOCKET_IFNAME==ib0", "NCCL_SOCKET_FAMILY=AF_INET6"}));
  // A name: the family is NCCL's choice.
  EXPECT_EQ(NcclInterfaceEnvironment("gpu1.example", "eth0", none),
            (std::vector<std::string>{"NCCL_SOCKET_IFNAME==eth0"}));
}

TEST(NcclInterfaceEnvironment, SetByTheUser_LeftAlone) {
  char ifname[] = "NCCL_SOCKET_IFNAME=ib";
  char family[] = "NCCL_SOCKET_FAMILY=AF_INET6";
  char other[] = "NCCL_SOCKET_IFNAMEX=1";
  char* env[] = {other, ifname, nullptr};
  EXPECT_EQ(NcclInterfaceEnvironment("10.0.0.2", "eth0", env),
            (std::vector<std::string>{"NCCL_SOCKET_FAMILY=AF_INET"}));
  char* both[] = {ifname, family, nullptr};
  EXPECT_TRUE(NcclInterfaceEnvironment("10.0.0.2", "eth0", both).empty());
}

TEST(PortRangeForSlots, Checks) {
  EXPECT_TRUE(PortRangeForSlots("", 4)->empty());
  auto range = PortRangeForSlots("29500-29503", 4);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->size(), 4);
  auto small = PortRangeForSlots("29500", 2);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find(
                "--port_range 29500 has 1 port but this worker runs 2 ranks at once (--slots)"),
            std::string::npos)
      << small.status();
  auto reversed = PortRangeForSlots("29600-29500", 1);
  EXPECT_NE(reversed.status().message().find("--port_range 29600-29500: LO must be <= HI"),
            std::string::npos)
      << reversed.status();
  EXPECT_NE(PortRangeForSlots("80-90", 1).status().message().find("--port_range"),
            std::string::npos);
}

}  // namespace
}  // namespace mptrain
