#pragma once

// Converts between absl::Status (used everywhere inside the product) and grpc::Status (used only
// at the RPC boundary). The canonical codes have the same numbers in both.

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/status.h"

namespace mptrain {

// Error texts travel in HTTP/2 trailers (8 KiB of metadata at most by default) and may echo
// what a client sent: every message is cut to this length at the boundary.
inline constexpr size_t kMaxErrorMessageBytes = 1024;

// Trailing metadata of a refusal that says when to ask again (milliseconds, decimal): a worker
// registration refused because the coordinator is full.
inline constexpr char kRetryAfterMetadataKey[] = "mptrain-retry-after-ms";

inline std::string TruncateForError(absl::string_view text, size_t limit = kMaxErrorMessageBytes) {
  if (text.size() <= limit) return std::string(text);
  return absl::StrCat(text.substr(0, limit), "... (", text.size() - limit, " more bytes)");
}

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      TruncateForError(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace mptrain
