#pragma once

// The client-side security flags shared by trainctl and the worker (and its rank processes):
//   --tls_ca, --tls_cert, --tls_key, --tls_server_name, --token_file (or MPTRAIN_TOKEN).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/client_channel.h"

namespace mptrain {

// Reads the flags and the token. Errors name the flag.
absl::StatusOr<ClientSecurity> ClientSecurityFromFlags();

}  // namespace mptrain
