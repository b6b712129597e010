#pragma once

// Converts between absl::Status (used everywhere inside the product) and grpc::Status (used only
// at the RPC boundary). The canonical codes have the same numbers in both.

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace mptrain {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace mptrain
