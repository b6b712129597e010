// Measures every algorithm cuBLASLt's heuristic offers for the GEMMs a training step of an MLP
// issues (the layouts CudaBackend uses: forward with its bias/ReLU epilogue, the data gradient,
// the weight gradient, and the fused ReLU-backward + bias-gradient epilogue), and whether each
// algorithm's output is bitwise equal to the heuristic's first choice. This is what decides
// whether a measured algorithm choice can change numerics (BENCHMARKS.md, issue 16).
//
//   gemm_algos --rows=4096 --width=8192 --algos=16 --iters=10
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
#include "bench/cuda_check.h"

ABSL_FLAG(int64_t, rows, 4096, "Rows of a micro-batch (GEMM M of the data side)");
ABSL_FLAG(int64_t, width, 8192, "Layer width (in = out features)");
ABSL_FLAG(int, algos, 16, "Heuristic results to ask for per GEMM");
ABSL_FLAG(int, iters, 10, "Timed launches per algorithm");
ABSL_FLAG(std::string, dtype, "f16", "f16 or bf16");

namespace {

constexpr size_t kWorkspace = 64 << 20;

struct Case {
  const char* name;
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldd;
  cublasLtEpilogue_t epilogue;
};

void* DeviceRandom(size_t elements, cudaDataType_t type, uint64_t seed, float scale) {
  std::vector<uint16_t> host(elements);
  uint64_t state = seed;
  for (size_t i = 0; i < elements; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>((state >> 40) & 0xffffff) / 16777216.0f - 0.5f;
    const float v = u * scale;
    if (type == CUDA_R_16F) {
      __half h = __float2half(v);
      std::memcpy(&host[i], &h, 2);
    } else {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      host[i] = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
    }
  }
  void* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, elements * 2));
  CHECK_CUDA(cudaMemcpy(device, host.data(), elements * 2, cudaMemcpyHostToDevice));
  return device;
}

void Attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* value,
          size_t size) {
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, attr, value, size));
}

int ConfigValue(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t value = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return -1;
  }
  return static_cast<int>(value);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t rows = absl::GetFlag(FLAGS_rows), width = absl::GetFlag(FLAGS_width);
  const cudaDataType_t type = absl::GetFlag(FLAGS_dtype) == "bf16" ? CUDA_R_16BF : CUDA_R_16F;
  const int iters = absl::GetFlag(FLAGS_iters);
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, kWorkspace));
  // Row-major x[rows, width], w[width, width], dy[rows, width]; outputs [rows, width] or
  // [width, width]. Column-major views as in CudaBackend.
  void* x = DeviceRandom(rows * width, type, 1, 2.0f);
  void* w = DeviceRandom(width * width, type, 2, 0.05f);
  void* dy = DeviceRandom(rows * width, type, 3, 0.01f);
  void* bias = DeviceRandom(width, type, 4, 0.1f);
  void* out = nullptr;
  void* reference = nullptr;
  const size_t out_elements = std::max(rows, width) * width;
  CHECK_CUDA(cudaMalloc(&out, out_elements * 2));
  CHECK_CUDA(cudaMalloc(&reference, out_elements * 2));
  const int64_t aux_ld = (width + 127) / 128 * 128;  // Bits per column of the ReLU mask.
  void* aux = nullptr;
  CHECK_CUDA(cudaMalloc(&aux, aux_ld / 8 * rows));
  void* bgrad = nullptr;
  CHECK_CUDA(cudaMalloc(&bgrad, width * 4));
  const std::vector<Case> cases = {
      {"forward bias+relu", true, false, width, rows, width, width, width, width,
       CUBLASLT_EPILOGUE_RELU_BIAS},
      {"forward bias+relu+aux mask", true, false, width, rows, width, width, width, width,
       CUBLASLT_EPILOGUE_RELU_AUX_BIAS},
      {"forward bias", true, false, width, rows, width, width, width, width,
       CUBLASLT_EPILOGUE_BIAS},
      {"data gradient", false, false, width, rows, width, width, width, width,
       CUBLASLT_EPILOGUE_DEFAULT},
      {"data gradient drelu+bgrad", false, false, width, rows, width, width, width, width,
       CUBLASLT_EPILOGUE_DRELU_BGRAD},
      {"weight gradient", false, true, width, width, rows, width, width, width,
       CUBLASLT_EPILOGUE_DEFAULT},
  };
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::printf("gemm_algos rows=%ld width=%ld dtype=%s\n", long(rows), long(width),
              absl::GetFlag(FLAGS_dtype).c_str());
  // Fill the aux mask once with a real forward.
  for (const Case& c : cases) {
    cublasLtMatmulDesc_t desc;
    CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    Attr(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a));
    Attr(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b));
    Attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epilogue, sizeof(c.epilogue));
    if (c.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
      Attr(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type));
      void* bias_pointer = c.epilogue == CUBLASLT_EPILOGUE_DRELU_BGRAD ? bgrad : bias;
      Attr(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer, sizeof(bias_pointer));
    }
    if (c.epilogue == CUBLASLT_EPILOGUE_RELU_AUX_BIAS ||
        c.epilogue == CUBLASLT_EPILOGUE_DRELU_BGRAD) {
      Attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux));
      Attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, type, c.ta ? c.k : c.m, c.ta ? c.m : c.k, c.lda));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, type, c.tb ? c.n : c.k, c.tb ? c.k : c.n, c.ldb));
    CHECK_LT(cublasLtMatrixLayoutCreate(&ld, type, c.m, c.n, c.ldd));
    cublasLtMatmulPreference_t preference;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&preference));
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace, sizeof(kWorkspace)));
    std::vector<cublasLtMatmulHeuristicResult_t> results(absl::GetFlag(FLAGS_algos));
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, preference,
                                                           int(results.size()), results.data(),
                                                           &found);
    std::printf("\n%s (column-major %s%s m=%ld n=%ld k=%ld): %d algorithms (status %d)\n", c.name,
                c.ta ? "T" : "N", c.tb ? "T" : "N", long(c.m), long(c.n), long(c.k), found,
                int(status));
    std::printf("  #  id  tile stages splitK red swz cluster  workspace   TFLOP/s  bitwise=#0\n");
    const void* a = c.ta ? w : (c.tb ? x : w);
    const void* b = c.ta ? x : dy;
    const double flop = 2.0 * c.m * c.n * c.k;
    const size_t d_bytes = c.m * c.n * 2;
    for (int i = 0; i < found; ++i) {
      const float alpha = 1.0f, beta = 0.0f;
      auto launch = [&] {
        return cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, out, ld, out, ld,
                              &results[i].algo, workspace, kWorkspace, stream);
      };
      bool ok = true;
      for (int warm = 0; warm < 2 && ok; ++warm) ok = launch() == CUBLAS_STATUS_SUCCESS;
      if (!ok) {
        std::printf("  %2d  launch failed\n", i);
        continue;
      }
      CHECK_CUDA(cudaEventRecord(start, stream));
      for (int it = 0; it < iters; ++it) launch();
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      const double tflops = flop * iters / (ms * 1e-3) / 1e12;
      if (i == 0) CHECK_CUDA(cudaMemcpy(reference, out, d_bytes, cudaMemcpyDeviceToDevice));
      std::vector<uint16_t> got(c.m * c.n), want(c.m * c.n);
      CHECK_CUDA(cudaMemcpy(got.data(), out, d_bytes, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(want.data(), reference, d_bytes, cudaMemcpyDeviceToHost));
      int64_t differ = 0;
      for (size_t e = 0; e < got.size(); ++e) differ += got[e] != want[e];
      const cublasLtMatmulAlgo_t& algo = results[i].algo;
      std::printf("  %2d %3d %5d %6d %6d %3d %3d %7d %10zu %9.1f  %s\n", i,
                  ConfigValue(algo, CUBLASLT_ALGO_CONFIG_ID),
                  ConfigValue(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                  ConfigValue(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                  ConfigValue(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                  ConfigValue(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                  ConfigValue(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                  ConfigValue(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                  results[i].workspaceSize, tflops,
                  differ == 0 ? "yes" : (std::to_string(differ) + " differ").c_str());
    }
    cublasLtMatmulPreferenceDestroy(preference);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
  }
  return 0;
}
