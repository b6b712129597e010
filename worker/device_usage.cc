#include "worker/device_usage.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rpc_limits.h"
#include "spdlog/spdlog.h"

namespace mptrain {
namespace {

// NVML's C API, as nvml.h declares it (the functions below exist since driver 325; the _v2
// ones are what nvml.h's macros call). Written out here so that no NVML header is needed.
using NvmlReturn = int;  // nvmlReturn_t; NVML_SUCCESS is 0.
constexpr NvmlReturn kNvmlSuccess = 0;
struct NvmlDeviceOpaque;                 // struct nvmlDevice_st
using NvmlDevice = NvmlDeviceOpaque*;    // nvmlDevice_t
struct NvmlMemory {                      // nvmlMemory_t (version 1): bytes
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlUtilization {  // nvmlUtilization_t: percent of the last sample period
  unsigned int gpu;
  unsigned int memory;
};
static_assert(sizeof(NvmlMemory) == 24 && sizeof(NvmlUtilization) == 8,
              "nvmlMemory_t / nvmlUtilization_t layouts");

using NvmlInitFn = NvmlReturn (*)();
using NvmlShutdownFn = NvmlReturn (*)();
using NvmlHandleByIndexFn = NvmlReturn (*)(unsigned int index, NvmlDevice* device);
using NvmlMemoryInfoFn = NvmlReturn (*)(NvmlDevice device, NvmlMemory* memory);
using NvmlUtilizationFn = NvmlReturn (*)(NvmlDevice device, NvmlUtilization* utilization);
using NvmlErrorStringFn = const char* (*)(NvmlReturn result);

class NvmlReader : public DeviceReader {
 public:
  struct Functions {
    NvmlInitFn init = nullptr;
    NvmlShutdownFn shutdown = nullptr;
    NvmlHandleByIndexFn handle_by_index = nullptr;
    NvmlMemoryInfoFn memory_info = nullptr;
    NvmlUtilizationFn utilization = nullptr;
    NvmlErrorStringFn error_string = nullptr;  // Optional: only for messages.
  };
  explicit NvmlReader(Functions nvml) : nvml_(nvml) {}
  // The library stays loaded (as pynvml leaves it): NVML may keep threads of its own, and
  // unloading the driver's library under them is not worth the few pages it holds.
  ~NvmlReader() override { nvml_.shutdown(); }

  absl::StatusOr<RawDeviceReading> Read(int index) override {
    if (index < 0) return absl::InvalidArgumentError(absl::StrCat("NVML index ", index));
    NvmlDevice device = nullptr;
    NvmlReturn result = nvml_.handle_by_index(static_cast<unsigned int>(index), &device);
    if (result != kNvmlSuccess) return Failure("nvmlDeviceGetHandleByIndex_v2", index, result);
    NvmlMemory memory{};
    result = nvml_.memory_info(device, &memory);
    if (result != kNvmlSuccess) return Failure("nvmlDeviceGetMemoryInfo", index, result);
    NvmlUtilization utilization{};
    result = nvml_.utilization(device, &utilization);
    if (result != kNvmlSuccess) return Failure("nvmlDeviceGetUtilizationRates", index, result);
    RawDeviceReading reading;
    reading.memory_used_bytes = memory.used;
    reading.memory_total_bytes = memory.total;
    reading.utilization_percent = utilization.gpu;
    return reading;
  }

  static std::string Describe(const Functions& nvml, NvmlReturn result) {
    const char* text = nvml.error_string != nullptr ? nvml.error_string(result) : nullptr;
    return absl::StrCat(text != nullptr ? text : "error", " (", result, ")");
  }

 private:
  absl::Status Failure(const char* function, int index, NvmlReturn result) const {
    return absl::UnavailableError(
        absl::StrCat(function, " of NVML device ", index, ": ", Describe(nvml_, result)));
  }

  Functions nvml_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceReader>> OpenNvml(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load ", library, " (no NVIDIA driver here?): ", error != nullptr ? error : "?"));
  }
  NvmlReader::Functions nvml;
  std::string missing;
  auto find = [&](auto* function, const char* name) {
    *function = reinterpret_cast<std::remove_pointer_t<decltype(function)>>(dlsym(handle, name));
    if (*function == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  };
  find(&nvml.init, "nvmlInit_v2");
  find(&nvml.shutdown, "nvmlShutdown");
  find(&nvml.handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  find(&nvml.memory_info, "nvmlDeviceGetMemoryInfo");
  find(&nvml.utilization, "nvmlDeviceGetUtilizationRates");
  nvml.error_string = reinterpret_cast<NvmlErrorStringFn>(dlsym(handle, "nvmlErrorString"));
  if (!missing.empty()) {
    dlclose(handle);
    return absl::FailedPreconditionError(
        absl::StrCat(library, " lacks NVML's ", missing, " (not NVML, or a driver too old)"));
  }
  if (const NvmlReturn result = nvml.init(); result != kNvmlSuccess) {
    dlclose(handle);  // Not initialised: nothing of NVML's runs.
    return absl::FailedPreconditionError(
        absl::StrCat("nvmlInit_v2 of ", library, " failed: ", NvmlReader::Describe(nvml, result)));
  }
  return std::unique_ptr<DeviceReader>(new NvmlReader(nvml));
}

absl::StatusOr<std::vector<int>> NvmlIndicesOfCudaDevices(const char* cuda_visible_devices,
                                                          int cuda_devices) {
  std::vector<int> indices;
  if (cuda_visible_devices == nullptr) {
    for (int i = 0; i < cuda_devices; ++i) indices.push_back(i);
    return indices;
  }
  for (absl::string_view entry : absl::StrSplit(cuda_visible_devices, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    int index = 0;
    if (absl::SimpleAtoi(entry, &index) && index >= 0) {
      indices.push_back(index);
      continue;
    }
    if (absl::StartsWith(entry, "GPU-") || absl::StartsWith(entry, "MIG-")) {
      return absl::FailedPreconditionError(
          "CUDA_VISIBLE_DEVICES names devices by UUID or MIG instance: their NVML readings are "
          "not mapped");
    }
    break;  // CUDA itself ignores the entries after one it cannot read.
  }
  if (static_cast<int>(indices.size()) < cuda_devices) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA_VISIBLE_DEVICES=", cuda_visible_devices, " lists ", indices.size(),
        " device(s), fewer than the ", cuda_devices, " CUDA sees"));
  }
  indices.resize(cuda_devices);
  return indices;
}

v1::DeviceUsage ToDeviceUsage(int index, const absl::StatusOr<RawDeviceReading>& reading) {
  v1::DeviceUsage usage;
  usage.set_index(index);
  if (!reading.ok()) return usage;
  constexpr uint64_t kMaxBytes = std::numeric_limits<int64_t>::max();
  const RawDeviceReading& raw = *reading;
  if (raw.memory_total_bytes == 0 || raw.memory_total_bytes > kMaxBytes ||
      raw.memory_used_bytes > raw.memory_total_bytes || raw.utilization_percent > 100) {
    return usage;  // Nothing a device could report: not shown as if it were.
  }
  usage.set_available(true);
  usage.set_memory_used_bytes(static_cast<int64_t>(raw.memory_used_bytes));
  usage.set_memory_total_bytes(static_cast<int64_t>(raw.memory_total_bytes));
  usage.set_utilization_percent(static_cast<int32_t>(raw.utilization_percent));
  return usage;
}

DeviceUsage::DeviceUsage(std::vector<int> device_indices, std::vector<int> reader_indices,
                         std::unique_ptr<DeviceReader> reader)
    : device_indices_(std::move(device_indices)),
      reader_indices_(std::move(reader_indices)),
      reader_(std::move(reader)),
      failing_(device_indices_.size(), false) {
  reader_indices_.resize(device_indices_.size(), -1);
}

std::unique_ptr<DeviceUsage> DeviceUsage::ForCudaDevices(const std::vector<int>& device_indices,
                                                         std::string* why_unavailable) {
  if (device_indices.empty()) {
    return std::make_unique<DeviceUsage>(device_indices, device_indices, nullptr);
  }
  const int highest = *std::max_element(device_indices.begin(), device_indices.end());
  absl::StatusOr<std::vector<int>> nvml_indices =
      highest < 0 ? absl::InvalidArgumentError("negative device index")
                  : NvmlIndicesOfCudaDevices(std::getenv("CUDA_VISIBLE_DEVICES"), highest + 1);
  absl::StatusOr<std::unique_ptr<DeviceReader>> reader =
      nvml_indices.ok() ? OpenNvml() : nvml_indices.status();
  if (!reader.ok()) {
    *why_unavailable = std::string(reader.status().message());
    return std::make_unique<DeviceUsage>(device_indices, std::vector<int>(), nullptr);
  }
  std::vector<int> reader_indices;
  for (int index : device_indices) reader_indices.push_back(index < 0 ? -1 : (*nvml_indices)[index]);
  return std::make_unique<DeviceUsage>(device_indices, std::move(reader_indices),
                                       *std::move(reader));
}

std::vector<v1::DeviceUsage> DeviceUsage::Read() {
  std::vector<v1::DeviceUsage> readings;
  const size_t count = std::min(device_indices_.size(), static_cast<size_t>(kMaxUsageDevices));
  for (size_t i = 0; i < count; ++i) {
    if (reader_ == nullptr || reader_indices_[i] < 0) {
      readings.push_back(ToDeviceUsage(device_indices_[i], absl::UnavailableError("no reader")));
      continue;
    }
    absl::StatusOr<RawDeviceReading> raw = reader_->Read(reader_indices_[i]);
    readings.push_back(ToDeviceUsage(device_indices_[i], raw));
    const bool failed = !readings.back().available();
    if (failed && !failing_[i]) {
      spdlog::warn("device {}: no usage reading ({})", device_indices_[i],
                   raw.ok() ? "figures out of range" : std::string(raw.status().message()));
    } else if (!failed && failing_[i]) {
      spdlog::info("device {}: usage readings again", device_indices_[i]);
    }
    failing_[i] = failed;
  }
  return readings;
}

}  // namespace mptrain
