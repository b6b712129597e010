#pragma once

// Reading small configuration files (PEM certificates, token files) that may be hostile: regular
// files only (a FIFO or device never blocks the caller), at most `max_bytes`.

#include <cstddef>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace mptrain {

// `what` names the file in errors (e.g. "--tls_cert"). NOT_FOUND when it cannot be opened,
// INVALID_ARGUMENT when it is not a regular file or is larger than max_bytes.
absl::StatusOr<std::string> ReadSmallFile(const std::string& what, const std::string& path,
                                          size_t max_bytes);

// A PEM file (certificate, key or CA bundle) of at most 1 MiB; INVALID_ARGUMENT when it holds
// no PEM block.
absl::StatusOr<std::string> ReadPemFile(const std::string& what, const std::string& path);

}  // namespace mptrain
