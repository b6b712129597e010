// Registers the CPU backend (gloo collective) under DeviceKind CPU.

#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gloo_collective.h"
#include "trainer/backend_registry.h"

namespace mptrain {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options) {
  GlooCollectiveOptions gloo;
  gloo.rank = options.rank;
  gloo.world_size = options.world_size;
  gloo.host = options.host;
  gloo.store = options.store;
  gloo.rendezvous_timeout_ms = options.rendezvous_timeout_ms;
  gloo.collective_timeout_ms = options.collective_timeout_ms;
  gloo.stop_token = options.stop_token;
  auto collective = GlooCollective::Connect(gloo);
  if (!collective.ok()) return collective.status();
  return std::unique_ptr<Backend>(new CpuBackend(std::move(*collective)));
}

absl::StatusOr<LocalDevices> DiscoverCpu() {
  LocalDevices devices;
  devices.count = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return devices;
}

const BackendRegistrar kRegistrar(v1::CPU, BackendEntry{CreateCpuBackend, DiscoverCpu});

}  // namespace
}  // namespace mptrain
