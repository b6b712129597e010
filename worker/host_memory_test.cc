#include "worker/host_memory.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// A fake / under the test's scratch directory: files are created with their parents.
class FakeRoot {
 public:
  FakeRoot() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = std::filesystem::path(tmp != nullptr ? tmp : "/tmp") /
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void Write(const std::string& path, const std::string& text) {
    const std::filesystem::path file = root_ / path.substr(1);
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  std::string root() const { return root_.string(); }

 private:
  std::filesystem::path root_;
};

std::string Meminfo(int64_t available_kib) {
  return "MemTotal:       24641536 kB\nMemFree:         1000000 kB\nMemAvailable:   " +
         std::to_string(available_kib) + " kB\nBuffers:          10000 kB\n";
}

TEST(ReadHostMemory, NoCgroupLimit_IsMemAvailable) {
  FakeRoot fake;
  fake.Write("/proc/meminfo", Meminfo(16 * 1024 * 1024));
  fake.Write("/proc/self/cgroup", "0::/user.slice/session-1.scope\n");
  fake.Write("/sys/fs/cgroup/user.slice/session-1.scope/memory.max", "max\n");
  absl::StatusOr<HostMemory> memory = ReadHostMemory(fake.root());
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(memory->available_bytes, 16 * kGiB);
  EXPECT_EQ(memory->cgroup_limit_bytes, 0);
  EXPECT_EQ(memory->usable_bytes(), 16 * kGiB);
}

TEST(ReadHostMemory, CgroupV2Limit_BindsBelowMemAvailable) {
  FakeRoot fake;
  fake.Write("/proc/meminfo", Meminfo(20 * 1024 * 1024));
  fake.Write("/proc/self/cgroup", "0::/system.slice/mptrain-worker.service\n");
  fake.Write("/sys/fs/cgroup/system.slice/mptrain-worker.service/memory.max",
             std::to_string(6 * kGiB) + "\n");
  absl::StatusOr<HostMemory> memory = ReadHostMemory(fake.root());
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(memory->cgroup_limit_bytes, 6 * kGiB);
  EXPECT_EQ(memory->usable_bytes(), 6 * kGiB);
}

TEST(ReadHostMemory, CgroupV2ParentLimit_BindsTheChild) {
  FakeRoot fake;
  fake.Write("/proc/meminfo", Meminfo(20 * 1024 * 1024));
  fake.Write("/proc/self/cgroup", "0::/workers.slice/one.service\n");
  fake.Write("/sys/fs/cgroup/workers.slice/one.service/memory.max", "max\n");
  fake.Write("/sys/fs/cgroup/workers.slice/memory.max", std::to_string(3 * kGiB));
  EXPECT_EQ(ReadHostMemory(fake.root())->usable_bytes(), 3 * kGiB);
}

TEST(ReadHostMemory, CgroupV1Limit_IsRead_AndItsUnlimitedValueIsNoLimit) {
  FakeRoot fake;
  fake.Write("/proc/meminfo", Meminfo(20 * 1024 * 1024));
  fake.Write("/proc/self/cgroup", "5:cpu,cpuacct:/\n4:memory:/docker/abc\n0::/\n");
  fake.Write("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
             std::to_string(2 * kGiB) + "\n");
  fake.Write("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(ReadHostMemory(fake.root())->usable_bytes(), 2 * kGiB);
  fake.Write("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(ReadHostMemory(fake.root())->cgroup_limit_bytes, 0);
}

TEST(ReadHostMemory, HostileCgroupFiles_AreNoLimit) {
  FakeRoot fake;
  fake.Write("/proc/meminfo", Meminfo(8 * 1024 * 1024));
  // A path that climbs out of /sys/fs/cgroup is not followed; garbage is no limit.
  fake.Write("/proc/self/cgroup", "0::/../../etc\nnonsense\n4:memory:relative\n");
  fake.Write("/etc/memory.max", "1024\n");
  EXPECT_EQ(ReadHostMemory(fake.root())->cgroup_limit_bytes, 0);
  fake.Write("/proc/self/cgroup", "0::/a\n");
  fake.Write("/sys/fs/cgroup/a/memory.max", "-5\n");
  EXPECT_EQ(ReadHostMemory(fake.root())->cgroup_limit_bytes, 0);
  fake.Write("/sys/fs/cgroup/a/memory.max", "12abc\n");
  EXPECT_EQ(ReadHostMemory(fake.root())->cgroup_limit_bytes, 0);
}

// The heartbeats' live figures: MemTotal, and under a limited cgroup its limit and the room
// left under it (its inactive file cache counts as room: the kernel reclaims it first).
TEST(ReadHostMemory, LiveFigures_AreMemAvailableAndMemTotal_OrTheCgroupsRoomAndLimit) {
  FakeRoot fake;
  fake.Write("/proc/meminfo", Meminfo(20 * 1024 * 1024));  // MemTotal 23.5 GiB.
  fake.Write("/proc/self/cgroup", "0::/\n");
  absl::StatusOr<HostMemory> memory = ReadHostMemory(fake.root());
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(memory->total_bytes, int64_t{24641536} * 1024);
  EXPECT_EQ(memory->cgroup_room_bytes, -1);
  EXPECT_EQ(memory->available_now_bytes(), 20 * kGiB);
  EXPECT_EQ(memory->total_now_bytes(), int64_t{24641536} * 1024);

  fake.Write("/proc/self/cgroup", "0::/system.slice/w.service\n");
  fake.Write("/sys/fs/cgroup/system.slice/w.service/memory.max", std::to_string(6 * kGiB));
  fake.Write("/sys/fs/cgroup/system.slice/w.service/memory.current", std::to_string(5 * kGiB));
  fake.Write("/sys/fs/cgroup/system.slice/w.service/memory.stat",
             "anon 3221225472\nfile 2147483648\ninactive_file " + std::to_string(kGiB) +
                 "\nactive_file 1073741824\n");
  memory = ReadHostMemory(fake.root());
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(memory->cgroup_room_bytes, 2 * kGiB) << "6 GiB less (5 GiB held - 1 GiB inactive)";
  EXPECT_EQ(memory->available_now_bytes(), 2 * kGiB);
  EXPECT_EQ(memory->total_now_bytes(), 6 * kGiB);
  EXPECT_EQ(memory->usable_bytes(), 6 * kGiB) << "what it registers with is unchanged";

  // A parent with less room binds; v1's hierarchical total_inactive_file.
  fake.Write("/sys/fs/cgroup/system.slice/memory.max", std::to_string(8 * kGiB));
  fake.Write("/sys/fs/cgroup/system.slice/memory.current", std::to_string(7 * kGiB));
  EXPECT_EQ(ReadHostMemory(fake.root())->available_now_bytes(), kGiB);
  fake.Write("/proc/self/cgroup", "4:memory:/docker/abc\n");
  fake.Write("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", std::to_string(4 * kGiB));
  fake.Write("/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", std::to_string(3 * kGiB));
  fake.Write("/sys/fs/cgroup/memory/docker/abc/memory.stat",
             "cache 1\ntotal_inactive_file " + std::to_string(kGiB) + "\n");
  EXPECT_EQ(ReadHostMemory(fake.root())->available_now_bytes(), 2 * kGiB);
  // Use beyond the limit (or garbage) is no room, never a negative figure.
  fake.Write("/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", std::to_string(9 * kGiB));
  EXPECT_EQ(ReadHostMemory(fake.root())->available_now_bytes(), 0);
  fake.Write("/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", "-1\n");
  EXPECT_EQ(ReadHostMemory(fake.root())->available_now_bytes(), 4 * kGiB)
      << "unreadable use counts as nothing held";
}

TEST(ReadHostMemory, NoMemAvailable_IsFailedPrecondition) {
  FakeRoot fake;
  EXPECT_EQ(ReadHostMemory(fake.root()).status().code(), absl::StatusCode::kFailedPrecondition);
  fake.Write("/proc/meminfo", "MemTotal: 100 kB\n");
  EXPECT_EQ(ReadHostMemory(fake.root()).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ReadMachineId, HashesTheMachineId_AndFallsBackToBootIdAndHostName) {
  FakeRoot fake;
  EXPECT_EQ(ReadMachineId(fake.root()).status().code(), absl::StatusCode::kFailedPrecondition);
  fake.Write("/proc/sys/kernel/random/boot_id", "0b1c1f8e-8d4c-4c55-9d0e-5f3e1a2b3c4d\n");
  fake.Write("/proc/sys/kernel/hostname", "node-a\n");
  absl::StatusOr<std::string> from_boot = ReadMachineId(fake.root());
  ASSERT_TRUE(from_boot.ok()) << from_boot.status();
  EXPECT_EQ(from_boot->size(), 32u);
  fake.Write("/proc/sys/kernel/hostname", "node-b\n");
  EXPECT_NE(*ReadMachineId(fake.root()), *from_boot) << "another host, the same id";

  fake.Write("/etc/machine-id", "4f6c2b9e0d8a4e1b9c7d5a3f2e1b0c9d\n");
  absl::StatusOr<std::string> from_machine_id = ReadMachineId(fake.root());
  ASSERT_TRUE(from_machine_id.ok());
  EXPECT_EQ(from_machine_id->size(), 32u);
  EXPECT_NE(*from_machine_id, *from_boot);
  EXPECT_EQ(from_machine_id->find("4f6c2b9e"), std::string::npos) << "the raw id is shown";
  EXPECT_EQ(*ReadMachineId(fake.root()), *from_machine_id) << "not stable";
}

}  // namespace
}  // namespace mptrain
