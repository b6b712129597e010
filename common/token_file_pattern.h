#pragma once

// The lexical rule for TokenData.files entries (proto/mptrain.proto): a path, or a pattern whose
// last component holds the wildcards '*' or '?' (matched on the worker with glob(3)). Pure: the
// coordinator checks it at submit, the worker before it globs (trainer/data/token_file_list.h).

#include <string>

#include "absl/status/status.h"

namespace mptrain {

// Whether the last component holds '*' or '?'.
bool IsTokenFilePattern(const std::string& path);

// CheckPathSyntax (common/path_rules.h), then, for a pattern: INVALID_ARGUMENT naming `field`
// when a directory component holds '*', '?' or '[' (only the last component may be a pattern),
// or the last component holds '[' or '\' (no bracket expressions or escapes: * and ? only).
absl::Status CheckTokenFileEntry(const std::string& field, const std::string& path);

}  // namespace mptrain
