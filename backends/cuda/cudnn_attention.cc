#include "backends/cuda/cudnn_attention.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace mptrain::cuda {
namespace {

namespace fe = cudnn_frontend;

// The tensors of both graphs, by uid (the variant pack's keys).
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

absl::Status FrontendStatus(fe::error_object error, const char* what) {
  if (error.is_good()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuDNN attention: ", what, ": ", error.get_message()));
}

fe::DataType_t FrontendType(DType dtype) {
  return dtype == DType::kF16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

// Head h of row (b, t) of a [B·T, width] buffer, as the [B, H, T, hs] tensor cuDNN reads:
// strides (T·width, hs, width, 1).
std::vector<int64_t> Strides(int64_t seq_len, int64_t head_size, int64_t width) {
  return {seq_len * width, head_size, width, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> Input(fe::graph::Graph& graph, const char* name,
                                                    Uid uid, int64_t B, int64_t H, int64_t T,
                                                    int64_t hs, int64_t width) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({B, H, T, hs})
                          .set_stride(Strides(T, hs, width)));
}

}  // namespace

struct CudnnAttention::Graphs {
  std::map<Key, std::shared_ptr<fe::graph::Graph>> built;
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

absl::StatusOr<void*> CudnnAttention::GraphFor(const Key& key) {
  if (auto it = graphs_->built.find(key); it != graphs_->built.end()) return it->second.get();
  const auto [backward, dtype, B, T, H, hs, deterministic] = key;
  const int64_t C = H * hs;
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(FrontendType(dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = Input(*graph, "Q", kQ, B, H, T, hs, 3 * C);
  auto k = Input(*graph, "K", kK, B, H, T, hs, 3 * C);
  auto v = Input(*graph, "V", kV, B, H, T, hs, 3 * C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::vector<int64_t> stats_dim{B, H, T, 1}, stats_stride{H * T, T, 1, 1};
  if (!backward) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("causal_attention")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(scale);
    auto [o, stats] = graph->sdpa(q, k, v, options);
    o->set_output(true).set_uid(kO).set_dim({B, H, T, hs}).set_stride(Strides(T, hs, C));
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim)
        .set_stride(stats_stride);
  } else {
    auto o = Input(*graph, "O", kO, B, H, T, hs, C);
    auto d_o = Input(*graph, "dO", kdO, B, H, T, hs, C);
    auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(kStats)
                                   .set_dim(stats_dim)
                                   .set_stride(stats_stride)
                                   .set_data_type(fe::DataType_t::FLOAT));
    // Deterministic: the same gradients on every run (dQ without atomics); otherwise the
    // fused flash backward (header comment).
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("causal_attention_backward")
                       .set_causal_mask(true)
                       .set_attn_scale(scale)
                       .set_deterministic_algorithm(deterministic);
    auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, d_o, stats, options);
    dq->set_output(true).set_uid(kdQ).set_dim({B, H, T, hs}).set_stride(Strides(T, hs, 3 * C));
    dk->set_output(true).set_uid(kdK).set_dim({B, H, T, hs}).set_stride(Strides(T, hs, 3 * C));
    dv->set_output(true).set_uid(kdV).set_dim({B, H, T, hs}).set_stride(Strides(T, hs, 3 * C));
  }
  cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  const std::string shape =
      absl::StrCat(backward ? (deterministic ? "deterministic backward" : "backward") : "forward",
                   " B=", B, " T=", T, " H=", H, " hs=", hs);
  if (absl::Status s = FrontendStatus(graph->validate(), shape.c_str()); !s.ok()) return s;
  if (absl::Status s = FrontendStatus(graph->build_operation_graph(handle), shape.c_str());
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          FrontendStatus(graph->create_execution_plans({fe::HeurMode_t::A}), shape.c_str());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = FrontendStatus(graph->check_support(handle), shape.c_str()); !s.ok()) {
    return s;
  }
  if (absl::Status s = FrontendStatus(graph->build_plans(handle), shape.c_str()); !s.ok()) {
    return s;
  }
  int64_t workspace = 0;
  if (absl::Status s = FrontendStatus(graph->get_workspace_size(workspace), shape.c_str());
      !s.ok()) {
    return s;
  }
  if (workspace > workspace_bytes_) {
    // Work queued may still use the old workspace.
    if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
      return absl::InternalError(absl::StrCat("cuDNN attention: ", cudaGetErrorString(e)));
    }
    if (workspace_ != nullptr) cudaFree(workspace_);
    workspace_ = nullptr;
    workspace_bytes_ = 0;
    if (cudaError_t e = cudaMalloc(&workspace_, workspace); e != cudaSuccess) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuDNN attention: its workspace of ", workspace, " bytes: ", cudaGetErrorString(e)));
    }
    workspace_bytes_ = workspace;
    workspace_changed_ = true;
  }
  graphs_->built.emplace(key, graph);
  return graph.get();
}

absl::Status CudnnAttention::Execute(const Key& key, const std::map<int64_t, void*>& pointers) {
  auto graph = GraphFor(key);
  if (!graph.ok()) return graph.status();
  cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  if (cudnnStatus_t s = cudnnSetStream(handle, stream_); s != CUDNN_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cudnnSetStream: ", cudnnGetErrorString(s)));
  }
  std::unordered_map<int64_t, void*> pack(pointers.begin(), pointers.end());
  return FrontendStatus(
      static_cast<fe::graph::Graph*>(*graph)->execute(handle, pack, workspace_), "execute");
}

absl::Status CudnnAttention::Forward(const void* qkv, DType dtype, int64_t batch, int64_t seq_len,
                                     int64_t heads, int64_t head_size, void* y, float* stats) {
  const int64_t C = heads * head_size;
  const int64_t bytes = 2;
  char* base = static_cast<char*>(const_cast<void*>(qkv));
  return Execute({false, dtype, batch, seq_len, heads, head_size, false},
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
