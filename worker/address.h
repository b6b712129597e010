#pragma once

// Which address this worker's ranks are reached at. Peers connect to it for their collectives
// (gloo listens there), so it must be an address of this machine that other machines can
// reach: by default, the local address the kernel picks to reach the coordinator.

#include <string>

#include "absl/status/statusor.h"

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

}  // namespace mptrain
