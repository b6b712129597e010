#pragma once

// The one way every client (trainctl, the worker daemon, its rank processes, tests) opens a
// channel to the coordinator: TLS when a CA is given (mutual TLS with a client certificate),
// and the bearer token added to every call by an interceptor, so no call site can forget it.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"

namespace mptrain {

struct ClientSecurity {
  std::string tls_ca;           // PEM file of the CA that signed the coordinator's certificate.
  std::string tls_cert;         // PEM client certificate (mutual TLS), with tls_key.
  std::string tls_key;
  std::string tls_server_name;  // Name to check in the coordinator's certificate, if not the host.
  std::string token;            // Sent as `authorization: Bearer TOKEN` when non-empty.
};

// The token from --token_file (the token alone, on its first non-empty line) or, when that
// flag is empty, from the MPTRAIN_TOKEN environment variable. Empty when neither is set.
absl::StatusOr<std::string> LoadClientToken(const std::string& token_file);

// INVALID_ARGUMENT / NOT_FOUND name the flag of a missing or malformed PEM file, or a
// certificate given without its key.
// `own_connection`: never share a connection with another channel to the same address
// (gRPC pools them per process): a fresh one, as after a network blip, when the old
// connection's retransmissions have backed off for seconds.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeCoordinatorChannel(
    const std::string& address, const ClientSecurity& security, bool own_connection = false);

// The TLS flags that reproduce `security` in a child process. The token is not among them: a
// command line is readable by every local user, so it travels in the child's environment.
std::vector<std::string> TlsFlagsFor(const ClientSecurity& security);

}  // namespace mptrain
