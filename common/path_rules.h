#pragma once

// Lexical rules for the file paths a job spec names (data files, checkpoints).
//
// Workers usually run as root, so a hostile spec must not make one read or write outside the
// directories it allows. These functions are pure and never touch the filesystem: the coordinator
// uses them at submit time against the roots that workers report, and worker/path_policy.h adds the
// filesystem checks (symbolic links, file types) on the worker itself.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace mptrain {

// Longest path accepted, in bytes: Linux's PATH_MAX, so that realpath() and open() never see a
// longer one.
inline constexpr size_t kMaxPathBytes = 4096;

// Longest piece of a hostile path echoed in an error message.
inline constexpr size_t kMaxEchoedPathChars = 200;

// Checks the syntax of a path named by `field`. INVALID_ARGUMENT naming the field unless the path
// is non-empty, absolute, at most kMaxPathBytes bytes, has no NUL byte and no "." or ".."
// component, e.g. `output_checkpoint must not contain '..' components, got "/a/../b"`.
// Repeated slashes and a trailing slash are tolerated.
absl::Status CheckPathSyntax(std::string_view field, std::string_view path);

// Collapses repeated '/' and drops a trailing '/' (the root "/" stays "/"). Meant for paths that
// pass CheckPathSyntax; it does not resolve "." or "..".
std::string NormalizePath(std::string_view path);

// Whether `path` is `root` or lies below it, compared lexically at a component boundary after
// normalizing both: "/data/x" is under "/data", "/data/" and "/", but not under "/dat".
// Fails closed: false when either side does not pass CheckPathSyntax (so "/data/../etc" is not
// under "/data").
bool IsUnderRoot(std::string_view path, std::string_view root);

// Whether `path` is under at least one of `roots` (see IsUnderRoot).
bool IsUnderAnyRoot(std::string_view path, const std::vector<std::string>& roots);

// The roots for a message, e.g. "[/a, /b]".
std::string DescribeRoots(const std::vector<std::string>& roots);

// A path as it may appear in a message: quoted, cut to kMaxEchoedPathChars characters (then "..."
// is added) and C-escaped, so that hostile input never makes a huge error or injects control
// characters into logs. E.g. "/a/b" becomes `"/a/b"`.
std::string QuotePathForMessage(std::string_view path);

}  // namespace mptrain
