#include "io/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>  // renameat2, RENAME_NOREPLACE (glibc >= 2.28 with _GNU_SOURCE).
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace mptrain {
namespace {

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

}  // namespace

absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path) {
  return OpenRegularFileAt(AT_FDCWD, path, path);
}

absl::StatusOr<RegularFile> OpenRegularFileAt(int dir_fd, const std::string& name,
                                              const std::string& path) {
  // O_NONBLOCK: opening a FIFO that has no writer returns at once instead of waiting for one
  // (it has no effect on the regular files we go on to read). O_NOFOLLOW: a link as the last
  // component fails with ELOOP rather than reading whatever it points to.
  int fd;
  do {
    fd = openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int error = errno;
    switch (error) {
      case ENOENT:
      case ENOTDIR:
        return absl::NotFoundError(absl::StrCat(path, ": no such file"));
      case ELOOP:
        return absl::PermissionDeniedError(absl::StrCat(path, ": is a symbolic link"));
      default:
        return absl::Status(absl::ErrnoToStatusCode(error),
                            absl::StrCat(path, ": cannot open: ", std::strerror(error)));
    }
  }
  RegularFile file{ScopedFd(fd), 0};
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    return absl::Status(absl::ErrnoToStatusCode(error),
                        absl::StrCat(path, ": cannot stat: ", std::strerror(error)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file (it is ", FileTypeName(st.st_mode), ")"));
  }
  file.size = static_cast<uint64_t>(st.st_size);
  return file;
}

// Reads exactly `size` bytes at `offset`. The caller has checked them against fstat's size, so
// running out means that the file shrank while we read it.
absl::Status ReadAt(const RegularFile& file, const std::string& path, uint64_t offset,
                    void* out, uint64_t size) {
  char* p = static_cast<char*>(out);
  while (size > 0) {
    const size_t chunk = size < (uint64_t{1} << 30) ? static_cast<size_t>(size) : size_t{1} << 30;
    const ssize_t n = pread(file.fd.get(), p, chunk, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      // No offset or size in these errors: they come from the file's header.
      return absl::Status(absl::ErrnoToStatusCode(error),
                          absl::StrCat(path, ": read failed: ", std::strerror(error)));
    }
    if (n == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": ended before its size at open; was it changed while being read?"));
    }
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}


// An O_DIRECTORY descriptor of `directory`, or -1 with *error set; with `no_symlinks`,
// reached from "/" one component at a time with O_NOFOLLOW (*error ELOOP when a component is a
// symbolic link).
int OpenDirectory(const std::string& directory, bool no_symlinks, int* error) {
  if (!no_symlinks || directory.empty() || directory[0] != '/') {
    const int fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) *error = errno;
    return fd;
  }
  int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    *error = errno;
    return -1;
  }
  for (absl::string_view component : absl::StrSplit(directory, '/', absl::SkipEmpty())) {
    const std::string part(component);
    const int next = openat(fd, part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) {
      *error = errno;
      // O_NOFOLLOW with O_DIRECTORY answers a symbolic link with ENOTDIR or ELOOP.
      struct stat link;
      if (*error == ENOTDIR && fstatat(fd, part.c_str(), &link, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISLNK(link.st_mode)) {
        *error = ELOOP;
      }
      close(fd);
      return -1;
    }
    close(fd);
    fd = next;
  }
  return fd;
}

std::string DirectoryOf(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteFileAtomically(const std::string& path, bool replace_existing, bool no_symlinks,
                                 const std::function<bool(const WriteBytes&)>& contents) {
  // Everything below is relative to the directory, opened once: with no_symlinks it is
  // reached component by component without following a symbolic link, so a directory swapped
  // for a link after the path was resolved cannot redirect the file.
  const std::string directory = DirectoryOf(path);
  const size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  int open_error = 0;
  const int dir = OpenDirectory(directory, no_symlinks, &open_error);
  if (dir < 0) {
    std::string why;
    if (open_error == ENOENT) why = absl::StrCat(" (directory ", directory, " does not exist)");
    if (open_error == ELOOP) {
      return absl::PermissionDeniedError(absl::StrCat(
          "cannot create ", path, ": a directory on its path is a symbolic link, and this "
          "write follows none"));
    }
    return absl::ErrnoToStatus(open_error, absl::StrCat("cannot create ", path, why));
  }
  struct DirCloser {
    int fd;
    ~DirCloser() { close(fd); }
  } dir_closer{dir};

  struct stat existing;
  if (!replace_existing &&
      fstatat(dir, name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0) {
    // Early, to spare writing a file that cannot be placed; the rename below decides.
    return absl::AlreadyExistsError(absl::StrCat(path, " exists"));
  }

  const std::string tmp_name = name + ".tmp." + std::to_string(getpid());
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = openat(dir, tmp_name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                  0644);
  if (fd < 0) {
    // The code of the cause: no permission is PERMISSION_DENIED naming the directory.
    const int error = errno;
    const std::string why = error == EACCES || error == EPERM
                                ? absl::StrCat(" (no write permission in ", directory, ")")
                                : "";
    return absl::ErrnoToStatus(error, absl::StrCat("cannot create ", tmp, why));
  }
  auto write_all = [&](const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      ssize_t n = write(fd, p, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      p += n;
      size -= n;
    }
    return true;
  };
  bool ok = contents(write_all);
  ok = ok && fsync(fd) == 0;
  ok = (close(fd) == 0) && ok;
  if (!ok) {
    const int error = errno;
    unlinkat(dir, tmp_name.c_str(), 0);
    return absl::DataLossError(absl::StrCat("writing ", tmp, " failed: ", std::strerror(error)));
  }
  int renamed;
  if (replace_existing) {
    renamed = renameat(dir, tmp_name.c_str(), dir, name.c_str());
  } else {
    renamed = renameat2(dir, tmp_name.c_str(), dir, name.c_str(), RENAME_NOREPLACE);
    if (renamed != 0 && (errno == EINVAL || errno == ENOSYS)) {
      // A filesystem without RENAME_NOREPLACE: link(2) also refuses an existing target.
      renamed = linkat(dir, tmp_name.c_str(), dir, name.c_str(), 0);
      if (renamed == 0) unlinkat(dir, tmp_name.c_str(), 0);
    }
  }
  if (renamed != 0) {
    const int error = errno;
    unlinkat(dir, tmp_name.c_str(), 0);
    if (error == EEXIST) return absl::AlreadyExistsError(absl::StrCat(path, " exists"));
    return absl::DataLossError(absl::StrCat("renaming ", tmp, " to ", path, " failed: ",
                                            std::strerror(error)));
  }
  fsync(dir);
  return absl::OkStatus();
}

}  // namespace mptrain
