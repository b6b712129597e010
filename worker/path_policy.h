#pragma once

// Confines the files a job spec makes a worker read and write to directories the worker allows.
//
// Workers usually run as root, and a job spec names files the rank reads (features_path,
// targets_path, init_checkpoint, a resume checkpoint) and writes (output_checkpoint, files in
// checkpoint_dir). A hostile spec must not make a worker read /etc/shadow or overwrite a system
// file. Every check runs in this order, and every message names the spec field:
//   a. syntax (common/path_rules.h): absolute, no "." or ".." component   -> INVALID_ARGUMENT
//   b. lexically under a root of the scope, decided BEFORE any filesystem call, so a path outside
//      the roots gets the same answer whether it exists or not             -> PERMISSION_DENIED
//   c. the parent directory exists (NOT_FOUND) and its realpath is under a resolved root, so a
//      symbolic link in the middle cannot escape                           -> PERMISSION_DENIED
//   d. the final component, seen with lstat only (a FIFO is never opened): a symbolic link is
//      PERMISSION_DENIED; for reads it must be an existing regular file; for writes it may be
//      missing, or an existing regular file when overwriting.
//
// What this does not cover: the checks and the later open() are separate system calls, so someone
// who can already write inside a root could swap a component for a symbolic link in between. The
// threat here is the spec's author, who cannot; callers should still open the returned path with
// O_NOFOLLOW (and O_NONBLOCK for reads, then fstat) to close the last-component case.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tenant_paths.h"

namespace mptrain {

// Which roots a file to read may be under.
enum class ReadScope {
  kData,          // Training data and init checkpoints: the data roots only.
  kDataOrOutput,  // Resume checkpoints: these live under the output roots where an earlier job
                  // wrote them.
};

class PathPolicy {
 public:
  // Each root is resolved with realpath once, here; roots may themselves be symbolic links (/tmp is
  // one on some systems). INVALID_ARGUMENT naming the flag ("--data_root" / "--output_root") when a
  // list is empty, or a root is not an absolute path, does not exist or is not a directory, or
  // resolves to a system directory: /, or at or under /etc, /proc, /sys, /dev, /boot, /usr, /bin,
  // /sbin, /lib*, /run; or exactly /root, /home, /var, /var/lib, /var/tmp, /tmp, /srv, /opt,
  // /mnt, /media (a directory of its own below those is fine).
  static absl::StatusOr<PathPolicy> Create(const std::vector<std::string>& data_roots,
                                           const std::vector<std::string>& output_roots);

  // The same roots seen by a job of `tenancy` (common/tenant_paths.h): a confined job writes
  // only in its principal's part of each output root, `<root>/<principal>`, created here (mode
  // 0755, holding the marker kPrincipalPartMarker) when missing, and reads nothing in another
  // principal's part (a directory of an output root holding that marker; other directories
  // and files of a root that is also a data root stay readable). An admin's job: this policy
  // unchanged.
  // INVALID_ARGUMENT: the principal cannot name a directory. FAILED_PRECONDITION: a part exists
  // and is not a directory (a symbolic link included: it could lead into another's part), or
  // cannot be created (naming the root and errno).
  absl::StatusOr<PathPolicy> ForTenancy(const Tenancy& tenancy) const;

  // The roots after realpath, in the order given.
  const std::vector<std::string>& data_roots() const { return data_roots_; }
  const std::vector<std::string>& output_roots() const { return output_roots_; }

  // A file to read, named by spec field `field`. Returns the resolved path to open: realpath of
  // its directory + "/" + its name.
  // INVALID_ARGUMENT: bad syntax, or not a regular file (directory, FIFO, device, socket).
  // PERMISSION_DENIED: outside the scope's roots, lexically or through a symbolic link in the
  //   middle, or the file itself is a symbolic link.
  // NOT_FOUND: the directory or the file does not exist.
  // FAILED_PRECONDITION: the root holding it has been removed since Create.
  absl::StatusOr<std::string> CheckRead(std::string_view field, const std::string& path,
                                        ReadScope scope = ReadScope::kData) const;

  // A file to write under the output roots; its directory must exist. Returns the resolved path.
  // ALREADY_EXISTS: an existing regular file and !overwrite ("set overwrite_output: true to
  //   replace it").
  // INVALID_ARGUMENT: bad syntax, or an existing file that is not a regular file (always).
  // PERMISSION_DENIED / NOT_FOUND: as CheckRead, for the directory.
  absl::StatusOr<std::string> CheckWrite(std::string_view field, const std::string& path,
                                         bool overwrite) const;

  // A directory to write files into (checkpoint_dir), under the output roots. Missing components
  // are created (mkdir -p, mode 0755) one at a time, each only once its parent has been resolved
  // and found inside an output root, and the result is re-checked after creation; nothing is
  // ever created at or above a root. Symbolic links along the way are followed only while they
  // stay inside the output roots. Returns the resolved directory. Every error names the path:
  // INVALID_ARGUMENT: bad syntax.
  // PERMISSION_DENIED: outside the output roots, lexically or through a symbolic link (the same
  //   answer whether or not it exists); or missing, and this worker may not create it (EACCES,
  //   EPERM: "does not exist and this worker (uid N) may not create it: no write permission in
  //   D").
  // FAILED_PRECONDITION: a component exists and is not a directory (or is a link to something
  //   that is not); the output root holding it no longer exists; a read-only file system.
  // RESOURCE_EXHAUSTED: no space to create it. Other codes (from errno) otherwise.
  absl::StatusOr<std::string> CheckOutputDirectory(std::string_view field,
                                                   const std::string& path) const;

  // A root as the flag gave it (normalized, for the lexical check of paths written through it)
  // and after realpath (for every check after that). Public only for the helpers in the .cc.
  struct Root {
    std::string given;
    std::string resolved;
  };

 private:
  PathPolicy(std::vector<Root> data, std::vector<Root> output);

  // PERMISSION_DENIED when `path` (lexical or resolved) lies in another principal's part of the
  // output roots for this policy's tenancy.
  absl::Status CheckNotAnotherPrincipals(std::string_view field, const std::string& path) const;

  // The data roots, the output roots, or both (for ReadScope::kDataOrOutput).
  std::vector<Root> RootsFor(bool data, bool output) const;

  absl::StatusOr<std::string> CheckFile(std::string_view field, const std::string& path,
                                        const std::vector<Root>& roots, std::string_view scope_name,
                                        bool for_write, bool overwrite) const;

  std::vector<Root> data_;
  std::vector<Root> output_;
  std::vector<std::string> data_roots_;    // data_[i].resolved
  std::vector<std::string> output_roots_;  // output_[i].resolved
  // Set by ForTenancy for a confined job: the whole output roots, whose other principals' parts
  // (directories holding kPrincipalPartMarker) its reads must stay out of.
  std::optional<Tenancy> tenancy_;
  std::vector<Root> whole_output_roots_;
};

}  // namespace mptrain
