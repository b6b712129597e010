#pragma once

// What the coordinator exposes at /metrics (Prometheus text format): RPCs by method and code
// with latency histograms (RpcMetrics, fed by a gRPC interceptor), and a snapshot of the state
// (jobs and workers by state, heartbeat ages, and per running or recently ended job its latest
// telemetry: step, loss, grad norm, loss scale, skipped steps, samples/s, learning rate, and
// its latest evaluation's step and metrics, kept until the next evaluation), labelled job_id
// and name; workers labelled by name (stable across a daemon's restarts), with their latest
// usage (host memory, and per GPU its memory and utilization, labelled gpu); the build
// (mptrain_build_info) and the process (process_*). Names follow Prometheus' naming guide:
// mptrain_ prefix, base units, _total for counters only, _seconds, _bytes.

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "coordinator/coordinator_state.h"

namespace mptrain {

class RpcMetrics {
 public:
  // Upper bounds of the latency buckets, in seconds.
  static constexpr std::array<double, 14> kBounds = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                     0.025,  0.05,  0.1,    0.25,  0.5,
                                                     1,      2.5,   10,     30};
  // `method` is gRPC's full name ("/mptrain.v1.Coordinator/GetJob"), as the client sent it:
  // a method of mptrain's services, gRPC's health check or server reflection keeps its name;
  // any other (answered UNIMPLEMENTED, or let through to the health service unauthenticated)
  // is counted as kUnknownMethod, so that the label set stays bounded whatever clients send.
  void Record(const std::string& method, const std::string& code, double seconds);
  static constexpr char kUnknownMethod[] = "unknown";

  struct Method {
    std::map<std::string, uint64_t> calls_by_code;
    std::array<uint64_t, kBounds.size()> buckets{};  // Not cumulative.
    uint64_t count = 0;
    double sum = 0;
  };
  std::map<std::string, Method> Snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, Method> methods_;
};

// Series of each mptrain_worker_gpu_* family at most (a GPU of a live worker each: as many as
// --max_live_workers' default); the readings beyond are counted in
// mptrain_worker_gpu_readings_omitted.
inline constexpr size_t kMaxGpuSeries = 65'536;

// The whole exposition.
std::string RenderMetrics(const CoordinatorState::Overview& overview, const RpcMetrics& rpcs);

}  // namespace mptrain
