#pragma once

// How the coordinator's port is protected, decided once at start-up from its flags:
//   - TLS (--tls_cert/--tls_key), mutual when --tls_client_ca is given;
//   - tokens (--token_file), checked by TokenAuthProcessor on every call;
//   - off loopback, both are required unless --insecure (which then warns at every start);
//   - on loopback without TLS, tokens still work (gRPC's local credentials carry the check).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/auth.h"
#include "grpcpp/security/server_credentials.h"

namespace mptrain {

struct ServerSecurityOptions {
  std::string listen;  // HOST:PORT
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string token_file;
  bool insecure = false;
};

struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::shared_ptr<const Authenticator> authenticator;
  std::string summary;                // One line for the start-up log.
  std::vector<std::string> warnings;  // Logged at every start.
};

// Whether HOST of HOST:PORT is a loopback address (127.0.0.0/8, ::1, localhost).
bool IsLoopbackListenAddress(const std::string& listen);

// FAILED_PRECONDITION when the port would be open to the network without TLS and tokens and
// --insecure was not given; INVALID_ARGUMENT / NOT_FOUND name a bad flag or file.
absl::StatusOr<ServerSecurity> MakeServerSecurity(const ServerSecurityOptions& options);

}  // namespace mptrain
