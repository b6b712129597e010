#include "coordinator/auth.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "common/secrets.h"
#include "common/small_file.h"

namespace mptrain {
namespace {

constexpr size_t kMaxTokenFileBytes = 1 << 20;
constexpr size_t kMinTokenLength = 16;
constexpr size_t kMaxTokenLength = 256;
constexpr absl::string_view kBearer = "Bearer ";

bool IsPrincipalName(absl::string_view name) {
  // A principal's name is also a directory of every output root (common/tenant_paths.h).
  if (name.empty() || name.size() > 64 || name == "." || name == "..") return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' &&
        c != '@' && c != '-') {
      return false;
    }
  }
  return true;
}

bool IsTokenText(absl::string_view token) {
  if (token.size() < kMinTokenLength || token.size() > kMaxTokenLength) return false;
  for (char c : token) {
    if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin: return "admin";
    case Role::kUser: return "user";
    case Role::kWorker: return "worker";
  }
  return "?";
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, const std::string& source) {
  TokenTable table;
  std::set<std::string> seen;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_number, ": ", what, " (want: ROLE PRINCIPAL TOKEN)"));
    };
    if (fields.size() != 3) return bad(absl::StrCat("expected 3 fields, got ", fields.size()));
    Entry entry;
    if (fields[0] == "admin") {
      entry.principal.role = Role::kAdmin;
    } else if (fields[0] == "user") {
      entry.principal.role = Role::kUser;
    } else if (fields[0] == "worker") {
      entry.principal.role = Role::kWorker;
    } else {
      return bad(absl::StrCat("role must be admin, user or worker, got \"",
                              TruncateForError(fields[0], 32), "\""));
    }
    if (!IsPrincipalName(fields[1])) {
      return bad("principal must be 1 to 64 characters of [A-Za-z0-9._@-], not '.' or '..'");
    }
    entry.principal.name = std::string(fields[1]);
    // The token itself is never echoed: the file is a secret.
    if (!IsTokenText(fields[2])) {
      return bad(absl::StrCat("token must be ", kMinTokenLength, " to ", kMaxTokenLength,
                              " printable characters"));
    }
    entry.token = std::string(fields[2]);
    if (!seen.insert(entry.token).second) return bad("this token is also on an earlier line");
    table.entries_.push_back(std::move(entry));
  }
  if (table.entries_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no tokens"));
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile("--token_file", path, kMaxTokenFileBytes);
  if (!text.ok()) return text.status();
  return Parse(*text, path);
}

const Principal* TokenTable::Find(absl::string_view token) const {
  const Principal* found = nullptr;
  for (const Entry& entry : entries_) {
    if (SecretsEqual(entry.token, token)) found = &entry.principal;
  }
  return found;
}

MethodAccess AccessFor(absl::string_view method) {
  if (absl::StartsWith(method, "/grpc.health.v1.Health/")) return MethodAccess::kPublic;
  if (absl::StartsWith(method, "/mptrain.v1.Coordinator/")) return MethodAccess::kUser;
  // Server reflection shows the schema (grpcurl); the HTTP pages and /metrics show jobs.
  if (absl::StartsWith(method, "/grpc.reflection.v1alpha.ServerReflection/")) {
    return MethodAccess::kUser;
  }
  if (absl::StartsWith(method, kHttpMethodPrefix)) return MethodAccess::kUser;
  if (absl::StartsWith(method, "/mptrain.v1.WorkerControl/")) return MethodAccess::kWorker;
  return MethodAccess::kDenied;
}

const Principal* Authenticator::PrincipalOf(absl::string_view authorization) const {
  if (!tokens_.has_value() || !absl::StartsWith(authorization, kBearer)) return nullptr;
  return tokens_->Find(absl::StripAsciiWhitespace(authorization.substr(kBearer.size())));
}

absl::Status Authenticator::Authorize(absl::string_view method,
                                      absl::string_view authorization) const {
  if (!enabled()) return absl::OkStatus();
  const MethodAccess access = AccessFor(method);
  if (access == MethodAccess::kPublic) return absl::OkStatus();
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "this coordinator requires a token: set --token_file or MPTRAIN_TOKEN");
  }
  const Principal* principal = PrincipalOf(authorization);
  if (principal == nullptr) return absl::UnauthenticatedError("unknown token");
  const std::string method_name(TruncateForError(method, 128));
  switch (access) {
    case MethodAccess::kUser:
      if (principal->role == Role::kAdmin || principal->role == Role::kUser) {
        return absl::OkStatus();
      }
      break;
    case MethodAccess::kWorker:
      if (principal->role == Role::kWorker) return absl::OkStatus();
      break;
    default:
      return absl::PermissionDeniedError(absl::StrCat("no role may call ", method_name));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      principal->name, " (role ", RoleName(principal->role), ") may not call ", method_name,
      "; it needs the role ", access == MethodAccess::kWorker ? "worker" : "user or admin"));
}

CallerIdentity Authenticator::Identify(const grpc::ServerContextBase& context) const {
  if (!enabled()) return {"anonymous", true};
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return {"", false};
  const Principal* principal =
      PrincipalOf(absl::string_view(it->second.data(), it->second.size()));
  if (principal == nullptr) return {"", false};
  return {principal->name, principal->role == Role::kAdmin};
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata, grpc::AuthContext*,
                                         OutputMetadata*, OutputMetadata*) {
  absl::string_view method, authorization;
  auto path = auth_metadata.find(":path");
  if (path != auth_metadata.end()) method = {path->second.data(), path->second.size()};
  auto header = auth_metadata.find("authorization");
  if (header != auth_metadata.end()) {
    authorization = {header->second.data(), header->second.size()};
  }
  return ToGrpcStatus(authenticator_->Authorize(method, authorization));
}

}  // namespace mptrain
