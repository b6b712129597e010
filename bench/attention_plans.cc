// Every cuDNN plan for the GPT's causal attention at one shape, timed: what the training's
// plan choice (backends/cuda/cudnn_attention.h, MPTRAIN_CUDNN_PLANS) picks from, and how far
// the heuristic's first plan is from the fastest. For each heuristic mode (A, B, FALLBACK) it
// lists the plans the mode offers, builds and times each (forward and backward, on the packed
// qkv the training uses) and prints its name, workspace, time and TFLOP/s (the causal half of
// the score products, as AttentionFlops counts).
//
//   attention_plans [B T H hs]...   (default: 32 1024 12 64 and 16 1024 16 64)
//   ATTENTION_DTYPES="bf16 fp16" (default both)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cudnn_attention_graph.h"
#include "bench/cuda_check.h"

namespace {

namespace fe = cudnn_frontend;
using mptrain::DType;
using mptrain::cuda::AttentionShape;

constexpr int kRuns = 20;
constexpr int64_t kMaxWorkspace = int64_t{4} << 30;  // A plan wanting more is not run.

struct Buffers {
  void* qkv = nullptr;
  void* o = nullptr;
  void* d_o = nullptr;
  void* dqkv = nullptr;
  float* stats = nullptr;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

void FillRandom(void* device, int64_t count, DType dtype, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<uint16_t> host(count);
  for (int64_t i = 0; i < count; ++i) {
    const float x = normal(rng);
    if (dtype == DType::kF16) {
      __half h = __float2half(x);
      host[i] = *reinterpret_cast<uint16_t*>(&h);
    } else {
      __nv_bfloat16 b = __float2bfloat16(x);
      host[i] = *reinterpret_cast<uint16_t*>(&b);
    }
  }
  CHECK_CUDA(cudaMemcpy(device, host.data(), count * 2, cudaMemcpyHostToDevice));
}

std::unordered_map<int64_t, void*> Pack(const AttentionShape& s, Buffers& b) {
  using namespace mptrain::cuda;
  const int64_t C = s.heads * s.head_size;
  char* base = static_cast<char*>(b.qkv);
  char* d_base = static_cast<char*>(b.dqkv);
  std::unordered_map<int64_t, void*> pack{{kQ, base},      {kK, base + C * 2},
                                          {kV, base + 4 * C}, {kO, b.o},
                                          {kStats, b.stats}};
  if (s.backward) {
    pack[kdO] = b.d_o;
    pack[kdQ] = d_base;
    pack[kdK] = d_base + C * 2;
    pack[kdV] = d_base + 4 * C;
  }
  return pack;
}

void Grow(Buffers& b, int64_t bytes) {
  if (bytes <= b.workspace_bytes) return;
  if (b.workspace != nullptr) CHECK_CUDA(cudaFree(b.workspace));
  CHECK_CUDA(cudaMalloc(&b.workspace, bytes));
  b.workspace_bytes = bytes;
}

// The fastest and the median of kRuns runs after a warm-up, ms; negative if the plan failed.
std::pair<float, float> Time(fe::graph::Graph& graph, cudnnHandle_t handle, int64_t plan,
                             std::unordered_map<int64_t, void*>& pack, Buffers& b,
                             cudaStream_t stream) {
  if (!graph.execute_plan_at_index(handle, pack, b.workspace, plan).is_good()) return {-1, -1};
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int run = 0; run < kRuns; ++run) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    if (!graph.execute_plan_at_index(handle, pack, b.workspace, plan).is_good()) {
      CHECK_CUDA(cudaEventDestroy(start));
      CHECK_CUDA(cudaEventDestroy(stop));
      return {-1, -1};
    }
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return {times.front(), times[times.size() / 2]};
}

void Survey(const AttentionShape& shape, cudnnHandle_t handle, Buffers& b, cudaStream_t stream) {
  const double flops = mptrain::cuda::AttentionFlops(shape);
  auto pack = Pack(shape, b);
  const std::pair<const char*, fe::HeurMode_t> modes[] = {
      {"A", fe::HeurMode_t::A}, {"B", fe::HeurMode_t::B}, {"FALLBACK", fe::HeurMode_t::FALLBACK}};
  for (const auto& [mode_name, mode] : modes) {
    auto described = mptrain::cuda::DescribeAttention(shape, handle);
    if (!described.ok()) {
      std::printf("%s: %s\n", shape.Name().c_str(), described.status().ToString().c_str());
      return;
    }
    fe::graph::Graph& graph = **described;
    if (!graph.create_execution_plans({mode}).is_good() || !graph.check_support(handle).is_good()) {
      std::printf("%s mode %s: no supported plan\n", shape.Name().c_str(), mode_name);
      continue;
    }
    const int64_t count = graph.get_execution_plan_count();
    std::printf("%s mode %s: %lld plans\n", shape.Name().c_str(), mode_name,
                static_cast<long long>(count));
    for (int64_t i = 0; i < count; ++i) {
      std::string name = "?";
      int64_t bytes = 0;
      if (!graph.build_plan_at_index(handle, i).is_good()) {
        std::printf("  plan %lld: did not build\n", static_cast<long long>(i));
        continue;
      }
      (void)graph.get_plan_name_at_index(i, name);
      (void)graph.get_workspace_size_plan_at_index(i, bytes);
      if (bytes > kMaxWorkspace) {
        std::printf("  plan %lld %s: workspace %lld B, not run\n", static_cast<long long>(i),
                    name.c_str(), static_cast<long long>(bytes));
        continue;
      }
      Grow(b, std::max<int64_t>(bytes, 1));
      const auto [best, median] = Time(graph, handle, i, pack, b, stream);
      if (best < 0) {
        std::printf("  plan %lld %s: failed to run\n", static_cast<long long>(i), name.c_str());
        continue;
      }
      std::printf("  plan %lld %-40s workspace %9lld B  min %.3f ms  median %.3f ms  %.0f TFLOP/s\n",
                  static_cast<long long>(i), name.c_str(), static_cast<long long>(bytes), best,
                  median, flops / (best * 1e-3) / 1e12);
    }
  }
}

const char* KnobName(fe::KnobType_t type) {
  switch (type) {
    case fe::KnobType_t::KERNEL_CFG: return "KERNEL_CFG";
    case fe::KnobType_t::TILE_M: return "TILE_M";
    case fe::KnobType_t::TILE_N: return "TILE_N";
    case fe::KnobType_t::STAGES: return "STAGES";
    case fe::KnobType_t::WARP_SPEC_CFG: return "WARP_SPEC_CFG";
    case fe::KnobType_t::SPLIT_K_SLC: return "SPLIT_K_SLC";
    default: return "other";
  }
}

// ATTENTION_SWEEP=1: past the heuristics' lists, every engine the graph has and, for one with a
// KERNEL_CFG knob, each of its values (at most kMaxSweptValues): configurations no heuristic
// offers, built and timed the same way.
constexpr int kMaxSweptValues = 64;

void Sweep(const AttentionShape& shape, cudnnHandle_t handle, Buffers& b, cudaStream_t stream) {
  const double flops = mptrain::cuda::AttentionFlops(shape);
  auto pack = Pack(shape, b);
  auto described = mptrain::cuda::DescribeAttention(shape, handle);
  if (!described.ok()) return;
  fe::graph::Graph& graph = **described;
  int64_t engines = 0;
  if (!graph.get_engine_count(engines).is_good()) return;
  std::printf("%s sweep: %lld engines\n", shape.Name().c_str(), static_cast<long long>(engines));
  for (int64_t engine = 0; engine < engines; ++engine) {
    std::vector<fe::Knob> knobs;
    if (!graph.get_knobs_for_engine(engine, knobs).is_good()) continue;
    std::string listed;
    const fe::Knob* kernel_cfg = nullptr;
    for (const fe::Knob& knob : knobs) {
      listed += std::string(" ") + KnobName(knob.type) + "[" + std::to_string(knob.minValue) + ".." +
                std::to_string(knob.maxValue) + "/" + std::to_string(knob.stride) + "]";
      if (knob.type == fe::KnobType_t::KERNEL_CFG) kernel_cfg = &knob;
    }
    std::printf("  engine %lld knobs:%s\n", static_cast<long long>(engine), listed.c_str());
    std::vector<std::unordered_map<fe::KnobType_t, int64_t>> configs;
    if (kernel_cfg == nullptr) {
      configs.push_back({});
    } else {
      const int64_t stride = std::max<int64_t>(kernel_cfg->stride, 1);
      for (int64_t v = kernel_cfg->minValue;
           v <= kernel_cfg->maxValue && static_cast<int>(configs.size()) < kMaxSweptValues;
           v += stride) {
        configs.push_back({{fe::KnobType_t::KERNEL_CFG, v}});
      }
    }
    for (const auto& config : configs) {
      const int64_t value = config.empty() ? -1 : config.begin()->second;
      if (!graph.create_execution_plan(engine, config).is_good()) continue;
      const int64_t index = graph.get_execution_plan_count() - 1;
      if (!graph.build_plan_at_index(handle, index).is_good()) continue;
      std::string name = "?";
      int64_t bytes = 0;
      (void)graph.get_plan_name_at_index(index, name);
      (void)graph.get_workspace_size_plan_at_index(index, bytes);
      if (bytes > kMaxWorkspace) continue;
      Grow(b, std::max<int64_t>(bytes, 1));
      const auto [best, median] = Time(graph, handle, index, pack, b, stream);
      if (best < 0) continue;
      std::printf("  engine %lld cfg %lld %-30s workspace %9lld B  min %.3f ms  median %.3f ms  "
                  "%.0f TFLOP/s\n",
                  static_cast<long long>(engine), static_cast<long long>(value), name.c_str(),
                  static_cast<long long>(bytes), best, median, flops / (best * 1e-3) / 1e12);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::vector<int64_t>> shapes;
  for (int i = 1; i + 3 < argc; i += 4) {
    shapes.push_back({std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2]),
                      std::atoll(argv[i + 3])});
  }
  if (shapes.empty()) shapes = {{32, 1024, 12, 64}, {16, 1024, 16, 64}};
  std::vector<DType> dtypes;
  const char* asked = std::getenv("ATTENTION_DTYPES");
  std::istringstream words(asked != nullptr ? asked : "bf16 fp16");
  for (std::string word; words >> word;) {
    if (word == "bf16") dtypes.push_back(DType::kBF16);
    if (word == "fp16") dtypes.push_back(DType::kF16);
  }
  cudnnHandle_t handle = nullptr;
  if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "cudnnCreate failed\n");
    return 1;
  }
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudnnSetStream(handle, stream);
  for (const auto& dims : shapes) {
    const int64_t B = dims[0], T = dims[1], H = dims[2], hs = dims[3];
    if (B <= 0 || T <= 0 || H <= 0 || hs <= 0 || B * T * H * hs > (int64_t{1} << 31)) {
      std::fprintf(stderr, "shape %lld %lld %lld %lld out of range\n", (long long)B, (long long)T,
                   (long long)H, (long long)hs);
      return 1;
    }
    const int64_t C = H * hs;
    for (DType dtype : dtypes) {
      Buffers b;
      CHECK_CUDA(cudaMalloc(&b.qkv, B * T * 3 * C * 2));
      CHECK_CUDA(cudaMalloc(&b.dqkv, B * T * 3 * C * 2));
      CHECK_CUDA(cudaMalloc(&b.o, B * T * C * 2));
      CHECK_CUDA(cudaMalloc(&b.d_o, B * T * C * 2));
      CHECK_CUDA(cudaMalloc(&b.stats, B * H * T * sizeof(float)));
      FillRandom(b.qkv, B * T * 3 * C, dtype, 1.0f, 1);
      FillRandom(b.d_o, B * T * C, dtype, 0.01f, 2);
      AttentionShape forward{false, dtype, B, T, H, hs, false};
      Survey(forward, handle, b, stream);  // Leaves O and the stats the backward reads.
      Survey(AttentionShape{true, dtype, B, T, H, hs, false}, handle, b, stream);
      if (std::getenv("ATTENTION_SWEEP") != nullptr) {
        Sweep(forward, handle, b, stream);
        Survey(forward, handle, b, stream);  // The stats again, from a heuristic plan.
        Sweep(AttentionShape{true, dtype, B, T, H, hs, false}, handle, b, stream);
      }
      for (void* p : {b.qkv, b.dqkv, b.o, b.d_o, static_cast<void*>(b.stats), b.workspace}) {
        if (p != nullptr) CHECK_CUDA(cudaFree(p));
      }
    }
  }
  cudnnDestroy(handle);
  return 0;
}
