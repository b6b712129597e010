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

// The one character rule for text that a spec names and that ends up in file names, logs,
// terminals and the dashboard (paths, the job name): valid UTF-8 (no overlong form, surrogate
// or code point above U+10FFFF) with no character that is invisible or makes the text display
// otherwise than it is:
// - control characters: U+0000-U+001F (newline, tab, escape, ...), U+007F-U+009F;
// - line and paragraph separators: U+2028, U+2029;
// - bidirectional marks, embeddings, overrides and isolates: U+061C, U+200E, U+200F,
//   U+202A-U+202E, U+2066-U+2069;
// - other invisible format characters: U+00AD, U+180E, U+200B-U+200D, U+2060-U+2064, U+FEFF,
//   U+FFF9-U+FFFB and the tags U+E0000-U+E007F.
// INVALID_ARGUMENT naming the field, the character and its byte offset, e.g.
// `output_checkpoint must not contain U+202E (a bidirectional formatting character), at byte 9
// of "/out/a\xe2\x80\xaeb"`.
absl::Status CheckTextCharacters(std::string_view field, std::string_view text);

// Longest job name, in bytes.
inline constexpr size_t kMaxNameBytes = 128;

// The rule for a job's name (optional: empty is no name): CheckTextCharacters, then at most
// kMaxNameBytes of [A-Za-z0-9._-] starting with a letter or a digit, so that no name reads as
// an option ("-rf") or a directory ("." or ".."). INVALID_ARGUMENT naming `field`.
absl::Status CheckNameSyntax(std::string_view field, std::string_view name);

// Checks the syntax of a path named by `field`. INVALID_ARGUMENT naming the field unless the path
// is non-empty, absolute, at most kMaxPathBytes bytes, passes CheckTextCharacters (so has no NUL
// byte or newline) and has no "." or ".." component, e.g. `output_checkpoint must not contain
// '..' components, got "/a/../b"`. Repeated slashes and a trailing slash are tolerated.
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
