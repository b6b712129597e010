#pragma once

// trainctl's configuration file: named contexts (a coordinator and the files to reach it), one
// of them current, as kubeconfig has. At $MPTRAIN_CONFIG, else ~/.config/mptrain/config:
//
//   # written by `trainctl config set-context`; mode 0600
//   current-context = prod
//
//   [context prod]
//   coordinator = train.example.com:50051
//   tls_ca = /etc/mptrain/ca.pem
//   token_file = /home/me/.config/mptrain/token
//
// The file is hostile input: it is read only if it is a regular file of at most 64 KiB that
// no one but its owner may read or write (mode 0600 or stricter), and every line is one of the
// forms above, with a known key and a value of printable characters. An error names the file
// and the line, never what the line holds.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mptrain {

struct NamedContext {
  std::string name;  // 1-63 of [A-Za-z0-9._-].
  std::string coordinator;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  std::string token_file;
};

struct ClientConfig {
  std::string current_context;  // Empty: none.
  std::vector<NamedContext> contexts;
  // The context named `name`, or null.
  const NamedContext* Find(const std::string& name) const;
  NamedContext* Find(const std::string& name);
};

// $MPTRAIN_CONFIG, else $HOME/.config/mptrain/config; empty if neither is set.
std::string ClientConfigPath();

// A missing file is an empty config. INVALID_ARGUMENT: "FILE line N: ..." for a bad line, a
// file too large or readable by others; a current-context that names no context.
absl::StatusOr<ClientConfig> LoadClientConfig(const std::string& path);

// INVALID_ARGUMENT for a context name or value that LoadClientConfig would refuse.
absl::StatusOr<std::string> SerializeClientConfig(const ClientConfig& config);

// Writes the file with mode 0600 (its directory made 0700 if missing), atomically (a
// temporary file renamed over it).
absl::Status SaveClientConfig(const std::string& path, const ClientConfig& config);

}  // namespace mptrain
