#pragma once

// Debian's abseil (20220623) has absl::Status but no RETURN_IF_ERROR; these are the two macros
// every layer uses to pass errors up with context instead of crashing.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MPTRAIN_CONCAT_INNER(a, b) a##b
#define MPTRAIN_CONCAT(a, b) MPTRAIN_CONCAT_INNER(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define RETURN_IF_ERROR(expr)                   \
  do {                                          \
    ::absl::Status mptrain_status_ = (expr);    \
    if (!mptrain_status_.ok()) return mptrain_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` declares x from an OK StatusOr, or returns its status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  MPTRAIN_ASSIGN_OR_RETURN_IMPL(MPTRAIN_CONCAT(mptrain_statusor_, __LINE__), lhs, expr)

#define MPTRAIN_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
