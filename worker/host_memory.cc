#include "worker/host_memory.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace mptrain {
namespace {

// /proc and /sys files say they are empty (st_size 0): read to the end, at most `max_bytes`.
// Regular files only: a FIFO planted in a fake tree never blocks the worker.
std::optional<std::string> ReadKernelFile(const std::string& path, size_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::nullopt;
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(fd);
    return std::nullopt;
  }
  std::string text(max_bytes, '\0');
  size_t filled = 0;
  while (filled < text.size()) {
    const ssize_t n = read(fd, text.data() + filled, text.size() - filled);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    filled += static_cast<size_t>(n);
  }
  close(fd);
  text.resize(filled);
  return text;
}

std::string Under(const std::string& root, absl::string_view path) {
  std::string joined = root;
  while (!joined.empty() && joined.back() == '/') joined.pop_back();
  return absl::StrCat(joined, path);
}

// A limit file's value ("max" or a number of bytes); nullopt: no limit (or unreadable).
std::optional<int64_t> ReadLimit(const std::string& path) {
  std::optional<std::string> text = ReadKernelFile(path, 64);
  if (!text) return std::nullopt;
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &bytes) || bytes <= 0) {
    return std::nullopt;  // "max", or nothing sensible.
  }
  // cgroup v1 says "no limit" with the largest page-aligned int64 (9223372036854771712).
  if (bytes >= (int64_t{1} << 62)) return std::nullopt;
  return bytes;
}

// "/a/b" -> "/a/b", "/a", "/" (a parent's limit binds its children). Empty for a path that
// is not absolute or climbs ("..").
std::vector<std::string> SelfAndAncestors(absl::string_view path) {
  if (path.empty() || path.front() != '/' || path.size() > 4096) return {};
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return {};
  }
  std::vector<std::string> chain;
  std::string current(path);
  while (current.size() > 1 && current.back() == '/') current.pop_back();
  while (true) {
    chain.push_back(current);
    if (current == "/") break;
    const size_t slash = current.rfind('/');
    current = slash == 0 ? "/" : current.substr(0, slash);
  }
  return chain;
}

// A byte count file (memory.current, memory.usage_in_bytes); nullopt: unreadable.
std::optional<int64_t> ReadBytes(const std::string& path) {
  std::optional<std::string> text = ReadKernelFile(path, 64);
  int64_t bytes = 0;
  if (!text || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &bytes) || bytes < 0) {
    return std::nullopt;
  }
  return bytes;
}

// The value of `key` in a memory.stat file ("key value" lines); 0 when absent.
int64_t StatValue(const std::string& path, absl::string_view key) {
  std::optional<std::string> stat = ReadKernelFile(path, 64 << 10);
  if (!stat) return 0;
  for (absl::string_view line : absl::StrSplit(*stat, '\n')) {
    std::pair<absl::string_view, absl::string_view> fields = absl::StrSplit(line, ' ');
    int64_t value = 0;
    if (fields.first == key && absl::SimpleAtoi(fields.second, &value) && value >= 0) {
      return value;
    }
  }
  return 0;
}

struct CgroupMemory {
  int64_t limit = 0;  // The smallest limit; 0: none.
  int64_t room = -1;  // The least room under a limit; -1: no limit.
};

// One limited cgroup directory: its limit, and the room left under it.
void Consider(CgroupMemory* memory, std::optional<int64_t> limit, const std::string& usage_file,
              const std::string& stat_file, absl::string_view inactive_key) {
  if (!limit) return;
  if (memory->limit == 0 || *limit < memory->limit) memory->limit = *limit;
  int64_t held = ReadBytes(usage_file).value_or(0);
  held = std::max<int64_t>(0, held - StatValue(stat_file, inactive_key));
  const int64_t room = std::max<int64_t>(0, *limit - held);
  if (memory->room < 0 || room < memory->room) memory->room = room;
}

// The memory limits on this process's cgroups, v2 and v1, and the room left under them.
CgroupMemory ReadCgroupMemory(const std::string& root) {
  CgroupMemory memory;
  std::optional<std::string> cgroups = ReadKernelFile(Under(root, "/proc/self/cgroup"), 64 << 10);
  if (!cgroups) return memory;
  for (absl::string_view line : absl::StrSplit(*cgroups, '\n', absl::SkipEmpty())) {
    // "hierarchy-id:controllers:path"; the path may itself hold ':'.
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    const bool v2 = fields[0] == "0" && fields[1].empty();
    bool v1_memory = false;
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      v1_memory = v1_memory || controller == "memory";
    }
    for (const std::string& cgroup : SelfAndAncestors(fields[2])) {
      const std::string dir = cgroup == "/" ? "" : cgroup;
      if (v2) {
        const std::string base = Under(root, absl::StrCat("/sys/fs/cgroup", dir, "/memory."));
        Consider(&memory, ReadLimit(base + "max"), base + "current", base + "stat",
                 "inactive_file");
      }
      if (v1_memory) {
        const std::string base =
            Under(root, absl::StrCat("/sys/fs/cgroup/memory", dir, "/memory."));
        Consider(&memory, ReadLimit(base + "limit_in_bytes"), base + "usage_in_bytes",
                 base + "stat", "total_inactive_file");
      }
    }
  }
  return memory;
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    return "";
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length && hex.size() < 32; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

}  // namespace

int64_t HostMemory::usable_bytes() const {
  if (cgroup_limit_bytes > 0 && cgroup_limit_bytes < available_bytes) return cgroup_limit_bytes;
  return available_bytes;
}

int64_t HostMemory::available_now_bytes() const {
  if (cgroup_room_bytes >= 0 && cgroup_room_bytes < available_bytes) return cgroup_room_bytes;
  return available_bytes;
}

int64_t HostMemory::total_now_bytes() const {
  if (cgroup_limit_bytes > 0 && (total_bytes == 0 || cgroup_limit_bytes < total_bytes)) {
    return cgroup_limit_bytes;
  }
  return total_bytes;
}

absl::StatusOr<HostMemory> ReadHostMemory(const std::string& root) {
  const std::string meminfo_path = Under(root, "/proc/meminfo");
  std::optional<std::string> meminfo = ReadKernelFile(meminfo_path, 64 << 10);
  if (!meminfo) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read ", meminfo_path));
  }
  HostMemory memory;
  for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
    int64_t* field = nullptr;
    if (absl::ConsumePrefix(&line, "MemAvailable:")) {
      field = &memory.available_bytes;
    } else if (absl::ConsumePrefix(&line, "MemTotal:")) {
      field = &memory.total_bytes;
    } else {
      continue;
    }
    line = absl::StripAsciiWhitespace(line);
    int64_t kib = 0;
    if (absl::ConsumeSuffix(&line, "kB") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) && kib > 0 &&
        kib < (int64_t{1} << 52)) {
      *field = kib * 1024;
    }
  }
  if (memory.available_bytes == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(meminfo_path, " has no valid MemAvailable line (Linux 3.14 or later)"));
  }
  const CgroupMemory cgroup = ReadCgroupMemory(root);
  memory.cgroup_limit_bytes = cgroup.limit;
  memory.cgroup_room_bytes = cgroup.room;
  return memory;
}

absl::StatusOr<std::string> ReadMachineId(const std::string& root) {
  std::optional<std::string> machine_id = ReadKernelFile(Under(root, "/etc/machine-id"), 256);
  std::string source;
  if (machine_id && !absl::StripAsciiWhitespace(*machine_id).empty()) {
    source = absl::StrCat("machine-id ", absl::StripAsciiWhitespace(*machine_id));
  } else {
    // Without a machine id (a minimal container): the boot id names this boot of the kernel,
    // which co-located containers share; the host name tells apart machines that booted the
    // same image at once only in theory, but costs nothing.
    std::optional<std::string> boot_id =
        ReadKernelFile(Under(root, "/proc/sys/kernel/random/boot_id"), 256);
    std::optional<std::string> hostname =
        ReadKernelFile(Under(root, "/proc/sys/kernel/hostname"), 256);
    if (!boot_id || absl::StripAsciiWhitespace(*boot_id).empty()) {
      return absl::FailedPreconditionError(
          "neither /etc/machine-id nor /proc/sys/kernel/random/boot_id can be read");
    }
    source = absl::StrCat("boot-id ", absl::StripAsciiWhitespace(*boot_id), " host ",
                          hostname ? absl::StripAsciiWhitespace(*hostname) : "");
  }
  std::string id = Sha256Hex(absl::StrCat("mptrain worker machine\n", source));
  if (id.empty()) return absl::FailedPreconditionError("SHA-256 failed");
  return id;
}

}  // namespace mptrain
