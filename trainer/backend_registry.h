#pragma once

// Backends register themselves here (a static registrar in each backend library), so the
// worker picks one by device kind at start-up and a CPU-only build simply has no CUDA entry.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/stop_token.h"
#include "proto/mptrain.pb.h"
#include "trainer/backend.h"
#include "trainer/key_value_store.h"

namespace mptrain {

struct BackendOptions {
  int rank = 0;
  int world_size = 1;
  int device_index = 0;
  // Rendezvous for the collective (NCCL unique id / gloo addresses); must outlive the backend.
  KeyValueStore* store = nullptr;
  // Address this rank's collective listens on (gloo); other ranks must reach it.
  std::string host = "127.0.0.1";
  // How long one collective may wait for its peers (JobSpec.collective_timeout_s), and how long
  // the rendezvous may wait for every rank to start.
  int64_t collective_timeout_ms = 60'000;
  int64_t rendezvous_timeout_ms = 120'000;
  // Tripped by the rank process on SIGTERM or when the job ended: aborts the collective.
  // Optional; must outlive the backend.
  StopToken* stop_token = nullptr;
  // JobSpec.grad_comm_lanes: communicators the gradient allreduce is striped over (NCCL only;
  // 0 = decided at rendezvous, comm/lane_plan.h).
  int grad_comm_lanes = 0;
};

struct LocalDevices {
  int count = 0;
  std::vector<v1::DeviceInfo> devices;
};

struct BackendEntry {
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(const BackendOptions&)> create;
  // Devices this machine has for the backend (CPU: none are listed; slots are chosen by flag).
  std::function<absl::StatusOr<LocalDevices>()> discover;
  // Optional: the per-process set-up of `device_index` that any backend on it needs (CUDA: the
  // device's context, cuBLAS's libraries), done by a warm rank process before it has a job
  // (worker/standby_ranks.h) so that create() then finds it done. Leaves nothing a job could
  // see: no allocation a backend would reuse.
  std::function<absl::Status(int device_index)> warm_up;
};

void RegisterBackend(v1::DeviceKind kind, BackendEntry entry);

// UNIMPLEMENTED when this build has no backend for `kind` (e.g. CUDA in a CPU-only build).
absl::StatusOr<const BackendEntry*> FindBackend(v1::DeviceKind kind);

struct BackendRegistrar {
  BackendRegistrar(v1::DeviceKind kind, BackendEntry entry) {
    RegisterBackend(kind, std::move(entry));
  }
};

}  // namespace mptrain
