#include "common/path_rules.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace mptrain {
namespace {

// Debian's abseil is built with its own absl::string_view, which does not convert implicitly.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

std::string QuotePathForMessage(std::string_view path) {
  // Cut before escaping so the bound holds on the input, whatever the escaping does.
  if (path.size() <= kMaxEchoedPathChars) {
    return absl::StrCat("\"", absl::CHexEscape(AsAbsl(path)), "\"");
  }
  return absl::StrCat("\"", absl::CHexEscape(AsAbsl(path.substr(0, kMaxEchoedPathChars))), "...\"");
}

absl::Status CheckPathSyntax(std::string_view field_view, std::string_view path) {
  const absl::string_view field = AsAbsl(field_view);
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " must not be empty"));
  // Checked before anything that echoes the path, so a huge input costs only its length.
  if (path.size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be at most ", kMaxPathBytes,
                                                   " bytes, got ", path.size(),
                                                   " bytes: ", QuotePathForMessage(path)));
  }
  // A NUL would silently cut the path when it reaches a C API.
  if (path.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must not contain a NUL byte, got ", QuotePathForMessage(path)));
  }
  if (path.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " must be an absolute path (starting with '/'), got ", QuotePathForMessage(path)));
  }
  for (absl::string_view component : absl::StrSplit(AsAbsl(path), '/', absl::SkipEmpty())) {
    // ".." would let a path climb out of a root that it lexically starts with; "." is harmless
    // but has no use, and refusing it keeps "lexically under" simple.
    if (component == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " must not contain '..' components, got ", QuotePathForMessage(path)));
    }
    if (component == ".") {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must not contain '.' components, got ", QuotePathForMessage(path)));
    }
  }
  return absl::OkStatus();
}

std::string NormalizePath(std::string_view path) {
  std::string out;
  out.reserve(path.size());
  for (char c : path) {
    if (c == '/' && !out.empty() && out.back() == '/') continue;
    out.push_back(c);
  }
  if (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

bool IsUnderRoot(std::string_view path, std::string_view root) {
  // A security check should not depend on every caller having validated first.
  if (!CheckPathSyntax("path", path).ok() || !CheckPathSyntax("root", root).ok()) return false;
  const std::string p = NormalizePath(path);
  const std::string r = NormalizePath(root);
  if (r == "/") return true;  // Every absolute path is under "/".
  if (p.size() < r.size() || p.compare(0, r.size(), r) != 0) return false;
  // Equal, or the next character starts a new component ("/data/x", not "/database").
  return p.size() == r.size() || p[r.size()] == '/';
}

bool IsUnderAnyRoot(std::string_view path, const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    if (IsUnderRoot(path, root)) return true;
  }
  return false;
}

std::string DescribeRoots(const std::vector<std::string>& roots) {
  return absl::StrCat("[", absl::StrJoin(roots, ", "), "]");
}

}  // namespace mptrain
