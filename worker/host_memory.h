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
  int64_t total_bytes = 0;  // MemTotal of /proc/meminfo; 0: not said
  // The least room left under a limit of this process's cgroups: a limited cgroup's limit less
  // what it holds (v2 memory.current, v1 memory.usage_in_bytes) less its inactive file cache
  // (which the kernel reclaims before it kills: memory.stat's inactive_file, v1
  // total_inactive_file), at least 0. -1: no limited cgroup. A limited cgroup whose use cannot
  // be read counts as holding nothing.
  int64_t cgroup_room_bytes = -1;
  // What a rank of this worker can count on: the smaller of the two. MemAvailable, not MemTotal:
  // the kernel, page tables and other services keep the difference, and a rank that counted
  // on it would be killed by the kernel. (What the worker advertises at registration.)
  int64_t usable_bytes() const;
  // Live figures (the heartbeats' WorkerUsage): what ranks could take now, MemAvailable or the
  // cgroups' room when smaller; and what they could have at most, MemTotal or the cgroup limit
  // when smaller (0: neither is known).
  int64_t available_now_bytes() const;
  int64_t total_now_bytes() const;
};

// Reads <root>/proc/meminfo, <root>/proc/self/cgroup and the cgroup's limits, v2
// (<root>/sys/fs/cgroup/<path>/memory.max) and v1
// (<root>/sys/fs/cgroup/memory/<path>/memory.limit_in_bytes), each of the cgroup's ancestors
// included (a parent's limit binds its children), and what each limited one holds now. Cheap
// enough to call every heartbeat (a few small files). `root` is "/" but in tests, which build a
// fake tree. FAILED_PRECONDITION: /proc/meminfo cannot be read or has no MemAvailable. A
// cgroup file that is missing or malformed is no limit (the machine's memory still bounds).
absl::StatusOr<HostMemory> ReadHostMemory(const std::string& root = "/");

// An id of this machine that every worker on it shares and that says nothing of the machine:
// a SHA-256 (hex, 32 characters) of /etc/machine-id, or, without one, of the boot id and the
// host name (the raw machine id is confidential: machine-id(5)). FAILED_PRECONDITION: neither
// can be read.
absl::StatusOr<std::string> ReadMachineId(const std::string& root = "/");

}  // namespace mptrain
