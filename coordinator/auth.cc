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
    case Role::kViewer: return "viewer";
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
    } else if (fields[0] == "viewer") {
      entry.principal.role = Role::kViewer;
    } else if (fields[0] == "worker") {
      entry.principal.role = Role::kWorker;
    } else {
      return bad(absl::StrCat("role must be admin, user, viewer or worker, got \"",
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
  if (absl::ConsumePrefix(&method, "/mptrain.v1.Coordinator/")) {
    // The reads, by name: a method added later changes state until it is listed here.
    for (absl::string_view read :
         {"GetJob", "ListJobs", "ListWorkers", "WatchJob", "GetJobEvents", "GetRankLog"}) {
      if (method == read) return MethodAccess::kUserRead;
    }
    return MethodAccess::kUserWrite;
  }
  // Server reflection shows the schema (grpcurl); the HTTP pages and /metrics show jobs (every
  // route but the login form is a read; the form only checks a token).
  if (absl::StartsWith(method, "/grpc.reflection.v1alpha.ServerReflection/")) {
    return MethodAccess::kUserRead;
  }
  if (absl::StartsWith(method, kHttpMethodPrefix)) return MethodAccess::kUserRead;
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
  const Role role = principal->role;
  absl::string_view needed;
  switch (access) {
    case MethodAccess::kUserRead:
      if (role == Role::kAdmin || role == Role::kUser || role == Role::kViewer) {
        return absl::OkStatus();
      }
      needed = "user, viewer or admin";
      break;
    case MethodAccess::kUserWrite:
      if (role == Role::kAdmin || role == Role::kUser) return absl::OkStatus();
      needed = "user or admin";
      break;
    case MethodAccess::kWorker:
      if (role == Role::kWorker) return absl::OkStatus();
      needed = "worker";
      break;
    default:
      return absl::PermissionDeniedError(absl::StrCat("no role may call ", method_name));
  }
  return absl::PermissionDeniedError(absl::StrCat(principal->name, " (role ", RoleName(role),
                                                  ") may not call ", method_name,
                                                  "; it needs the role ", needed));
}

CallerIdentity Authenticator::Identify(absl::string_view authorization) const {
  if (!enabled()) return {"anonymous", /*admin=*/true, /*reads_all_jobs=*/true};
  const Principal* principal = PrincipalOf(authorization);
  if (principal == nullptr) return {};
  CallerIdentity caller;
  caller.principal = principal->name;
  caller.admin = principal->role == Role::kAdmin;
  caller.reads_all_jobs = caller.admin || principal->role == Role::kViewer;
  return caller;
}

CallerIdentity Authenticator::Identify(const grpc::ServerContextBase& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  return Identify(it == metadata.end()
                      ? absl::string_view()
                      : absl::string_view(it->second.data(), it->second.size()));
}

absl::Status CheckWorkerName(absl::string_view name,
                             const std::optional<std::string>& token_principal,
                             const std::optional<std::string>& certificate_name) {
  const std::string asked(TruncateForError(name, 128));
  if (token_principal.has_value() && *token_principal != name) {
    return absl::PermissionDeniedError(absl::StrCat(
        "a worker registers under its token's principal: this token is worker ",
        TruncateForError(*token_principal, 64), "'s, not ", asked,
        " (give each worker its own `worker NAME TOKEN` line)"));
  }
  if (certificate_name.has_value() && *certificate_name != name) {
    return absl::PermissionDeniedError(absl::StrCat(
        "a worker registers under its client certificate's subject CN: this certificate is \"",
        TruncateForError(*certificate_name, 64), "\"'s, not ", asked,
        " (give each worker its own certificate, CN = its --name)"));
  }
  return absl::OkStatus();
}

absl::Status Authenticator::CheckWorkerCaller(const grpc::ServerContextBase& context,
                                              absl::string_view name) const {
  std::optional<std::string> token_principal;
  if (enabled()) token_principal = Identify(context).principal;
  // gRPC puts a client certificate it verified (mutual TLS) and its subject CN here. A
  // certificate without a CN names no worker (""), rather than leaving the name unchecked.
  std::optional<std::string> certificate_name;
  if (std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
      auth != nullptr && !auth->FindPropertyValues("x509_pem_cert").empty()) {
    std::vector<grpc::string_ref> names = auth->FindPropertyValues("x509_common_name");
    certificate_name =
        names.empty() ? std::string() : std::string(names.front().data(), names.front().size());
  }
  return CheckWorkerName(name, token_principal, certificate_name);
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
