#pragma once

// Who may call what. The coordinator's --token_file holds one `ROLE PRINCIPAL TOKEN` a line
// (roles: admin, user, viewer, worker; '#' starts a comment). Clients send
// `authorization: Bearer TOKEN`. The one check of every call is TokenAuthProcessor, which gRPC
// runs before any handler: UNAUTHENTICATED for a missing or unknown token, PERMISSION_DENIED
// for a role that may not call the method. Handlers that need the caller's name (the owner of
// a submitted job, whose jobs a read may show, the name a worker may register under) ask
// Authenticator::Identify.
//
// The roles: a user submits jobs and reads and cancels its own; a viewer (an operator's
// dashboard, Prometheus) reads every job and changes nothing; an admin does everything a user
// does, to every job; a worker calls WorkerControl only, registering under its principal's name
// (CheckWorkerName).
//
// Capabilities finer than roles (which worker, which rank of which attempt) are secrets handed
// out by the coordinator state itself: see WorkerRegistry and the rank secrets of assignments.

#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/server_context.h"

namespace mptrain {

enum class Role { kAdmin, kUser, kViewer, kWorker };

absl::string_view RoleName(Role role);

struct Principal {
  std::string name;
  Role role = Role::kUser;
};

class TokenTable {
 public:
  // `source` names the file in errors. INVALID_ARGUMENT names the line: an unknown role, a
  // principal outside [A-Za-z0-9._@-]{1,64}, a token shorter than 16 or longer than 256
  // characters or with spaces, a repeated token.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, const std::string& source);
  // Reads and parses a file of at most 1 MiB. NOT_FOUND / INVALID_ARGUMENT name the file.
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The principal holding `token`, or nullptr. Compares against every entry in constant time
  // per entry, so timing does not reveal how much of a guess was right.
  const Principal* Find(absl::string_view token) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string token;
    Principal principal;
  };
  std::vector<Entry> entries_;
};

// Which callers a method admits, by its full name ("/mptrain.v1.Coordinator/SubmitJob").
enum class MethodAccess {
  kPublic,     // No token needed (health checks).
  kUserRead,   // Roles user, viewer and admin: reads (a user's show its own jobs only).
  kUserWrite,  // Roles user and admin: submitting and cancelling jobs.
  kWorker,     // Role worker.
  kDenied,  // Unknown methods.
};
MethodAccess AccessFor(absl::string_view method);
// The HTTP server's requests are authorized as the method "/http" + path.
inline constexpr absl::string_view kHttpMethodPrefix = "/http/";

struct CallerIdentity {
  std::string principal;
  bool admin = false;
  bool reads_all_jobs = false;  // admin or viewer
};

// Whether a worker whose credentials are these may register under `name` (the name it asks
// for; the coordinator's "#N" of its worker id comes after). Each credential that names the
// worker must name exactly `name`: the worker token's principal (when tokens are on:
// `token_principal`), and the subject common name (CN) of its verified client certificate
// (with mutual TLS: `certificate_name`). Absent ones are not checked; quick-start mode (neither)
// admits any name. PERMISSION_DENIED names the rule and both names.
absl::Status CheckWorkerName(absl::string_view name,
                             const std::optional<std::string>& token_principal,
                             const std::optional<std::string>& certificate_name);

class Authenticator {
 public:
  // Without a table, authentication is off: every caller is the admin "anonymous".
  explicit Authenticator(std::optional<TokenTable> tokens) : tokens_(std::move(tokens)) {}

  bool enabled() const { return tokens_.has_value(); }

  // The gate: OK, UNAUTHENTICATED or PERMISSION_DENIED for a call of `method` with this
  // `authorization` header value (empty when absent).
  absl::Status Authorize(absl::string_view method, absl::string_view authorization) const;

  // The caller of an admitted call (its token was checked by Authorize already).
  CallerIdentity Identify(const grpc::ServerContextBase& context) const;
  // The same for an `authorization` header value (the HTTP server's requests).
  CallerIdentity Identify(absl::string_view authorization) const;

  // CheckWorkerName for the caller of `context`: its token (when tokens are on) and its
  // verified client certificate's CN (when it presented one: mutual TLS).
  absl::Status CheckWorkerCaller(const grpc::ServerContextBase& context,
                                 absl::string_view name) const;

 private:
  const Principal* PrincipalOf(absl::string_view authorization) const;

  std::optional<TokenTable> tokens_;
};

// gRPC's hook for Authorize: runs on every call before the handler, on TLS and on local
// (loopback) credentials. Never blocks.
class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(std::shared_ptr<const Authenticator> authenticator)
      : authenticator_(std::move(authenticator)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  std::shared_ptr<const Authenticator> authenticator_;
};

}  // namespace mptrain
