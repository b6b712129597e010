#pragma once

// The token files a spec's TokenData.files names, on the worker: each entry is a file, or a
// pattern whose last component holds '*' or '?' (glob(3)). Every file, and every pattern's
// directory, passes the worker's path policy (worker/path_policy.h CheckRead), through a function
// the caller passes, so that this library needs no worker code.

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mptrain {

// (field, path) -> the resolved path to open, or the policy's error: PathPolicy::CheckRead.
using CheckReadFunction =
    std::function<absl::StatusOr<std::string>(const std::string& field, const std::string& path)>;

// Expands `entries` (the spec's files, named "<field>[i]" in errors) into the resolved paths
// to open, in order. Every entry is first checked lexically (common/token_file_pattern.h
// CheckTokenFileEntry: INVALID_ARGUMENT); a plain entry is then check_read's answer for it; a
// pattern is
//   1. checked with check_read as a file first, so that a pattern outside the roots, or in a
//      directory that resolves outside them, is refused before anything lists that directory
//      (only NOT_FOUND, the usual answer for a name holding '*', lets it go on);
//   2. matched with glob(3) (GLOB_ERR; hidden files only by an explicit leading '.'): the matches
//      sorted bytewise (not by the locale), each then passed through check_read (a match that
//      is a symbolic link or not a regular file fails the whole list). No match is INVALID_ARGUMENT
//      naming the pattern.
// At most kMaxTokenFiles (token_shards.h) files in all: INVALID_ARGUMENT beyond.
absl::StatusOr<std::vector<std::string>> ExpandTokenFiles(const std::string& field,
                                                          const std::vector<std::string>& entries,
                                                          const CheckReadFunction& check_read);

}  // namespace mptrain
