#pragma once

// What this machine can give the worker's CPU ranks, and which machine it is: what the worker
// advertises when it registers, so that the coordinator never places more on one machine than
// it holds (co-located workers share the machine's memory; a cgroup limits what its processes
// may use, whatever the machine has).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace mptrain {

struct HostMemory {
  int64_t available_bytes = 0;  // MemAvailable of /proc/meminfo
  int64_t cgroup_limit_bytes = 0;  // The smallest memory limit of this process's cgroups; 0: none
  // What a rank of this worker can count on: the smaller of the two. MemAvailable, not MemTotal:
  // the kernel, page tables and other services keep the difference, and a rank that counted
  // on it would be killed by the kernel.
  int64_t usable_bytes() const;
};

// Reads <root>/proc/meminfo, <root>/proc/self/cgroup and the cgroup's limits, v2
// (<root>/sys/fs/cgroup/<path>/memory.max) and v1
// (<root>/sys/fs/cgroup/memory/<path>/memory.limit_in_bytes), each of the cgroup's ancestors
// included (a parent's limit binds its children). `root` is "/" but in tests, which build a
// fake tree. FAILED_PRECONDITION: /proc/meminfo cannot be read or has no MemAvailable. A
// cgroup file that is missing or malformed is no limit (the machine's memory still bounds).
absl::StatusOr<HostMemory> ReadHostMemory(const std::string& root = "/");

// An id of this machine that every worker on it shares and that says nothing of the machine:
// a SHA-256 (hex, 32 characters) of /etc/machine-id, or, without one, of the boot id and the
// host name (the raw machine id is confidential: machine-id(5)). FAILED_PRECONDITION: neither
// can be read.
absl::StatusOr<std::string> ReadMachineId(const std::string& root = "/");

}  // namespace mptrain
