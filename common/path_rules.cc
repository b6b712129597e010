#include "common/path_rules.h"

#include <cstdint>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace mptrain {
namespace {

// Debian's abseil is built with its own absl::string_view, which does not convert implicitly.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The code point of the UTF-8 sequence at text[*at], advancing *at past it; -1 (and *at past
// one byte) when the bytes there are not a valid, shortest-form sequence of a scalar value.
int32_t DecodeUtf8(std::string_view text, size_t* at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(*at);
  size_t length;
  int32_t code;
  int32_t min;
  if (lead < 0x80) {
    ++*at;
    return lead;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, code = lead & 0x1F, min = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, code = lead & 0x0F, min = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, code = lead & 0x07, min = 0x10000;
  } else {
    ++*at;
    return -1;
  }
  if (text.size() - *at < length) {
    ++*at;
    return -1;
  }
  for (size_t i = 1; i < length; ++i) {
    if ((byte(*at + i) & 0xC0) != 0x80) {
      ++*at;
      return -1;
    }
    code = (code << 6) | (byte(*at + i) & 0x3F);
  }
  if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
    ++*at;
    return -1;
  }
  *at += length;
  return code;
}

// What is wrong with `code` in a name or path, or nullptr when nothing is.
const char* RefusedCharacterKind(int32_t code) {
  if (code < 0x20 || (code >= 0x7F && code <= 0x9F)) return "a control character";
  if (code == 0x2028 || code == 0x2029) return "a line or paragraph separator";
  if (code == 0x061C || code == 0x200E || code == 0x200F || (code >= 0x202A && code <= 0x202E) ||
      (code >= 0x2066 && code <= 0x2069)) {
    return "a bidirectional formatting character";
  }
  if (code == 0x00AD || code == 0x180E || (code >= 0x200B && code <= 0x200D) ||
      (code >= 0x2060 && code <= 0x2064) || code == 0xFEFF || (code >= 0xFFF9 && code <= 0xFFFB) ||
      (code >= 0xE0000 && code <= 0xE007F)) {
    return "an invisible formatting character";
  }
  return nullptr;
}

}  // namespace

absl::Status CheckTextCharacters(std::string_view field_view, std::string_view text) {
  const absl::string_view field = AsAbsl(field_view);
  for (size_t at = 0; at < text.size();) {
    const size_t start = at;
    const int32_t code = DecodeUtf8(text, &at);
    if (code < 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, " must be valid UTF-8, got byte ",
                                                     start, " of ", QuotePathForMessage(text)));
    }
    if (const char* kind = RefusedCharacterKind(code); kind != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " must not contain ", absl::StrFormat("U+%04X", code), " (", kind,
          "), at byte ", start, " of ", QuotePathForMessage(text)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNameSyntax(std::string_view field_view, std::string_view name) {
  const absl::string_view field = AsAbsl(field_view);
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be at most ", kMaxNameBytes,
                                                   " bytes, got ", name.size(), " bytes: ",
                                                   QuotePathForMessage(name)));
  }
  RETURN_IF_ERROR(CheckTextCharacters(field_view, name));
  const auto alphanumeric = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  for (char c : name) {
    if (!alphanumeric(c) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " must be characters of [A-Za-z0-9._-], got ", QuotePathForMessage(name)));
    }
  }
  if (!name.empty() && !alphanumeric(name.front())) {
    // "-rf" reads as an option to a command given the name; "." and ".." as directories.
    return absl::InvalidArgumentError(absl::StrCat(
        field, " must start with a letter or a digit, got ", QuotePathForMessage(name)));
  }
  return absl::OkStatus();
}

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
  // Newlines forge log lines and bidirectional overrides make a name display as another.
  RETURN_IF_ERROR(CheckTextCharacters(field_view, path));
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
