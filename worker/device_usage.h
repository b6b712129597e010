#pragma once

// What the worker's GPUs are doing now, for its heartbeats (HeartbeatRequest.usage): each
// device's memory in use and utilization, read through NVML.
//
// NVML is loaded at run time (dlopen("libnvidia-ml.so.1"), the driver's library) through
// function pointers declared here, so that the CPU-only build needs neither CUDA's nor NVML's
// headers, and a machine without the driver (or without GPUs) runs the same binary: its
// devices' readings are then unavailable, never an error. Reading is behind an interface
// (DeviceReader), so that tests give readings of their own.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/mptrain.pb.h"

namespace mptrain {

// One device's figures as the reader gives them (NVML's own widths).
struct RawDeviceReading {
  uint64_t memory_used_bytes = 0;
  uint64_t memory_total_bytes = 0;
  uint32_t utilization_percent = 0;
};

class DeviceReader {
 public:
  virtual ~DeviceReader() = default;
  // The figures of the device the reader numbers `index` (NVML's index: every GPU of the
  // machine in PCI bus order, whatever CUDA_VISIBLE_DEVICES says). Any error makes that
  // device's reading unavailable; may block as long as the driver does.
  virtual absl::StatusOr<RawDeviceReading> Read(int index) = 0;
};

// NVML, loaded from `library` and initialised (nvmlInit_v2); nvmlShutdown and dlclose when
// destroyed. FAILED_PRECONDITION: the library cannot be loaded (no NVIDIA driver here), lacks
// one of the functions, or its initialisation fails (the message says which).
absl::StatusOr<std::unique_ptr<DeviceReader>> OpenNvml(
    const std::string& library = "libnvidia-ml.so.1");

// NVML's index of each of the worker's CUDA devices 0 .. cuda_devices-1: CUDA numbers only
// the devices CUDA_VISIBLE_DEVICES lists, in its order, while NVML numbers every GPU of the
// machine. `cuda_visible_devices` is the variable's value (null: unset, the same numbering).
// Assumes CUDA's order is the PCI bus order NVML uses (CUDA_DEVICE_ORDER=PCI_BUS_ID, or GPUs
// of one model, which CUDA's default order ranks by bus). FAILED_PRECONDITION: the variable
// names devices some other way (UUIDs, MIG instances) or lists fewer than cuda_devices.
absl::StatusOr<std::vector<int>> NvmlIndicesOfCudaDevices(const char* cuda_visible_devices,
                                                          int cuda_devices);

// A reading as the heartbeat carries it: unavailable (all figures 0) when the read failed or
// its figures make no sense (used above total, utilization above 100, a figure beyond int64).
v1::DeviceUsage ToDeviceUsage(int index, const absl::StatusOr<RawDeviceReading>& reading);

// Reads the worker's devices. Not thread-safe (one caller: the daemon's usage thread).
class DeviceUsage {
 public:
  // `device_indices`: the worker's devices (DeviceInfo.index); `reader_indices`: the reader's
  // index of each (the same length). `reader` null: every reading is unavailable. A device
  // whose reading fails is logged when it starts failing, and when it reads again.
  DeviceUsage(std::vector<int> device_indices, std::vector<int> reader_indices,
              std::unique_ptr<DeviceReader> reader);

  // For a worker's CUDA devices (DeviceInfo.index, the CUDA ordinals): NVML, mapped through
  // CUDA_VISIBLE_DEVICES; without NVML (or a mapping) the readings are unavailable and
  // `*why_unavailable` says why. No devices (a CPU worker): reads nothing, opens nothing.
  static std::unique_ptr<DeviceUsage> ForCudaDevices(const std::vector<int>& device_indices,
                                                     std::string* why_unavailable);

  // One reading per device, in the order given, the first kMaxUsageDevices only
  // (common/rpc_limits.h).
  std::vector<v1::DeviceUsage> Read();

 private:
  std::vector<int> device_indices_;
  std::vector<int> reader_indices_;
  std::unique_ptr<DeviceReader> reader_;
  std::vector<bool> failing_;  // Per device: its last reading failed (and was logged).
};

}  // namespace mptrain
