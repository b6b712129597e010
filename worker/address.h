#pragma once

// Which address this worker's ranks are reached at. Peers connect to it for their collectives
// (gloo listens there), so it must be an address of this machine that other machines can
// reach: by default, the local address the kernel picks to reach the coordinator.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/port_range.h"

namespace mptrain {

// The local IP address of the route to `coordinator` (HOST:PORT; a name, IPv4, or [IPv6]).
// No packet is sent: a UDP socket is connected and asked its own address. UNAVAILABLE when
// the host does not resolve or no route leads there.
absl::StatusOr<std::string> LocalAddressTowards(const std::string& coordinator);

// Whether `address` (an IP address or a name) resolves only to loopback addresses.
bool ResolvesToLoopback(const std::string& address);

// --host checked against the coordinator: an address other machines cannot reach (loopback)
// while the coordinator is elsewhere is refused (FAILED_PRECONDITION, saying why and what to
// pass instead); empty --host takes LocalAddressTowards(coordinator).
absl::StatusOr<std::string> ChooseAdvertisedHost(const std::string& host_flag,
                                                 const std::string& coordinator);

// The name of the local network interface that holds `address` (an IP address, or a name that
// resolves to one), from getifaddrs: e.g. "eth0" for this machine's 10.0.0.2. A loopback
// address (127.x, ::1) gives the loopback interface ("lo"), which holds all of 127/8.
// NOT_FOUND when no interface of this machine holds it (a NAT's public address, another
// machine's), UNAVAILABLE when the name does not resolve.
absl::StatusOr<std::string> InterfaceForAddress(const std::string& address);

// Environment entries "NAME=VALUE" that pin a rank's NCCL to `interface` (NCCL_SOCKET_IFNAME
// "=<interface>": that interface exactly, for bootstrap and the socket transport), and its
// address family to that of `address` (NCCL_SOCKET_FAMILY), each only where `user_env` (the
// daemon's own environment, which its ranks inherit) does not set that variable already.
std::vector<std::string> NcclInterfaceEnvironment(const std::string& address,
                                                  const std::string& interface,
                                                  char** user_env);

// --port_range checked for a worker of `slots` slots: ParsePortRange's rules, and at least one
// port per slot. INVALID_ARGUMENT naming the flag. Empty text: no range.
absl::StatusOr<PortRange> PortRangeForSlots(const std::string& text, int slots);

}  // namespace mptrain
