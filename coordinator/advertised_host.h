#pragma once

// The coordinator's check of the address a worker advertises for its ranks: peers on other
// machines connect there for their collectives, so a worker connecting from another machine
// must not advertise loopback (it would work for nobody but itself, and the job would fail
// later with "connection refused" far from the cause).

#include <optional>
#include <string>

#include "absl/status/status.h"

namespace mptrain {

// The IP address in a gRPC peer string ("ipv4:10.0.0.3:5123", "ipv6:[::1]:5000"); nullopt for
// other transports (unix sockets, in-process).
std::optional<std::string> PeerIp(const std::string& grpc_peer);

// Whether `host` is written as a loopback address: 127.0.0.0/8, ::1, ::ffff:127.x or
// "localhost". Names are not resolved here (this machine's resolver says nothing of the
// worker's); the worker checks its own names (worker/address.h).
bool IsLoopbackLiteral(const std::string& host);

// FAILED_PRECONDITION when `host` is a loopback literal but the worker connects from a
// non-loopback address, naming both and what to do.
absl::Status CheckAdvertisedHost(const std::string& host, const std::string& grpc_peer);

}  // namespace mptrain
