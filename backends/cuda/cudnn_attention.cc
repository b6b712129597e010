#include "backends/cuda/cudnn_attention.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cuda/attention_plan_candidates.h"
#include "backends/cuda/cudnn_attention_graph.h"
#include "backends/cuda/tuning_settings.h"

namespace mptrain::cuda {
namespace {

namespace fe = cudnn_frontend;

// "backward B=32 T=1024 H=12 hs=64 bf16: 0 <name> 1.4 ms [3 <name> 1.2 ms] ..." (chosen in []).
std::string ReportLine(const AttentionShape& shape, const fe::graph::Graph& graph,
                       const std::vector<std::pair<int64_t, float>>& timings, int64_t chosen) {
  std::string line = shape.Name() + ":";
  if (timings.empty()) {
    absl::StrAppend(&line, chosen >= 0 ? absl::StrCat(" plan ", chosen, ", untimed")
                                       : std::string(" the heuristic's choice, untimed"));
  }
  for (const auto& [plan, ms] : timings) {
    std::string plan_name;
    if (!graph.get_plan_name_at_index(plan, plan_name).is_good()) plan_name = "?";
    absl::StrAppend(&line, plan == chosen ? " [" : " ", plan, " ", plan_name, " ",
                    ms < 0 ? std::string("failed") : absl::StrCat(ms, " ms"),
                    plan == chosen ? "]" : "");
  }
  return line;
}

AttentionShape ShapeOf(const std::tuple<bool, DType, int64_t, int64_t, int64_t, int64_t, bool>& k) {
  const auto [backward, dtype, B, T, H, hs, deterministic] = k;
  return AttentionShape{backward, dtype, B, T, H, hs, deterministic};
}

}  // namespace

struct CudnnAttention::Built {
  std::shared_ptr<fe::graph::Graph> graph;
  // The plans to time on the first call (indices into the graph's plans; empty: the
  // heuristic's choice, untimed), what each took (ms, -1 if it failed), and the chosen one
  // (-1: the heuristic's choice, built by build_plans and run by graph->execute).
  std::vector<int64_t> candidates;
  std::vector<std::pair<int64_t, float>> timings;
  int64_t plan = -1;
  int64_t workspace_bytes = 0;  // What its plans need.
};

struct CudnnAttention::Graphs {
  std::map<Key, Built> built;
};

CudnnAttention::CudnnAttention(cudaStream_t stream)
    : stream_(stream), graphs_(std::make_unique<Graphs>()) {}

namespace {

// Parked per device; never destroyed (at exit the CUDA runtime may already be gone).
std::mutex& ParkedMutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}
std::map<int, std::unique_ptr<CudnnAttention>>& Parked() {
  static auto* parked = new std::map<int, std::unique_ptr<CudnnAttention>>;
  return *parked;
}

}  // namespace

void CudnnAttention::Park(std::unique_ptr<CudnnAttention> attention, int device) {
  if (attention == nullptr) return;
  attention->stream_ = nullptr;
  std::unique_ptr<CudnnAttention> replaced;
  {
    std::lock_guard<std::mutex> lock(ParkedMutex());
    replaced = std::move(Parked()[device]);
    Parked()[device] = std::move(attention);
  }
}

absl::StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(cudaStream_t stream,
                                                                       int device) {
  {
    std::lock_guard<std::mutex> lock(ParkedMutex());
    auto it = Parked().find(device);
    if (it != Parked().end() && it->second != nullptr) {
      std::unique_ptr<CudnnAttention> reused = std::move(it->second);
      Parked().erase(it);
      reused->stream_ = stream;
      return reused;
    }
  }
  std::unique_ptr<CudnnAttention> attention(new CudnnAttention(stream));
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t status = cudnnCreate(&handle);
  if (status != CUDNN_STATUS_SUCCESS) {
    return absl::UnavailableError(absl::StrCat(
        "cuDNN could not be initialised (", cudnnGetErrorString(status),
        "): fp16/bf16 attention needs libcudnn.so.9 on the library path"));
  }
  attention->handle_ = handle;
  return attention;
}

CudnnAttention::~CudnnAttention() {
  graphs_.reset();
  if (handle_ != nullptr) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
  if (workspace_ != nullptr) cudaFree(workspace_);
}

int CudnnAttention::PlansToTime() {
  static const int plans =
      CountSetting("MPTRAIN_CUDNN_PLANS", kDefaultPlansToTime, kMaxPlansToTime);
  return plans;
}

absl::Status CudnnAttention::GrowWorkspace(int64_t bytes) {
  if (bytes <= workspace_bytes_) return absl::OkStatus();
  // Work queued may still use the old workspace.
  if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cuDNN attention: ", cudaGetErrorString(e)));
  }
  if (workspace_ != nullptr) cudaFree(workspace_);
  workspace_ = nullptr;
  workspace_bytes_ = 0;
  // Whatever follows, the old buffer is gone: a recorded step that used it must not replay.
  workspace_changed_ = true;
  if (cudaError_t e = cudaMalloc(&workspace_, bytes); e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cuDNN attention: its workspace of ", bytes, " bytes: ", cudaGetErrorString(e)));
  }
  workspace_bytes_ = bytes;
  return absl::OkStatus();
}

absl::StatusOr<CudnnAttention::Built*> CudnnAttention::GraphFor(const Key& key) {
  if (auto it = graphs_->built.find(key); it != graphs_->built.end()) return &it->second;
  const AttentionShape shape = ShapeOf(key);
  const bool deterministic = shape.deterministic;
  cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  auto described = DescribeAttention(shape, handle);
  if (!described.ok()) return described.status();
  std::shared_ptr<fe::graph::Graph> graph = *std::move(described);
  const std::string name = shape.Name();
  if (absl::Status s = FrontendStatus(graph->create_execution_plans({fe::HeurMode_t::A}), name);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = FrontendStatus(graph->check_support(handle), name); !s.ok()) return s;
  // Deterministic jobs keep the heuristic's first plan, forward and backward: a plan chosen by
  // timing may differ between runs (and between jobs of a process, the graphs being parked),
  // and with it the rounding of the softmax and the order of the gradients' additions.
  const int64_t plan_count = graph->get_execution_plan_count();
  const bool time_plans = !deterministic && PlansToTime() > 1 && plan_count > 1;
  Built built;
  built.graph = graph;
  int64_t workspace = 0;
  if (!time_plans) {
    if (absl::Status s = FrontendStatus(
            graph->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), name);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = FrontendStatus(graph->get_workspace_size(workspace), name); !s.ok()) {
      return s;
    }
  } else {
    // Candidates: AttentionPlanCandidates' choice among the plans that build (each is
    // compiled: built one by one as offered, not all of the heuristic's list).
    AttentionPlanCandidates candidates(PlansToTime(), kMaxTimedPlanWorkspace);
    for (int64_t i = 0; i < plan_count && !candidates.Full(); ++i) {
      int64_t bytes = 0;
      if (!graph->build_plan_at_index(handle, i).is_good() ||
          !graph->get_workspace_size_plan_at_index(i, bytes).is_good()) {
        continue;
      }
      candidates.Offer(i, bytes);
    }
    built.candidates = candidates.plans();
    workspace = candidates.workspace_bytes();
    if (built.candidates.empty()) {
      return absl::InternalError(absl::StrCat("cuDNN attention ", name, ": no plan built"));
    }
    // Until timed (and if timing fails), the heuristic's first that built; by index, as the
    // graph's own choice was not built. One candidate is not timed.
    built.plan = built.candidates.front();
    if (built.candidates.size() == 1) built.candidates.clear();
  }
  built.workspace_bytes = workspace;
  if (absl::Status s = GrowWorkspace(workspace); !s.ok()) return s;
  return &graphs_->built.emplace(key, std::move(built)).first->second;
}

absl::Status CudnnAttention::TimePlans(Built& built, std::unordered_map<int64_t, void*>& pack) {
  cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    if (start != nullptr) cudaEventDestroy(start);
    cudaGetLastError();
    // Untimed (the heuristic's first that built), and not tried again.
    for (int64_t plan : built.candidates) built.timings.emplace_back(plan, -1.0f);
    return absl::OkStatus();
  }
  float best_ms = 0;
  int64_t best = -1;
  absl::Status status;
  for (int64_t plan : built.candidates) {
    float plan_ms = 0;
    // A plan cuDNN refuses to run is only not chosen; a failed event wait means the device
    // failed (a fault is sticky: every later call fails too), and is the call's error.
    bool ran = built.graph->execute_plan_at_index(handle, pack, workspace_, plan).is_good();
    // The fastest of a few runs, after one that loads the kernel.
    for (int run = 0; ran && run < kTimedRunsPerPlan; ++run) {
      if (cudaError_t e = cudaEventRecord(start, stream_); e != cudaSuccess) {
        status = absl::InternalError(absl::StrCat("cuDNN attention: timing its plans: ",
                                                  cudaGetErrorString(e)));
        break;
      }
      ran = built.graph->execute_plan_at_index(handle, pack, workspace_, plan).is_good();
      float ms = 0;
      cudaError_t e = cudaEventRecord(stop, stream_);
      if (e == cudaSuccess) e = cudaEventSynchronize(stop);
      if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, start, stop);
      if (e != cudaSuccess) {
        status = absl::InternalError(absl::StrCat("cuDNN attention: timing plan ", plan, ": ",
                                                  cudaGetErrorString(e)));
        break;
      }
      if (ran && (run == 0 || ms < plan_ms)) plan_ms = ms;
    }
    if (!status.ok()) break;
    if (ran && (best < 0 || plan_ms < best_ms)) {
      best = plan;
      best_ms = plan_ms;
    }
    built.timings.emplace_back(plan, ran ? plan_ms : -1.0f);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!status.ok()) return status;
  if (best >= 0) built.plan = best;
  return absl::OkStatus();
}

absl::Status CudnnAttention::Execute(const Key& key, const std::map<int64_t, void*>& pointers) {
  auto built = GraphFor(key);
  if (!built.ok()) return built.status();
  cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  if (cudnnStatus_t s = cudnnSetStream(handle, stream_); s != CUDNN_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cudnnSetStream: ", cudnnGetErrorString(s)));
  }
  Built& entry = **built;
  // A later shape's growth that failed leaves no workspace: grown again (or its error) here.
  if (absl::Status s = GrowWorkspace(entry.workspace_bytes); !s.ok()) return s;
  std::unordered_map<int64_t, void*> pack(pointers.begin(), pointers.end());
  // Timed on the first call made outside a stream capture (a capture cannot wait for events),
  // with this call's own buffers: every plan writes the same outputs from the same inputs, and
  // the chosen one runs after.
  if (!entry.candidates.empty() && entry.timings.empty()) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_, &capture) == cudaSuccess &&
        capture == cudaStreamCaptureStatusNone) {
      if (absl::Status s = TimePlans(entry, pack); !s.ok()) return s;
      // Benchmarks' logs: what was timed and chosen.
      if (std::getenv("MPTRAIN_CUDNN_PLAN_LOG") != nullptr) {
        std::fprintf(stderr, "cuDNN attention %s\n",
                     ReportLine(ShapeOf(key), *entry.graph, entry.timings, entry.plan).c_str());
      }
    }
  }
  if (entry.plan >= 0) {
    return FrontendStatus(entry.graph->execute_plan_at_index(handle, pack, workspace_, entry.plan),
                          "execute");
  }
  return FrontendStatus(entry.graph->execute(handle, pack, workspace_), "execute");
}

absl::Status CudnnAttention::Forward(const void* qkv, DType dtype, int64_t batch, int64_t seq_len,
                                     int64_t heads, int64_t head_size, bool deterministic, void* y,
                                     float* stats) {
  const int64_t C = heads * head_size;
  const int64_t bytes = 2;
  char* base = static_cast<char*>(const_cast<void*>(qkv));
  return Execute({false, dtype, batch, seq_len, heads, head_size, deterministic},
                 {{kQ, base}, {kK, base + C * bytes}, {kV, base + 2 * C * bytes}, {kO, y},
                  {kStats, stats}});
}

absl::Status CudnnAttention::Backward(const void* qkv, const void* y, const void* dy,
                                      const float* stats, DType dtype, int64_t batch,
                                      int64_t seq_len, int64_t heads, int64_t head_size,
                                      bool deterministic, void* dqkv) {
  const int64_t C = heads * head_size;
  const int64_t bytes = 2;
  char* base = static_cast<char*>(const_cast<void*>(qkv));
  char* d_base = static_cast<char*>(dqkv);
  return Execute({true, dtype, batch, seq_len, heads, head_size, deterministic},
                 {{kQ, base},
                  {kK, base + C * bytes},
                  {kV, base + 2 * C * bytes},
                  {kO, const_cast<void*>(y)},
                  {kdO, const_cast<void*>(dy)},
                  {kStats, const_cast<float*>(stats)},
                  {kdQ, d_base},
                  {kdK, d_base + C * bytes},
                  {kdV, d_base + 2 * C * bytes}});
}

}  // namespace mptrain::cuda
