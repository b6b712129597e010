#include "common/client_security_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA that signed the coordinator's certificate (enables TLS)");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for mutual TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to verify in the coordinator's certificate (default: the host of --coordinator)");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token (default: the MPTRAIN_TOKEN environment variable)");

namespace mptrain {

absl::StatusOr<ClientSecurity> ClientSecurityFromFlags() {
  ClientSecurity security;
  security.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  security.tls_key = absl::GetFlag(FLAGS_tls_key);
  security.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  absl::StatusOr<std::string> token = LoadClientToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) return token.status();
  security.token = *token;
  return security;
}

}  // namespace mptrain
