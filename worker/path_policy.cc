#include "worker/path_policy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/path_rules.h"
#include "common/status_macros.h"

namespace mptrain {
namespace {

// Debian's abseil is built with its own absl::string_view, which does not convert implicitly.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// realpath(3) without a fixed-size buffer. On failure returns errno's value.
absl::StatusOr<std::string> RealPath(const std::string& path, int* error) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) {
    *error = errno;
    return absl::ErrnoToStatus(*error, "realpath");
  }
  std::string out(resolved);
  ::free(resolved);
  return out;
}

std::string JoinPath(std::string_view dir, std::string_view name) {
  if (dir == "/") return absl::StrCat("/", AsAbsl(name));
  return absl::StrCat(AsAbsl(dir), "/", AsAbsl(name));
}

// What a file is, for messages.
const char* FileTypeName(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "of an unknown type";
}

// Directories no root may be: the whole file system, the system's own trees (a job writing there
// as root would own the machine; reading there would leak its secrets) and the homes of every
// user. Checked on the resolved path, so a symbolic link to one is refused too.
absl::Status CheckNotSystemDirectory(std::string_view flag, const std::string& given,
                                     const std::string& resolved) {
  // At or under these.
  static constexpr const char* kSystemTrees[] = {"/etc", "/proc", "/sys",  "/dev",
                                                 "/boot", "/usr", "/bin",  "/sbin",
                                                 "/lib",  "/lib32", "/lib64", "/libx32",
                                                 "/run",  "/var/run"};
  // Exactly these (a dedicated directory below one is fine: /var/lib/mptrain, /home/ml/data).
  static constexpr const char* kSystemDirectories[] = {"/",    "/root", "/home", "/var",
                                                       "/tmp", "/srv",  "/opt",  "/mnt",
                                                       "/media", "/var/lib", "/var/tmp"};
  bool refused = false;
  for (const char* tree : kSystemTrees) refused |= IsUnderRoot(resolved, tree);
  for (const char* directory : kSystemDirectories) refused |= resolved == directory;
  if (!refused) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      AsAbsl(flag), " ", QuotePathForMessage(given),
      given == resolved ? "" : absl::StrCat(" (", QuotePathForMessage(resolved), ")"),
      " is a system directory; a root must be a directory of its own, e.g. /srv/mptrain/data "
      "(ranks run as this worker's user and would read or write everything below it)"));
}

// Resolves the roots named by one flag; see PathPolicy::Create.
absl::StatusOr<std::vector<PathPolicy::Root>> ResolveRoots(std::string_view flag,
                                                           const std::vector<std::string>& roots) {
  if (roots.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("at least one ", AsAbsl(flag), " is required"));
  }
  std::vector<PathPolicy::Root> out;
  for (const std::string& root : roots) {
    RETURN_IF_ERROR(CheckPathSyntax(flag, root));
    int error = 0;
    absl::StatusOr<std::string> resolved = RealPath(root, &error);
    if (!resolved.ok()) {
      // Always INVALID_ARGUMENT: the operator's flag is wrong, whatever errno says.
      if (error == ENOENT) {
        return absl::InvalidArgumentError(
            absl::StrCat(AsAbsl(flag), " ", QuotePathForMessage(root), " does not exist"));
      }
      return absl::InvalidArgumentError(absl::StrCat(AsAbsl(flag), " ", QuotePathForMessage(root),
                                                     " cannot be resolved: ", strerror(error)));
    }
    struct stat st;
    if (::stat(resolved->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(AsAbsl(flag), " ", QuotePathForMessage(root), " is not a directory"));
    }
    RETURN_IF_ERROR(CheckNotSystemDirectory(flag, root, *resolved));
    out.push_back({NormalizePath(root), *std::move(resolved)});
  }
  return out;
}

std::vector<std::string> Given(const std::vector<PathPolicy::Root>& roots) {
  std::vector<std::string> out;
  for (const PathPolicy::Root& root : roots) out.push_back(root.given);
  return out;
}

std::vector<std::string> Resolved(const std::vector<PathPolicy::Root>& roots) {
  std::vector<std::string> out;
  for (const PathPolicy::Root& root : roots) out.push_back(root.resolved);
  return out;
}

// Lexically under a root, either as the flag spelled it or as it resolved: a spec may name a file
// through the root's symbolic link (/tmp/x/f) or through its target (/private/tmp/x/f).
bool LexicallyUnder(const std::string& path, const std::vector<PathPolicy::Root>& roots) {
  return IsUnderAnyRoot(path, Given(roots)) || IsUnderAnyRoot(path, Resolved(roots));
}

absl::Status OutsideRoots(std::string_view field, const std::string& path,
                          std::string_view scope_name, const std::vector<PathPolicy::Root>& roots,
                          const std::optional<Tenancy>& tenancy = std::nullopt) {
  if (tenancy.has_value()) {
    return absl::PermissionDeniedError(absl::StrCat(
        AsAbsl(field), " ", QuotePathForMessage(path), " is outside ", tenancy->principal,
        "'s part of the worker's ", AsAbsl(scope_name), " roots ",
        DescribeRoots(Resolved(roots)), " (", DescribeTenancyRule(*tenancy), ")"));
  }
  return absl::PermissionDeniedError(absl::StrCat(AsAbsl(field), " ", QuotePathForMessage(path),
                                                  " is outside the worker's ", AsAbsl(scope_name),
                                                  " roots ", DescribeRoots(Resolved(roots))));
}

absl::Status ThroughSymlink(std::string_view field, const std::string& path,
                            std::string_view scope_name) {
  return absl::PermissionDeniedError(
      absl::StrCat(AsAbsl(field), " ", QuotePathForMessage(path), " resolves outside the worker's ",
                   AsAbsl(scope_name), " roots through a symbolic link"));
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Rule c: resolves `dir`, the directory of `path` (which is lexically under `roots`), and checks
// that it really is a directory inside a resolved root.
absl::StatusOr<std::string> ResolveDirectory(std::string_view field, const std::string& path,
                                             const std::string& dir,
                                             const std::vector<PathPolicy::Root>& roots,
                                             std::string_view scope_name) {
  const absl::string_view f = AsAbsl(field);
  const std::vector<std::string> resolved_roots = Resolved(roots);
  const auto not_a_directory = [&](const std::string& which) {
    return absl::InvalidArgumentError(
        absl::StrCat("directory ", QuotePathForMessage(which), " of ", f, " is not a directory"));
  };
  int error = 0;
  absl::StatusOr<std::string> resolved = RealPath(dir, &error);
  if (resolved.ok()) {
    if (!IsUnderAnyRoot(*resolved, resolved_roots)) return ThroughSymlink(field, path, scope_name);
    // realpath() accepts a regular file too; only now, inside a root, may the answer say so.
    struct stat st;
    if (::stat(resolved->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return not_a_directory(dir);
    return *std::move(resolved);
  }
  if (error != ENOENT && error != ENOTDIR) {
    return absl::ErrnoToStatus(error, absl::StrCat("directory ", QuotePathForMessage(dir), " of ",
                                                   f, " cannot be resolved"));
  }

  // Something along the way is missing. Saying "does not exist" straight away would tell whether a
  // path exists outside the roots when a symbolic link inside leads there, so find the deepest
  // ancestor that resolves and judge the component below it.
  std::string child = dir;
  std::string ancestor;
  absl::StatusOr<std::string> resolved_ancestor;
  do {
    ancestor = Dirname(child);
    if (!LexicallyUnder(ancestor, roots)) {
      // Climbed past the root: the root itself has gone since Create.
      return absl::FailedPreconditionError(absl::StrCat(f, " ", QuotePathForMessage(path),
                                                        ": the worker's ", AsAbsl(scope_name),
                                                        " root holding it no longer exists"));
    }
    resolved_ancestor = RealPath(ancestor, &error);
    if (!resolved_ancestor.ok()) child = ancestor;
  } while (!resolved_ancestor.ok());
  if (!IsUnderAnyRoot(*resolved_ancestor, resolved_roots)) {
    return ThroughSymlink(field, path, scope_name);
  }
  struct stat st;
  if (::stat(resolved_ancestor->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return not_a_directory(ancestor);
  }
  const std::string next = JoinPath(*resolved_ancestor, child.substr(child.rfind('/') + 1));
  if (::lstat(next.c_str(), &st) == 0) {
    // A dangling symbolic link, or a loop: where it leads is unknown, so it counts as leading out.
    if (S_ISLNK(st.st_mode)) return ThroughSymlink(field, path, scope_name);
    if (!S_ISDIR(st.st_mode)) return not_a_directory(child);
  }
  return absl::NotFoundError(
      absl::StrCat("directory ", QuotePathForMessage(dir), " of ", f, " does not exist"));
}

// A missing directory `what` that mkdir could not create in `parent`: the status says why, with
// the code of the cause (not every failure is a permission problem).
absl::Status CannotCreate(int error, const std::string& what, const std::string& parent) {
  const std::string in = QuotePathForMessage(parent);
  switch (error) {
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(absl::StrCat(
          what, " does not exist and this worker (uid ", ::geteuid(),
          ") may not create it: no write permission in ", in));
    case EROFS:
      return absl::FailedPreconditionError(absl::StrCat(
          what, " does not exist and cannot be created: ", in, " is on a read-only file system"));
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " does not exist and cannot be created: no space left in ", in));
    case ENOENT:
      // The directory it goes in vanished between its check and the mkdir.
      return absl::FailedPreconditionError(
          absl::StrCat(what, " cannot be created: ", in, " was removed meanwhile"));
    default:
      return absl::ErrnoToStatus(
          error, absl::StrCat(what, " does not exist and cannot be created in ", in));
  }
}

}  // namespace

PathPolicy::PathPolicy(std::vector<Root> data, std::vector<Root> output)
    : data_(std::move(data)),
      output_(std::move(output)),
      data_roots_(Resolved(data_)),
      output_roots_(Resolved(output_)) {}

absl::StatusOr<PathPolicy> PathPolicy::ForTenancy(const Tenancy& tenancy) const {
  if (!tenancy.confined()) return *this;
  RETURN_IF_ERROR(CheckPrincipalPathName("the job's owner", tenancy.principal));
  std::vector<Root> parts;
  std::vector<Root> whole;
  for (const Root& root : output_) {
    const std::string part = JoinPath(root.resolved, tenancy.principal);
    // A root this worker cannot write in (read-only, another user's) leaves the part missing:
    // writes there then fail naming the directory, and a job that writes nothing still runs.
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST && errno != EACCES &&
        errno != EPERM && errno != EROFS) {
      const int mkdir_error = errno;
      return absl::FailedPreconditionError(
          absl::StrCat(tenancy.principal, "'s part ", QuotePathForMessage(part),
                       " of the output root cannot be created: ", strerror(mkdir_error)));
    }
    struct stat st;
    if (::lstat(part.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      // A link could lead into another principal's part (or anywhere): never followed.
      return absl::FailedPreconditionError(
          absl::StrCat(tenancy.principal, "'s part ", QuotePathForMessage(part),
                       " of the output root exists and is not a directory (it is ",
                       FileTypeName(st.st_mode), "); the worker's operator must remove it"));
    }
    // The marker tells the part from a directory of data when a data root overlaps an output
    // root: reads of other principals stay out of it (CheckNotAnotherPrincipals).
    if (::lstat(part.c_str(), &st) == 0) {
      const std::string marker = JoinPath(part, kPrincipalPartMarker);
      const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                            0644);
      if (fd >= 0) {
        const std::string text = tenancy.principal + "\n";
        [[maybe_unused]] const ssize_t written = ::write(fd, text.data(), text.size());
        ::close(fd);
      }
    }
    parts.push_back({PrincipalPart(root.given, tenancy.principal), part});
    whole.push_back(root);
  }
  PathPolicy confined(data_, std::move(parts));
  confined.tenancy_ = tenancy;
  confined.whole_output_roots_ = std::move(whole);
  return confined;
}

absl::Status PathPolicy::CheckNotAnotherPrincipals(std::string_view field,
                                                   const std::string& path) const {
  if (!tenancy_.has_value()) return absl::OkStatus();
  bool foreign = false;
  for (const Root& root : whole_output_roots_) {
    for (const std::string* form : {&root.given, &root.resolved}) {
      const std::string part = PartDirectoryOf(path, *form);
      if (part.empty() || part == tenancy_->principal) continue;
      // Whether that directory is someone's part: its marker, seen without following links.
      const std::string marker =
          JoinPath(JoinPath(root.resolved, part), kPrincipalPartMarker);
      struct stat st;
      foreign |= ::lstat(marker.c_str(), &st) == 0;
    }
  }
  if (!foreign) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      AsAbsl(field), " ", QuotePathForMessage(path),
      " lies in the output roots outside ", tenancy_->principal, "'s part (",
      DescribeTenancyRule(*tenancy_), ")"));
}

absl::StatusOr<PathPolicy> PathPolicy::Create(const std::vector<std::string>& data_roots,
                                              const std::vector<std::string>& output_roots) {
  ASSIGN_OR_RETURN(std::vector<Root> data, ResolveRoots("--data_root", data_roots));
  ASSIGN_OR_RETURN(std::vector<Root> output, ResolveRoots("--output_root", output_roots));
  return PathPolicy(std::move(data), std::move(output));
}

std::vector<PathPolicy::Root> PathPolicy::RootsFor(bool data, bool output) const {
  std::vector<Root> out;
  if (data) out.insert(out.end(), data_.begin(), data_.end());
  if (output) out.insert(out.end(), output_.begin(), output_.end());
  return out;
}

absl::StatusOr<std::string> PathPolicy::CheckRead(std::string_view field, const std::string& path,
                                                  ReadScope scope) const {
  if (scope == ReadScope::kData) {
    return CheckFile(field, path, RootsFor(true, false), "data", /*for_write=*/false,
                     /*overwrite=*/false);
  }
  return CheckFile(field, path, RootsFor(true, true), "data or output", /*for_write=*/false,
                   /*overwrite=*/false);
}

absl::StatusOr<std::string> PathPolicy::CheckWrite(std::string_view field, const std::string& path,
                                                   bool overwrite) const {
  return CheckFile(field, path, RootsFor(false, true), "output", /*for_write=*/true, overwrite);
}

absl::StatusOr<std::string> PathPolicy::CheckFile(std::string_view field, const std::string& path,
                                                  const std::vector<Root>& roots,
                                                  std::string_view scope_name, bool for_write,
                                                  bool overwrite) const {
  const absl::string_view f = AsAbsl(field);
  const std::string quoted = QuotePathForMessage(path);

  // a. Syntax.
  RETURN_IF_ERROR(CheckPathSyntax(field, path));
  const std::string normalized = NormalizePath(path);

  // b. Lexical, before any filesystem call: the answer for a path outside the roots must not say
  // whether it exists.
  if (!LexicallyUnder(normalized, roots)) {
    return OutsideRoots(field, path, scope_name, roots,
                        for_write ? tenancy_ : std::optional<Tenancy>());
  }
  if (!for_write) RETURN_IF_ERROR(CheckNotAnotherPrincipals(field, normalized));
  // A root itself is a directory; saying so here avoids resolving its parent, which lies outside.
  for (const Root& root : roots) {
    if (normalized == root.given || normalized == root.resolved) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, " ", quoted, " names a root directory, not a file"));
    }
  }

  // c. The directory must exist and really be inside a root, so a symbolic link in the middle
  // cannot lead out.
  const size_t slash = normalized.rfind('/');
  const std::string parent = slash == 0 ? "/" : normalized.substr(0, slash);
  const std::string name = normalized.substr(slash + 1);
  ASSIGN_OR_RETURN(const std::string resolved_parent,
                   ResolveDirectory(field, path, parent, roots, scope_name));

  // d. The file itself, with lstat only: never follow a final symbolic link (it could be swapped
  // later, or point anywhere), and never open a FIFO or device just to learn what it is.
  const std::string resolved = JoinPath(resolved_parent, name);
  // Through a link in the middle, a read could still land in another principal's part.
  if (!for_write) RETURN_IF_ERROR(CheckNotAnotherPrincipals(field, resolved));
  struct stat st;
  if (::lstat(resolved.c_str(), &st) != 0) {
    const int lstat_error = errno;
    if (lstat_error == ENOENT) {
      if (for_write) return resolved;
      return absl::NotFoundError(absl::StrCat(f, " ", quoted, " does not exist"));
    }
    return absl::ErrnoToStatus(lstat_error, absl::StrCat(f, " ", quoted, " cannot be examined"));
  }
  if (S_ISLNK(st.st_mode)) {
    return absl::PermissionDeniedError(
        absl::StrCat(f, " ", quoted, " is a symbolic link; name the file it points to instead"));
  }
  if (!S_ISREG(st.st_mode)) {
    if (for_write) {
      return absl::InvalidArgumentError(absl::StrCat(f, " ", quoted,
                                                     " exists and is not a regular file (it is ",
                                                     FileTypeName(st.st_mode), ")"));
    }
    return absl::InvalidArgumentError(absl::StrCat(f, " ", quoted, " is not a regular file (it is ",
                                                   FileTypeName(st.st_mode), ")"));
  }
  if (for_write && !overwrite) {
    return absl::AlreadyExistsError(
        absl::StrCat(f, " ", quoted, " already exists; set overwrite_output: true to replace it"));
  }

  // e.
  return resolved;
}

absl::StatusOr<std::string> PathPolicy::CheckOutputDirectory(std::string_view field,
                                                             const std::string& path) const {
  const absl::string_view f = AsAbsl(field);
  RETURN_IF_ERROR(CheckPathSyntax(field, path));
  const std::string normalized = NormalizePath(path);

  // Lexical, before any filesystem call. The longest matching root leaves the fewest components
  // to walk.
  const Root* start = nullptr;
  size_t prefix = 0;
  for (const Root& root : output_) {
    for (const std::string* form : {&root.given, &root.resolved}) {
      if (IsUnderRoot(normalized, *form) && (start == nullptr || form->size() > prefix)) {
        start = &root;
        prefix = form->size();
      }
    }
  }
  if (start == nullptr) return OutsideRoots(field, path, "output", output_, tenancy_);

  // The root itself must still be there: mkdir -p never creates anything above or at a root.
  struct stat root_stat;
  if (::stat(start->resolved.c_str(), &root_stat) != 0 || !S_ISDIR(root_stat.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        f, " ", QuotePathForMessage(path), ": the worker's output root ",
        QuotePathForMessage(start->resolved), " holding it no longer exists"));
  }

  // Walk down from the resolved root one component at a time. Every directory is resolved and
  // checked before anything is created in it, so mkdir only ever runs inside an output root.
  std::string current = start->resolved;
  const std::string rest = normalized.substr(prefix);
  for (absl::string_view component : absl::StrSplit(rest, '/', absl::SkipEmpty())) {
    const std::string next = JoinPath(current, std::string(component));
    const std::string what = absl::StrCat("directory ", QuotePathForMessage(next), " of ", f);
    struct stat st;
    if (::lstat(next.c_str(), &st) != 0) {
      const int lstat_error = errno;
      if (lstat_error != ENOENT) {
        return absl::ErrnoToStatus(lstat_error, absl::StrCat(what, " cannot be examined"));
      }
      // EEXIST: created by someone else meanwhile; it is resolved and checked below like any
      // existing entry.
      if (::mkdir(next.c_str(), 0755) != 0 && errno != EEXIST) {
        const int mkdir_error = errno;
        return CannotCreate(mkdir_error, what, current);
      }
      if (::lstat(next.c_str(), &st) != 0) {
        const int relstat_error = errno;
        return absl::ErrnoToStatus(relstat_error, absl::StrCat(what, " cannot be examined"));
      }
    }
    if (!S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " exists and is not a directory (it is ", FileTypeName(st.st_mode), ")"));
    }
    int error = 0;
    absl::StatusOr<std::string> resolved = RealPath(next, &error);
    if (!resolved.ok()) {
      // Only a symbolic link can fail here (a dangling one, or a loop); where it points is
      // unknown, so it is treated like one that leads out.
      return ThroughSymlink(field, path, "output");
    }
    if (!IsUnderAnyRoot(*resolved, output_roots_)) return ThroughSymlink(field, path, "output");
    struct stat target;
    if (::stat(resolved->c_str(), &target) != 0 || !S_ISDIR(target.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " is a symbolic link to something that is not a directory"));
    }
    current = *std::move(resolved);
  }

  // Re-check the end result as a whole: the root itself could have been replaced since Create.
  int error = 0;
  absl::StatusOr<std::string> final_dir = RealPath(current, &error);
  if (!final_dir.ok()) {
    return absl::ErrnoToStatus(
        error, absl::StrCat(f, " ", QuotePathForMessage(path), " cannot be resolved"));
  }
  if (!IsUnderAnyRoot(*final_dir, output_roots_)) return ThroughSymlink(field, path, "output");
  return *final_dir;
}

}  // namespace mptrain
