#include "common/token_file_pattern.h"

#include "absl/strings/str_cat.h"
#include "common/path_rules.h"

namespace mptrain {
namespace {

std::string LastComponent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

bool IsTokenFilePattern(const std::string& path) {
  return LastComponent(path).find_first_of("*?") != std::string::npos;
}

absl::Status CheckTokenFileEntry(const std::string& field, const std::string& path) {
  if (absl::Status status = CheckPathSyntax(field, path); !status.ok()) return status;
  const size_t slash = path.find_last_of('/');
  const std::string directory = path.substr(0, slash == std::string::npos ? 0 : slash);
  if (directory.find_first_of("*?[") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " may hold the wildcards * and ? in its last component only, got ",
                     QuotePathForMessage(path)));
  }
  if (IsTokenFilePattern(path) && LastComponent(path).find_first_of("[\\") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": a pattern's wildcards are * and ? only ('[' and '\\' are refused), got ",
        QuotePathForMessage(path)));
  }
  return absl::OkStatus();
}

}  // namespace mptrain
