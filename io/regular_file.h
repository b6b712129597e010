#pragma once

// Opening and reading files that may be hostile, shared by the readers of io/: regular files
// only (a directory, FIFO or device is refused without blocking), never through a symbolic link
// as the last component, every read checked against the size fstat gave, and no exception
// escaping.

#include <unistd.h>

#include <cstdint>
#include <cstddef>
#include <exception>
#include <functional>
#include <new>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace mptrain {

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

struct RegularFile {
  ScopedFd fd;
  uint64_t size = 0;
};

// NOT_FOUND (missing), PERMISSION_DENIED (a symbolic link), INVALID_ARGUMENT (not a regular
// file, naming what it is); each message starts with `path`.
absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path);
// The same for `name` in the directory `dir_fd` is open on (AT_FDCWD: the working directory);
// messages name `path`.
absl::StatusOr<RegularFile> OpenRegularFileAt(int dir_fd, const std::string& name,
                                              const std::string& path);

// Reads exactly `size` bytes at `offset`. The caller has checked them against the file's size,
// so running out means that the file shrank while it was read (INVALID_ARGUMENT).
absl::Status ReadAt(const RegularFile& file, const std::string& path, uint64_t offset, void* out,
                    uint64_t size);

// An O_DIRECTORY descriptor of `directory` (the caller closes it), or -1 with *error set (an
// errno); with `no_symlinks`, an absolute `directory` is reached from "/" one component at a
// time with O_NOFOLLOW (*error ELOOP when a component is a symbolic link).
int OpenDirectory(const std::string& directory, bool no_symlinks, int* error);

// The directory part of `path` ("." for a bare name, "/" for a file in the root).
std::string DirectoryOf(const std::string& path);

// Receives the bytes of a file being written; false when the write failed (errno set).
using WriteBytes = std::function<bool(const void* data, size_t size)>;

// Writes `path` atomically: `contents` writes the whole file under a temporary name in the same
// directory (<name>.tmp.<pid>, O_NOFOLLOW), which is fsync'ed and renamed over `path`, so that a
// reader sees the old file or the new one, never half of one. Everything happens relative to
// the directory opened once; with `no_symlinks` it is reached from "/" without following a
// symbolic link (OpenDirectory), so a directory swapped for a link after the path was resolved
// cannot redirect the write (PERMISSION_DENIED). `replace_existing = false`: ALREADY_EXISTS
// when `path` exists (the rename is renameat2(RENAME_NOREPLACE), so two writers cannot both
// win). The rename replaces a symbolic link at `path` itself, never its target. Errors:
// the errno's code naming the path (the directory when there is no write permission),
// DATA_LOSS when writing or renaming failed.
absl::Status WriteFileAtomically(const std::string& path, bool replace_existing, bool no_symlinks,
                                 const std::function<bool(const WriteBytes&)>& contents);

// Runs `fn`, turning an exception (an allocation the size of a huge but genuine file is the only
// one expected) into a status naming `path`, so that nothing escapes to terminate the rank.
template <typename Fn>
auto NoThrow(const std::string& path, Fn fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": out of memory"));
  } catch (const std::exception&) {
    // Not e.what(): a JSON parser's or encoder's message quotes the bytes it refused.
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": malformed contents (refused by a parser or encoder)"));
  }
}

}  // namespace mptrain
