#include "coordinator/server_security.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/small_file.h"

namespace mptrain {
namespace {

std::string HostOf(const std::string& listen) {
  if (!listen.empty() && listen[0] == '[') {
    size_t end = listen.find(']');
    return end == std::string::npos ? listen : listen.substr(1, end - 1);
  }
  size_t colon = listen.rfind(':');
  return colon == std::string::npos ? listen : listen.substr(0, colon);
}

}  // namespace

bool IsLoopbackListenAddress(const std::string& listen) {
  const std::string host = HostOf(listen);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::StatusOr<ServerSecurity> MakeServerSecurity(const ServerSecurityOptions& options) {
  ServerSecurity security;
  const bool tls = !options.tls_cert.empty() || !options.tls_key.empty();
  const bool tokens = !options.token_file.empty();
  const bool loopback = IsLoopbackListenAddress(options.listen);

  std::optional<TokenTable> table;
  if (tokens) {
    absl::StatusOr<TokenTable> loaded = TokenTable::Load(options.token_file);
    if (!loaded.ok()) return loaded.status();
    table = std::move(*loaded);
  }
  security.authenticator = std::make_shared<Authenticator>(std::move(table));

  if (!loopback && !(tls && tokens)) {
    if (!options.insecure) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to listen on ", options.listen, " without ",
          tls ? "tokens (--token_file)" : (tokens ? "TLS (--tls_cert, --tls_key)"
                                                  : "TLS (--tls_cert, --tls_key) and tokens "
                                                    "(--token_file)"),
          ": anyone who reaches the port could run jobs as root on the workers. Listen on "
          "127.0.0.1, add them, or pass --insecure on a network you trust"));
    }
    security.warnings.push_back(absl::StrCat(
        "--insecure: ", options.listen, " is served without ",
        tls ? "tokens" : (tokens ? "TLS" : "TLS or tokens"),
        "; whoever reaches the port can submit jobs, forge results and act as a worker"));
  }

  if (tls) {
    if (options.tls_cert.empty() || options.tls_key.empty()) {
      return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
    }
    absl::StatusOr<std::string> cert = ReadPemFile("--tls_cert", options.tls_cert);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile("--tls_key", options.tls_key);
    if (!key.ok()) return key.status();
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!options.tls_client_ca.empty()) {
      absl::StatusOr<std::string> ca = ReadPemFile("--tls_client_ca", options.tls_client_ca);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    security.credentials = grpc::SslServerCredentials(ssl);
    security.summary = options.tls_client_ca.empty() ? "TLS" : "mutual TLS";
  } else {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    if (tokens && !loopback) {
      // The processor that checks tokens needs secure credentials, and a token sent in clear
      // over a network is a token given away.
      return absl::FailedPreconditionError(
          "--token_file off loopback needs TLS (--tls_cert, --tls_key): tokens would cross the "
          "network in clear text");
    }
    // Local credentials accept loopback peers only and let the token check run without TLS.
    security.credentials = tokens ? grpc::experimental::LocalServerCredentials(LOCAL_TCP)
                                  : grpc::InsecureServerCredentials();
    security.summary = "plaintext";
  }
  if (tokens) {
    security.credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenAuthProcessor>(security.authenticator));
    absl::StrAppend(&security.summary, ", tokens (", options.token_file, ")");
  } else {
    absl::StrAppend(&security.summary, ", no tokens");
  }
  return security;
}

}  // namespace mptrain
