#include "common/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace mptrain {

absl::StatusOr<std::string> ReadSmallFile(const std::string& what, const std::string& path,
                                          size_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(what, " ", path, ": ", strerror(errno)));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": not a regular file"));
  }
  if (static_cast<size_t>(info.st_size) > max_bytes) {
    close(fd);
    // Not its size: the file may be one the caller may not read.
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": larger than the limit of ", max_bytes, " bytes"));
  }
  std::string text(static_cast<size_t>(info.st_size), '\0');
  size_t filled = 0;
  while (filled < text.size()) {
    const ssize_t n = read(fd, text.data() + filled, text.size() - filled);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": ", strerror(error)));
    }
    if (n == 0) break;  // Shrank while reading: take what is there.
    filled += static_cast<size_t>(n);
  }
  close(fd);
  text.resize(filled);
  return text;
}

absl::StatusOr<std::string> ReadPemFile(const std::string& what, const std::string& path) {
  absl::StatusOr<std::string> pem = ReadSmallFile(what, path, 1 << 20);
  if (!pem.ok()) return pem.status();
  if (pem->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": not a PEM file"));
  }
  return pem;
}

}  // namespace mptrain
