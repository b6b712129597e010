#pragma once

// Where a job may write and read, by who submitted it (issue: tenants must not touch each other's
// files). Every output root is split by principal: a job of principal P writes only under
// `<output root>/P/`, and reads nothing under an output root outside that part (another
// principal's checkpoints are theirs, even where a data root overlaps an output root). An
// admin's job (and every job when authentication is off: the caller is then the admin
// "anonymous") is not confined to a part.
//
// Pure and lexical: the coordinator uses these at submit time against the roots workers report,
// and worker/path_policy.h applies the same rule to the resolved paths on the worker.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace mptrain {

// Which part of the output roots a job's files belong to.
struct Tenancy {
  std::string principal;  // The job's owner.
  bool admin = false;     // An admin's job: the whole roots.

  bool confined() const { return !admin; }
};

// A principal name is a path component here: 1 to 64 characters of [A-Za-z0-9._@-], and not
// "." or "..". INVALID_ARGUMENT naming `field` otherwise.
absl::Status CheckPrincipalPathName(std::string_view field, std::string_view principal);

// `root`/`principal`, normalized (the principal passes CheckPrincipalPathName).
std::string PrincipalPart(std::string_view root, std::string_view principal);

// The parts of `roots` that `tenancy` writes in: the roots themselves for an admin, else each
// root's PrincipalPart.
std::vector<std::string> WritableRoots(const std::vector<std::string>& output_roots,
                                       const Tenancy& tenancy);

// Whether a job of `tenancy` may write `path` (lexically): under one of WritableRoots.
bool MayWrite(std::string_view path, const std::vector<std::string>& output_roots,
              const Tenancy& tenancy);

// The directory of an output root that `path` lies in (its first component below `root`), or
// "" when `path` is not under `root` or lies directly in it. A read under an output root is
// refused when that directory is another principal's part (worker/path_policy.h: parts carry
// a marker file, so that a data root may be the same directory as an output root).
std::string PartDirectoryOf(std::string_view path, std::string_view root);

// The marker file in a principal's part: its name, and what it holds (the principal).
inline constexpr char kPrincipalPartMarker[] = ".mptrain-principal";

// The rule, for messages: "each principal writes only under <output root>/<principal>/".
std::string DescribeTenancyRule(const Tenancy& tenancy);

}  // namespace mptrain
