#include "common/tenant_paths.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/path_rules.h"

namespace mptrain {
namespace {

absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

absl::Status CheckPrincipalPathName(std::string_view field, std::string_view principal) {
  bool valid = !principal.empty() && principal.size() <= 64 && principal != "." &&
               principal != "..";
  for (char c : principal) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' &&
        c != '@' && c != '-') {
      valid = false;
    }
  }
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(AsAbsl(field), " must be 1 to 64 characters of [A-Za-z0-9._@-] and not "
                                  "'.' or '..' (it names a directory of each output root)"));
}

std::string PrincipalPart(std::string_view root, std::string_view principal) {
  return NormalizePath(absl::StrCat(AsAbsl(root), "/", AsAbsl(principal)));
}

std::vector<std::string> WritableRoots(const std::vector<std::string>& output_roots,
                                       const Tenancy& tenancy) {
  if (!tenancy.confined()) return output_roots;
  std::vector<std::string> parts;
  parts.reserve(output_roots.size());
  for (const std::string& root : output_roots) {
    parts.push_back(PrincipalPart(root, tenancy.principal));
  }
  return parts;
}

bool MayWrite(std::string_view path, const std::vector<std::string>& output_roots,
              const Tenancy& tenancy) {
  if (tenancy.confined() && !CheckPrincipalPathName("owner", tenancy.principal).ok()) {
    return false;
  }
  return IsUnderAnyRoot(path, WritableRoots(output_roots, tenancy));
}

std::string PartDirectoryOf(std::string_view path, std::string_view root) {
  if (!IsUnderRoot(path, root)) return "";
  const std::string normalized = NormalizePath(path);
  const std::string base = NormalizePath(root);
  const size_t start = base == "/" ? 1 : base.size() + 1;
  if (normalized.size() <= start) return "";  // The root itself.
  const size_t slash = normalized.find('/', start);
  if (slash == std::string::npos) return "";  // Directly in the root.
  return normalized.substr(start, slash - start);
}

std::string DescribeTenancyRule(const Tenancy& tenancy) {
  if (!tenancy.confined()) return "an admin's job writes anywhere under the output roots";
  return absl::StrCat("each principal writes only under <output root>/<principal>/, here ",
                      AsAbsl(tenancy.principal), "/, and reads nothing in another's");
}

}  // namespace mptrain
