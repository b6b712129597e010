#include "trainer/data/token_file_list.h"

#include <glob.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/path_rules.h"
#include "common/status_macros.h"
#include "common/token_file_pattern.h"
#include "trainer/data/token_shards.h"

namespace mptrain {
namespace {

absl::Status TooMany(const std::string& field) {
  return absl::InvalidArgumentError(absl::StrCat(field, " names more than ", kMaxTokenFiles,
                                                 " token files (after expanding patterns)"));
}

// glob(3)'s matches of `pattern`, sorted bytewise; at most kMaxTokenFiles of them.
absl::StatusOr<std::vector<std::string>> Glob(const std::string& field,
                                              const std::string& pattern) {
  glob_t matches{};
  const int result = glob(pattern.c_str(), GLOB_ERR | GLOB_NOSORT, nullptr, &matches);
  std::vector<std::string> paths;
  const bool too_many = result == 0 && matches.gl_pathc > static_cast<size_t>(kMaxTokenFiles);
  if (result == 0 && !too_many) paths.assign(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
  globfree(&matches);
  if (result == GLOB_NOMATCH) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", QuotePathForMessage(pattern), " matches no file"));
  }
  if (result != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " ", QuotePathForMessage(pattern), ": the pattern could not be matched (",
        result == GLOB_NOSPACE ? "out of memory" : "a directory could not be read", ")"));
  }
  if (too_many) return TooMany(field);
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandTokenFiles(const std::string& field,
                                                          const std::vector<std::string>& entries,
                                                          const CheckReadFunction& check_read) {
  if (entries.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must name at least one file"));
  }
  if (static_cast<int64_t>(entries.size()) > kMaxTokenFiles) return TooMany(field);
  std::vector<std::string> files;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string entry_field = absl::StrCat(field, "[", i, "]");
    const std::string& entry = entries[i];
    RETURN_IF_ERROR(CheckTokenFileEntry(entry_field, entry));
    if (!IsTokenFilePattern(entry)) {
      ASSIGN_OR_RETURN(std::string resolved, check_read(entry_field, entry));
      files.push_back(std::move(resolved));
      if (static_cast<int64_t>(files.size()) > kMaxTokenFiles) return TooMany(field);
      continue;
    }
    // The policy sees the pattern as a file first: outside the roots (lexically, or its
    // directory through a link) it is refused before glob lists anything. A file of that very
    // name is fine too (glob matches it).
    absl::StatusOr<std::string> as_file = check_read(entry_field, entry);
    if (!as_file.ok() && as_file.status().code() != absl::StatusCode::kNotFound) {
      return as_file.status();
    }
    ASSIGN_OR_RETURN(const std::vector<std::string> matches, Glob(entry_field, entry));
    if (static_cast<int64_t>(files.size() + matches.size()) > kMaxTokenFiles) {
      return TooMany(field);
    }
    for (const std::string& match : matches) {
      ASSIGN_OR_RETURN(std::string resolved, check_read(entry_field, match));
      files.push_back(std::move(resolved));
    }
  }
  return files;
}

}  // namespace mptrain
