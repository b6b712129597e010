#include "worker/device_usage.h"

#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <vector>

#include "common/rpc_limits.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// Readings by the reader's index; an index it has none for fails, as NVML does for a GPU that
// fell off the bus. Remembers the indices it was asked for.
class FakeReader : public DeviceReader {
 public:
  explicit FakeReader(std::map<int, RawDeviceReading> readings, std::vector<int>* asked)
      : readings_(std::move(readings)), asked_(asked) {}
  absl::StatusOr<RawDeviceReading> Read(int index) override {
    asked_->push_back(index);
    auto it = readings_.find(index);
    if (it == readings_.end()) return absl::UnavailableError("GPU is lost");
    return it->second;
  }

 private:
  std::map<int, RawDeviceReading> readings_;
  std::vector<int>* asked_;
};

RawDeviceReading Reading(uint64_t used, uint64_t total, uint32_t utilization) {
  RawDeviceReading reading;
  reading.memory_used_bytes = used;
  reading.memory_total_bytes = total;
  reading.utilization_percent = utilization;
  return reading;
}

TEST(OpenNvml, NoLibrary_FailedPreconditionNamingIt) {
  absl::StatusOr<std::unique_ptr<DeviceReader>> reader = OpenNvml("libnvidia-ml-absent.so.1");
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(reader.status().message().find("libnvidia-ml-absent.so.1"), std::string::npos)
      << reader.status();
}

TEST(OpenNvml, ALibraryThatIsNotNvml_FailedPreconditionNamingTheMissingFunctions) {
  absl::StatusOr<std::unique_ptr<DeviceReader>> reader = OpenNvml("libc.so.6");
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(reader.status().message().find("nvmlInit_v2"), std::string::npos) << reader.status();
  EXPECT_NE(reader.status().message().find("nvmlDeviceGetUtilizationRates"), std::string::npos);
}

TEST(ToDeviceUsage, SensibleFiguresPass_NonsenseOrAnErrorIsUnavailableWithZeros) {
  v1::DeviceUsage good = ToDeviceUsage(3, Reading(5 * kGiB, 80 * kGiB, 97));
  EXPECT_EQ(good.index(), 3);
  EXPECT_TRUE(good.available());
  EXPECT_EQ(good.memory_used_bytes(), int64_t{5} << 30);
  EXPECT_EQ(good.memory_total_bytes(), int64_t{80} << 30);
  EXPECT_EQ(good.utilization_percent(), 97);
  EXPECT_TRUE(ToDeviceUsage(0, Reading(80 * kGiB, 80 * kGiB, 100)).available()) << "full, busy";
  EXPECT_TRUE(ToDeviceUsage(0, Reading(0, 80 * kGiB, 0)).available()) << "idle";

  const absl::StatusOr<RawDeviceReading> nonsense[] = {
      Reading(81 * kGiB, 80 * kGiB, 10),  // More used than there is.
      Reading(0, 80 * kGiB, 101),         // Beyond 100 %.
      Reading(0, 80 * kGiB, std::numeric_limits<uint32_t>::max()),
      Reading(1, std::numeric_limits<uint64_t>::max(), 0),  // Beyond int64.
      Reading(0, 0, 0),                                     // No memory at all.
      absl::UnavailableError("GPU is lost"),
  };
  for (const auto& reading : nonsense) {
    v1::DeviceUsage usage = ToDeviceUsage(7, reading);
    EXPECT_EQ(usage.index(), 7);
    EXPECT_FALSE(usage.available());
    EXPECT_EQ(usage.memory_used_bytes(), 0);
    EXPECT_EQ(usage.memory_total_bytes(), 0);
    EXPECT_EQ(usage.utilization_percent(), 0);
  }
}

// The worker's device i is read as the reader's device reader_indices[i]; one failing device
// leaves the others' readings alone.
TEST(DeviceUsage, ReadsEachDeviceThroughItsReaderIndex_AFailingOneIsUnavailable) {
  std::vector<int> asked;
  auto reader = std::make_unique<FakeReader>(
      std::map<int, RawDeviceReading>{{2, Reading(kGiB, 16 * kGiB, 40)},
                                      {5, Reading(2 * kGiB, 16 * kGiB, 60)}},
      &asked);
  DeviceUsage usage({0, 1, 2}, {5, 2, 7}, std::move(reader));
  std::vector<v1::DeviceUsage> readings = usage.Read();
  EXPECT_EQ(asked, (std::vector<int>{5, 2, 7}));
  ASSERT_EQ(readings.size(), 3u);
  EXPECT_EQ(readings[0].index(), 0);
  EXPECT_TRUE(readings[0].available());
  EXPECT_EQ(readings[0].utilization_percent(), 60);
  EXPECT_EQ(readings[1].index(), 1);
  EXPECT_EQ(readings[1].memory_used_bytes(), int64_t{1} << 30);
  EXPECT_EQ(readings[2].index(), 2);
  EXPECT_FALSE(readings[2].available());
  // Read again: the same answers (the failure is logged once, not every heartbeat).
  EXPECT_EQ(usage.Read().size(), 3u);
}

TEST(DeviceUsage, NoReader_EveryDeviceUnavailable_NeverAnError) {
  DeviceUsage usage({0, 1}, {}, nullptr);
  std::vector<v1::DeviceUsage> readings = usage.Read();
  ASSERT_EQ(readings.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(readings[i].index(), i);
    EXPECT_FALSE(readings[i].available());
  }
}

TEST(DeviceUsage, MoreDevicesThanAHeartbeatCarries_TheFirstOnesAreRead) {
  std::vector<int> devices, asked;
  std::map<int, RawDeviceReading> readings;
  for (int i = 0; i < 100; ++i) {
    devices.push_back(i);
    readings[i] = Reading(kGiB, 2 * kGiB, 1);
  }
  DeviceUsage usage(devices, devices, std::make_unique<FakeReader>(readings, &asked));
  std::vector<v1::DeviceUsage> read = usage.Read();
  ASSERT_EQ(read.size(), static_cast<size_t>(kMaxUsageDevices));
  EXPECT_EQ(read.back().index(), kMaxUsageDevices - 1);
  EXPECT_EQ(asked.size(), static_cast<size_t>(kMaxUsageDevices)) << "the rest are not read";
}

TEST(NvmlIndicesOfCudaDevices, MapsCudaOrdinalsThroughCudaVisibleDevices) {
  EXPECT_EQ(*NvmlIndicesOfCudaDevices(nullptr, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(*NvmlIndicesOfCudaDevices("2,3", 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(*NvmlIndicesOfCudaDevices(" 3 , 1,0", 2), (std::vector<int>{3, 1}));
  // CUDA stops at the first entry it cannot read.
  EXPECT_EQ(*NvmlIndicesOfCudaDevices("4,-1,2", 1), (std::vector<int>{4}));
  EXPECT_EQ(NvmlIndicesOfCudaDevices("4,-1,2", 2).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(NvmlIndicesOfCudaDevices("0", 2).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::vector<int>> by_uuid =
      NvmlIndicesOfCudaDevices("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", 1);
  ASSERT_FALSE(by_uuid.ok());
  EXPECT_NE(by_uuid.status().message().find("UUID"), std::string::npos);
  EXPECT_FALSE(NvmlIndicesOfCudaDevices("MIG-0", 1).ok());
}

TEST(DeviceUsage, ForNoDevices_ReadsNothing) {
  std::string why;
  std::unique_ptr<DeviceUsage> usage = DeviceUsage::ForCudaDevices({}, &why);
  EXPECT_TRUE(usage->Read().empty());
  EXPECT_EQ(why, "");
}

// This machine as it is: without NVML (a CPU machine) every reading is unavailable and the
// reason is said; with it (a GPU machine), device 0 reads figures that make sense.
TEST(DeviceUsage, ForCudaDevices_OnThisMachine) {
  std::string why;
  std::unique_ptr<DeviceUsage> usage = DeviceUsage::ForCudaDevices({0}, &why);
  std::vector<v1::DeviceUsage> readings = usage->Read();
  ASSERT_EQ(readings.size(), 1u);
  EXPECT_EQ(readings[0].index(), 0);
  if (!OpenNvml().ok()) {
    EXPECT_FALSE(readings[0].available());
    EXPECT_NE(why, "");
    return;
  }
  std::printf("NVML: device 0 uses %lld of %lld bytes, %d%% busy\n",
              static_cast<long long>(readings[0].memory_used_bytes()),
              static_cast<long long>(readings[0].memory_total_bytes()),
              readings[0].utilization_percent());
  EXPECT_EQ(why, "");
  EXPECT_TRUE(readings[0].available());
  EXPECT_GT(readings[0].memory_total_bytes(), int64_t{1} << 30);
  EXPECT_LE(readings[0].memory_used_bytes(), readings[0].memory_total_bytes());
}

}  // namespace
}  // namespace mptrain
