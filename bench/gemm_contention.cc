// What a collective's resident blocks do to the GEMMs beside them, on one GPU (issue 16). On 2
// GPUs NCCL's allreduce of each gradient bucket runs while the stepping micro-batch's backward
// GEMMs do, and costs 0.7–2.5 ms per mlp8k step more than its own time. The suspicion: a cuBLASLt
// GEMM is launched as one wave of blocks sized for every SM, so blocks that find their SM taken
// by the collective wait, and the GEMM ends late. cuBLASLt's SM_COUNT_TARGET sizes the GEMM for
// fewer SMs. Here an occupier kernel (bench/sm_occupier.h: `ctas` resident blocks copying
// memory, as NCCL's channels do) stands in for the allreduce: launched beside every second GEMM
// of mlp8k's backward (data and weight gradients alternating), with and without the GEMMs'
// target of (SMs - ctas); also whether the targeted GEMM's output is bitwise the full one's.
//
//   gemm_contention --ctas=16,32 --occupier_ms=0.75
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/cuda_check.h"
#include "bench/sm_occupier.h"

ABSL_FLAG(int64_t, rows, 4096, "Rows of a micro-batch");
ABSL_FLAG(int64_t, width, 8192, "Layer width (in = out features)");
ABSL_FLAG(int, gemms, 8, "GEMMs per timed sequence (data and weight gradients alternating)");
ABSL_FLAG(std::string, ctas, "16,32", "Occupier block counts to try");
ABSL_FLAG(double, occupier_ms, 0.75, "How long one occupier launch runs alone");
ABSL_FLAG(int, iters, 5, "Timed sequences per measurement");

namespace {

constexpr size_t kWorkspace = 64 << 20;

void* DeviceRandom(size_t elements, uint64_t seed, float scale) {
  std::vector<__half> host(elements);
  uint64_t state = seed;
  for (size_t i = 0; i < elements; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    host[i] = __float2half((static_cast<float>((state >> 40) & 0xffffff) / 16777216.0f - 0.5f) *
                           scale);
  }
  void* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, elements * 2));
  CHECK_CUDA(cudaMemcpy(device, host.data(), elements * 2, cudaMemcpyHostToDevice));
  return device;
}

// One GEMM of the backward, planned with cuBLASLt's first heuristic choice.
struct Gemm {
  bool tb = false;  // false: the data gradient (N, N); true: the weight gradient (N, T).
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo;
};

Gemm Plan(cublasLtHandle_t lt, bool weight_gradient, int64_t rows, int64_t width, const void* w,
          const void* x, const void* dy, void* out, int sm_target) {
  Gemm g;
  g.tb = weight_gradient;
  // Column-major, as CudaBackend::LinearBackward issues them.
  g.m = width;
  g.n = weight_gradient ? width : rows;
  g.k = weight_gradient ? rows : width;
  g.a = weight_gradient ? x : w;
  g.b = dy;
  g.d = out;
  CHECK_LT(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_n = CUBLAS_OP_N, op_b = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CHECK_LT(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_n,
                                          sizeof(op_n)));
  CHECK_LT(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                          sizeof(op_b)));
  if (sm_target > 0) {
    CHECK_LT(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                            &sm_target, sizeof(sm_target)));
  }
  CHECK_LT(cublasLtMatrixLayoutCreate(&g.la, CUDA_R_16F, g.m, g.k, g.m));
  CHECK_LT(cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_16F, g.tb ? g.n : g.k, g.tb ? g.k : g.n,
                                      g.tb ? g.n : g.k));
  CHECK_LT(cublasLtMatrixLayoutCreate(&g.ld, CUDA_R_16F, g.m, g.n, g.m));
  cublasLtMatmulPreference_t preference;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&preference));
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace, sizeof(kWorkspace)));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, g.desc, g.la, g.lb, g.ld, g.ld, preference, 1,
                                          &result, &found));
  cublasLtMatmulPreferenceDestroy(preference);
  if (found < 1) {
    std::fprintf(stderr, "no cuBLASLt algorithm (sm target %d)\n", sm_target);
    std::exit(1);
  }
  g.algo = result.algo;
  return g;
}

void Run(cublasLtHandle_t lt, const Gemm& g, void* workspace, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  CHECK_LT(cublasLtMatmul(lt, g.desc, &alpha, g.a, g.la, g.b, g.lb, &beta, g.d, g.ld, g.d, g.ld,
                          &g.algo, workspace, kWorkspace, stream));
}

int TileId(const cublasLtMatmulAlgo_t& algo) {
  uint32_t value = 0;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &value,
                                       sizeof(value), &written);
  return static_cast<int>(value);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t rows = absl::GetFlag(FLAGS_rows), width = absl::GetFlag(FLAGS_width);
  const int gemms = absl::GetFlag(FLAGS_gemms), iters = absl::GetFlag(FLAGS_iters);
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  cudaStream_t compute, side;
  CHECK_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, kWorkspace));
  void* x = DeviceRandom(rows * width, 1, 2.0f);
  void* w = DeviceRandom(width * width, 2, 0.05f);
  void* dy = DeviceRandom(rows * width, 3, 0.01f);
  const size_t out_bytes = std::max(rows, width) * width * 2;
  void* out = nullptr;
  void* reference = nullptr;
  CHECK_CUDA(cudaMalloc(&out, out_bytes));
  CHECK_CUDA(cudaMalloc(&reference, out_bytes));
  const int64_t occupier_elements = int64_t{16} << 20;  // 64 MiB each way.
  float* occupier_src = nullptr;
  float* occupier_dst = nullptr;
  CHECK_CUDA(cudaMalloc(&occupier_src, occupier_elements * 4));
  CHECK_CUDA(cudaMalloc(&occupier_dst, occupier_elements * 4));
  CHECK_CUDA(cudaMemset(occupier_src, 0, occupier_elements * 4));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<cudaEvent_t> marks(gemms);
  for (cudaEvent_t& mark : marks) CHECK_CUDA(cudaEventCreateWithFlags(&mark, cudaEventDisableTiming));

  auto time_ms = [&](auto&& sequence) {
    sequence();  // warm-up
    CHECK_CUDA(cudaStreamSynchronize(compute));
    CHECK_CUDA(cudaStreamSynchronize(side));
    CHECK_CUDA(cudaEventRecord(start, compute));
    CHECK_CUDA(cudaStreamWaitEvent(side, start));
    for (int i = 0; i < iters; ++i) sequence();
    CHECK_CUDA(cudaEventRecord(marks[0], side));
    CHECK_CUDA(cudaStreamWaitEvent(compute, marks[0]));
    CHECK_CUDA(cudaEventRecord(stop, compute));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return ms / iters;
  };
  auto plans = [&](int sm_target) {
    return std::vector<Gemm>{Plan(lt, false, rows, width, w, x, dy, out, sm_target),
                             Plan(lt, true, rows, width, w, x, dy, out, sm_target)};
  };
  // The backward's GEMMs; with `ctas` > 0, an occupier beside every second one, each started
  // when the GEMM before it is done (as a bucket's allreduce starts when its gradient is).
  auto backward = [&](const std::vector<Gemm>& plan, int ctas, int repeats) {
    return [&, ctas, repeats, plan] {
      for (int i = 0; i < gemms; ++i) {
        if (ctas > 0 && i % 2 == 1) {
          CHECK_CUDA(cudaEventRecord(marks[i], compute));
          CHECK_CUDA(cudaStreamWaitEvent(side, marks[i]));
          CHECK_CUDA(mptrain::bench::LaunchOccupier(occupier_src, occupier_dst,
                                                    occupier_elements, ctas, repeats, side));
        }
        Run(lt, plan[i % 2], workspace, compute);
      }
    };
  };

  const std::vector<Gemm> full = plans(0);
  const double flop = 2.0 * rows * width * width * gemms;
  const float alone = time_ms(backward(full, 0, 0));
  std::printf("gemm_contention rows=%ld width=%ld, %d SMs, %d GEMMs per sequence\n", long(rows),
              long(width), sms, gemms);
  std::printf("GEMMs alone, every SM: %.3f ms (%.0f TFLOP/s), tiles %d / %d\n", alone,
              flop / (alone * 1e-3) / 1e12, TileId(full[0].algo), TileId(full[1].algo));
  std::printf("%5s %9s %11s %11s %13s %13s %15s %9s\n", "ctas", "occ. ms", "GEMMs full",
              "GEMMs tgt", "both, full", "both, tgt", "tgt tiles", "bitwise");
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_ctas), ',')) {
    int ctas = 0;
    if (!absl::SimpleAtoi(text, &ctas) || ctas < 1 || ctas >= sms) continue;
    // Calibrate the occupier: `repeats` copies last about occupier_ms alone.
    const float one = time_ms([&] {
      CHECK_CUDA(mptrain::bench::LaunchOccupier(occupier_src, occupier_dst, occupier_elements,
                                                ctas, 1, side));
    });
    const int repeats =
        std::max(1, static_cast<int>(absl::GetFlag(FLAGS_occupier_ms) / std::max(one, 1e-3f)));
    const float occupier = time_ms([&] {
      CHECK_CUDA(mptrain::bench::LaunchOccupier(occupier_src, occupier_dst, occupier_elements,
                                                ctas, repeats, side));
    });
    const std::vector<Gemm> targeted = plans(sms - ctas);
    const float targeted_alone = time_ms(backward(targeted, 0, 0));
    const float both_full = time_ms(backward(full, ctas, repeats));
    const float both_targeted = time_ms(backward(targeted, ctas, repeats));
    // Bitwise: each targeted GEMM's output against the full one's.
    std::string bitwise = "yes";
    for (int kind = 0; kind < 2; ++kind) {
      const size_t bytes = full[kind].m * full[kind].n * 2;
      Run(lt, full[kind], workspace, compute);
      CHECK_CUDA(cudaMemcpyAsync(reference, out, bytes, cudaMemcpyDeviceToDevice, compute));
      Run(lt, targeted[kind], workspace, compute);
      CHECK_CUDA(cudaStreamSynchronize(compute));
      std::vector<uint16_t> got(bytes / 2), want(bytes / 2);
      CHECK_CUDA(cudaMemcpy(got.data(), out, bytes, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(want.data(), reference, bytes, cudaMemcpyDeviceToHost));
      int64_t differ = 0;
      for (size_t e = 0; e < got.size(); ++e) differ += got[e] != want[e];
      if (differ != 0) bitwise = std::to_string(differ) + " differ";
    }
    std::printf("%5d %9.3f %11.3f %11.3f %13.3f %13.3f %7d / %5d %9s\n", ctas, occupier, alone,
                targeted_alone, both_full, both_targeted, TileId(targeted[0].algo),
                TileId(targeted[1].algo), bitwise.c_str());
  }
  std::printf("(occ. ms: one occupier launch alone; %d launches per sequence. both: the GEMMs "
              "with the occupiers beside them)\n", gemms / 2);
  return 0;
}
