// The CUDA backend's language-model primitives and GPT training against the CPU backend (proven
// against PyTorch in CI: parity/gpt_parity_test). Needs a GPU: skips with the reason on
// machines without one (CI); run on the GPU machine with scripts/device_run.sh.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_collectives.h"
#include "trainer/model/gpt_model.h"
#include "trainer/precision.h"
#include "trainer/train_loop.h"

namespace mptrain::cuda {
namespace {

int VisibleGpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

#define REQUIRE_GPU()                                                                \
  if (VisibleGpus() < 1) {                                                           \
    GTEST_SKIP() << "needs 1 CUDA GPU(s), 0 visible: runs on the GPU machine "       \
                    "(scripts/device_run.sh)";                                       \
  }

std::unique_ptr<CudaBackend> Gpu() {
  auto backend = CudaBackend::Create(
      0,
      [](cudaStream_t) -> absl::StatusOr<std::unique_ptr<Collective>> {
        return std::unique_ptr<Collective>(new testing::SingleRankCollective());
      },
      60'000);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& v : values) v = normal(generator);
  return values;
}

std::vector<float> Rounded(std::vector<float> values, DType dtype) {
  for (float& v : values) v = RoundTo(dtype, v);
  return values;
}

// A tensor of `values` on `backend`.
Tensor Put(Backend* backend, DType dtype, int64_t rows, int64_t cols,
           const std::vector<float>& values) {
  absl::StatusOr<Tensor> t = backend->Allocate(dtype, rows, cols);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!values.empty()) {
    EXPECT_TRUE(backend->Upload(values.data(), *t).ok());
  }
  return *t;
}

std::vector<float> Get(Backend* backend, Tensor t) {
  std::vector<float> host(t.numel());
  absl::Status status = backend->Download(t, host.data());
  EXPECT_TRUE(status.ok()) << status;
  return host;
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

TEST(LanguageModelOps, AddAndEmbeddings_MatchTheCpuBackendBitForBit) {
  REQUIRE_GPU();
  auto gpu = Gpu();
  CpuBackend cpu(std::make_unique<testing::SingleRankCollective>());
  const int64_t V = 37, T = 5, C = 24, rows = 4 * T;
  const std::vector<float> wte = Random(V * C, 1), wpe = Random(T * C, 2), dout = Random(rows * C, 3);
  std::vector<float> ids(rows);
  for (int64_t r = 0; r < rows; ++r) ids[r] = static_cast<float>((r * 7 + r / 3) % 5 * 6 % V);
  std::vector<float> embedded[2], dwte[2], dwpe[2], sum[2];
  Backend* backends[2] = {gpu.get(), &cpu};
  for (int i = 0; i < 2; ++i) {
    Backend* b = backends[i];
    Tensor t_ids = Put(b, DType::kF32, rows, 1, ids), t_wte = Put(b, DType::kF32, V, C, wte);
    Tensor t_wpe = Put(b, DType::kF32, T + 3, C, Random((T + 3) * C, 2));
    Tensor out = Put(b, DType::kF32, rows, C, {});
    ASSERT_TRUE(b->EmbeddingForward(t_ids, t_wte, t_wpe, T, out).ok());
    embedded[i] = Get(b, out);
    // Accumulated onto existing gradients, then overwritten: both modes.
    Tensor g_wte = Put(b, DType::kF32, V, C, Random(V * C, 4));
    Tensor g_wpe = Put(b, DType::kF32, T + 3, C, Random((T + 3) * C, 5));
    Tensor t_dout = Put(b, DType::kF32, rows, C, dout);
    ASSERT_TRUE(b->EmbeddingBackward(t_ids, t_dout, T, g_wte, g_wpe, false, false).ok());
    ASSERT_TRUE(b->EmbeddingBackward(t_ids, t_dout, T, g_wte, g_wpe, false, false).ok());
    dwte[i] = Get(b, g_wte);
    dwpe[i] = Get(b, g_wpe);
    Tensor low = Put(b, DType::kBF16, rows, C, {});
    ASSERT_TRUE(b->Add(out, t_dout, low).ok());
    sum[i] = Get(b, low);
  }
  EXPECT_EQ(embedded[0], embedded[1]);
  EXPECT_EQ(dwte[0], dwte[1]);
  EXPECT_EQ(dwpe[0], dwpe[1]);
  EXPECT_EQ(sum[0], sum[1]);
}

// The device's draws are the host's (normal_draws.h): every element written, equal but where
// CUDA's double log / cos / sin and the host's land on opposite sides of a float rounding
// boundary (then one float ulp apart); a GPT initialised on either backend is the same model.
TEST(LanguageModelOps, FillNormal_IsTheHostsDrawsOfEachIndex) {
  REQUIRE_GPU();
  auto gpu = Gpu();
  CpuBackend cpu(std::make_unique<testing::SingleRankCollective>());
  const int64_t n = (int64_t{3} << 20) + 5, first = (int64_t{5} << 32) + 3;
  Tensor on_gpu = Put(gpu.get(), DType::kF32, 1, n, std::vector<float>(n, std::nanf("")));
  ASSERT_TRUE(gpu->FillNormal(on_gpu, 11, first, 0.02).ok());
  const std::vector<float> got = Get(gpu.get(), on_gpu);
  std::vector<float> want(n);
  FillNormalOnHost(11, first, 0.02, want.data(), n);
  int64_t unequal = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i << " unwritten";
    if (got[i] != want[i]) {
      ++unequal;
      EXPECT_EQ(std::nextafter(want[i], got[i]), got[i]) << "element " << i << ": " << got[i]
                                                         << " vs " << want[i];
    }
  }
  std::printf("FillNormal: %ld of %ld values one float ulp from the host's\n", unequal, n);
  EXPECT_LE(unequal, 16);
  EXPECT_EQ(gpu->FillNormal(on_gpu, 11, -1, 0.02).code(), absl::StatusCode::kInvalidArgument);

  GptConfig config;
  config.vocab_size = 1000, config.padded_vocab_size = 1024, config.context_length = 64;
  config.layers = 2, config.heads = 4, config.width = 128;
  auto gpu_model = GptModel::Create(gpu.get(), config, DType::kBF16, 1, 1);
  auto cpu_model = GptModel::Create(&cpu, config, DType::kBF16, 1, 1);
  ASSERT_TRUE(gpu_model.ok() && cpu_model.ok());
  ASSERT_TRUE((*gpu_model)->InitializeParameters(5).ok());
  ASSERT_TRUE((*cpu_model)->InitializeParameters(5).ok());
  const std::vector<float> gpu_init = Get(gpu.get(), (*gpu_model)->params());
  const std::vector<float> cpu_init = Get(&cpu, (*cpu_model)->params());
  EXPECT_LT(RelativeError(gpu_init, cpu_init), 1e-7);
  int64_t differ = 0;
  for (size_t i = 0; i < gpu_init.size(); ++i) differ += gpu_init[i] != cpu_init[i];
  EXPECT_LE(differ, 4) << "of " << gpu_init.size();
}

struct AttentionCase {
  DType dtype;
  int64_t batch, seq, heads, head_size;
  double tolerance;  // Relative error against the CPU backend in fp32 on the same inputs.
};

class Attention : public ::testing::TestWithParam<AttentionCase> {};

// fp32: our kernels; fp16/bf16: cuDNN's fused attention, against the CPU's fp32 attention on the
// same (rounded) inputs: its error is the low dtype's rounding of y and dqkv, no more.
TEST_P(Attention, ForwardAndBackwardMatchTheFp32Reference) {
  REQUIRE_GPU();
  const AttentionCase c = GetParam();
  auto gpu = Gpu();
  CpuBackend cpu(std::make_unique<testing::SingleRankCollective>());
  const int64_t C = c.heads * c.head_size, N = c.batch * c.seq;
  const std::vector<float> qkv = Rounded(Random(N * 3 * C, 11), c.dtype);
  const std::vector<float> dy = Rounded(Random(N * C, 12, 0.1f), c.dtype);
  std::vector<float> y[2], dqkv[2];
  Backend* backends[2] = {gpu.get(), &cpu};
  const DType dtypes[2] = {c.dtype, DType::kF32};
  for (int i = 0; i < 2; ++i) {
    Backend* b = backends[i];
    const DType dtype = dtypes[i];
    const auto [saved_rows, saved_cols] = b->AttentionSavedShape(dtype, c.batch, c.heads, c.seq);
    Tensor t_qkv = Put(b, dtype, N, 3 * C, qkv), t_y = Put(b, dtype, N, C, {});
    Tensor saved = Put(b, DType::kF32, saved_rows, saved_cols, {});
    absl::Status forward = b->CausalAttentionForward(t_qkv, c.batch, c.heads, saved, t_y);
    ASSERT_TRUE(forward.ok()) << forward;
    y[i] = Get(b, t_y);
    Tensor t_dy = Put(b, dtype, N, C, dy), t_dqkv = Put(b, dtype, N, 3 * C, {});
    absl::Status backward =
        b->CausalAttentionBackward(t_qkv, saved, t_y, t_dy, c.batch, c.heads, t_dqkv);
    ASSERT_TRUE(backward.ok()) << backward;
    dqkv[i] = Get(b, t_dqkv);
  }
  const double y_error = RelativeError(y[0], y[1]), d_error = RelativeError(dqkv[0], dqkv[1]);
  std::printf("attention dtype %d B=%ld T=%ld H=%ld hs=%ld: y error %.3g, dqkv error %.3g\n",
              static_cast<int>(c.dtype), c.batch, c.seq, c.heads, c.head_size, y_error, d_error);
  EXPECT_LT(y_error, c.tolerance);
  EXPECT_LT(d_error, c.tolerance);
}

INSTANTIATE_TEST_SUITE_P(Cases, Attention,
                         ::testing::Values(AttentionCase{DType::kF32, 2, 33, 3, 8, 1e-5},
                                           AttentionCase{DType::kF32, 1, 130, 2, 64, 1e-5},
                                           AttentionCase{DType::kBF16, 2, 64, 4, 64, 1e-2},
                                           AttentionCase{DType::kF16, 2, 64, 4, 64, 2e-3},
                                           AttentionCase{DType::kBF16, 1, 256, 2, 32, 1e-2}));

// CrossEntropyLoss's composed path over x [R, V] (contiguous) on `b`: log-softmax, the
// smoothed one-hot targets, their product summed into metrics[0] (÷ -R, then ÷ then_divide),
// the correct count into metrics[1], and the gradient coef · (p - q) · scale / seed_divisor in
// x's dtype — what the fused SoftmaxCrossEntropy must reproduce.
struct ComposedCrossEntropy {
  Tensor gradient;
  Tensor metrics;
};
ComposedCrossEntropy Composed(Backend* b, Tensor x, Tensor ids, float on, float off,
                              float then_divide, float coef, StepStateBuffer state,
                              float seed_divisor) {
  const int64_t R = x.rows, V = x.cols;
  Tensor log_p = Put(b, DType::kF32, R, V, {}), q = Put(b, DType::kF32, R, V, {});
  Tensor p = Put(b, DType::kF32, R, V, {}), g32 = Put(b, DType::kF32, R, V, {});
  ComposedCrossEntropy out{Put(b, x.dtype, R, V, {}), Put(b, DType::kF32, 1, 2, {})};
  EXPECT_TRUE(b->LogSoftmaxRows(x, log_p).ok());
  EXPECT_TRUE(b->SmoothedOneHot(ids, on, off, q).ok());
  EXPECT_TRUE(b->SumProduct(q, log_p, -static_cast<double>(R), then_divide,
                            out.metrics.FlatView(0, 1, 1)).ok());
  EXPECT_TRUE(b->CountArgmaxMatches(x, ids, out.metrics.FlatView(1, 1, 1)).ok());
  EXPECT_TRUE(b->Exp(log_p, p).ok());
  EXPECT_TRUE(b->ScaledDifference(p, q, coef, state, seed_divisor, g32).ok());
  EXPECT_TRUE(b->Cast(g32, out.gradient).ok());
  return out;
}

// The fused loss against the composed ops on the same backend (CrossEntropyLoss's other path):
// the gradient bit for bit, the count exactly, the loss to its last bits.
TEST(LanguageModelOps, SoftmaxCrossEntropy_MatchesTheComposedOps) {
  REQUIRE_GPU();
  auto gpu = Gpu();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (float smoothing : {0.0f, 0.1f}) {
      const int64_t R = 19, V = 1031;
      const float on = 1.0f - smoothing, off = smoothing / V;
      std::vector<float> logits = Rounded(Random(R * V, 21, 3.0f), dtype);
      logits[5 * V + 3] = 40.0f;  // A confident row.
      std::vector<float> ids(R);
      for (int64_t r = 0; r < R; ++r) ids[r] = static_cast<float>((r * 97) % V);
      ids[5] = 3;
      Backend* b = gpu.get();
      Tensor x = Put(b, dtype, R, V, logits), t_ids = Put(b, DType::kF32, R, 1, ids);
      auto state = b->AllocateStepState(StepState{1024.0f});
      ASSERT_TRUE(state.ok());
      const ComposedCrossEntropy composed = Composed(b, x, t_ids, on, off, 2.0f, 1.0f / R,
                                                     *state, 2.0f);
      // Fused, in place over the logits.
      Tensor fused = Put(b, DType::kF32, 1, 2, {});
      ASSERT_TRUE(b->SoftmaxCrossEntropy(x, t_ids, on, off, -static_cast<double>(R), 2.0f, fused,
                                         1.0f / R, *state, 2.0f, x)
                      .ok());
      const std::vector<float> want = Get(b, composed.metrics), got = Get(b, fused);
      EXPECT_EQ(Get(b, x), Get(b, composed.gradient)) << "dtype " << static_cast<int>(dtype);
      EXPECT_NEAR(got[0], want[0], 1e-6 * std::fabs(want[0]));
      EXPECT_EQ(got[1], want[1]);
      EXPECT_GE(got[1], 1.0f);  // Row 5 at least.
    }
  }
}

// Many more rows than SMs over a padded view (the GPT's head): the pipelined kernel's blocks
// each walk many rows through their two shared-memory buffers (every buffer refilled many
// times); its gradient and loss are the composed ops' on the same rows, bit for bit.
TEST(LanguageModelOps, SoftmaxCrossEntropy_ManyRowsPerBlock_MatchesTheComposedOps) {
  REQUIRE_GPU();
  auto gpu = Gpu();
  Backend* b = gpu.get();
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const int64_t R = 1531, V = 1001, Vp = 1024;
    std::vector<float> padded = Rounded(Random(R * Vp, 41, 3.0f), dtype);
    padded[700 * Vp + 17] = 30.0f;  // A confident row.
    std::vector<float> packed(R * V);
    for (int64_t r = 0; r < R; ++r) {
      std::copy(padded.begin() + r * Vp, padded.begin() + r * Vp + V, packed.begin() + r * V);
    }
    std::vector<float> ids(R);
    for (int64_t r = 0; r < R; ++r) ids[r] = static_cast<float>((r * 131) % V);
    ids[700] = 17;
    Tensor wide = Put(b, dtype, R, Vp, padded), x = Put(b, dtype, R, V, packed);
    Tensor t_ids = Put(b, DType::kF32, R, 1, ids);
    auto state = b->AllocateStepState(StepState{256.0f});
    ASSERT_TRUE(state.ok());
    const ComposedCrossEntropy composed =
        Composed(b, x, t_ids, 1.0f, 0.0f, 1.0f, 1.0f / R, *state, 1.0f);
    Tensor fused = Put(b, DType::kF32, 1, 2, {});
    const Tensor view = wide.ColumnSlice(0, V);
    ASSERT_TRUE(b->SoftmaxCrossEntropy(view, t_ids, 1.0f, 0.0f, -static_cast<double>(R), 1.0f,
                                       fused, 1.0f / R, *state, 1.0f, view)
                    .ok());
    EXPECT_EQ(Get(b, view), Get(b, composed.gradient)) << "dtype " << static_cast<int>(dtype);
    const std::vector<float> want = Get(b, composed.metrics), got = Get(b, fused);
    EXPECT_NEAR(got[0], want[0], 1e-6 * std::fabs(want[0]));
    EXPECT_EQ(got[1], want[1]);
    EXPECT_GE(got[1], 1.0f);  // Row 700 at least.
    const std::vector<float> after = Get(b, wide);  // The padded columns untouched.
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = V; c < Vp; ++c) ASSERT_EQ(after[r * Vp + c], padded[r * Vp + c]);
    }
  }
}

// The MLP's c_proj backward through GELU: the DGELU epilogue's d_pre is the two calls' within
// one rounding of the compute dtype (it does not round dy · w first), and the weight and bias
// gradients are the same calls', bit for bit; gradients accumulated over a second call too.
TEST(LanguageModelOps, LinearBackwardThroughGelu_IsTheComposedCallsWithinOneRounding) {
  REQUIRE_GPU();
  auto gpu = Gpu();
  Backend* b = gpu.get();
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const int64_t M = 333, K = 256, N = 96;  // pre/x [M, K], w [N, K], dy [M, N]
    const std::vector<float> pre_values = Rounded(Random(M * K, 51, 3.0f), dtype);
    std::vector<float> act_values(M * K);
    for (int64_t i = 0; i < M * K; ++i) {
      const double v = pre_values[i];
      act_values[i] = static_cast<float>(
          0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
    }
    act_values = Rounded(act_values, dtype);
    Tensor pre = Put(b, dtype, M, K, pre_values), x = Put(b, dtype, M, K, act_values);
    Tensor w = Put(b, dtype, N, K, Rounded(Random(N * K, 52, 0.1f), dtype));
    Tensor dy = Put(b, dtype, M, N, Rounded(Random(M * N, 53, 1.0f), dtype));
    Tensor d_act = Put(b, dtype, M, K, {});
    Tensor fused_pre = Put(b, dtype, M, K, {}), composed_pre = Put(b, dtype, M, K, {});
    Tensor fused_dw = Put(b, DType::kF32, N, K, {}), composed_dw = Put(b, DType::kF32, N, K, {});
    Tensor fused_db = Put(b, DType::kF32, 1, N, {}), composed_db = Put(b, DType::kF32, 1, N, {});
    for (bool overwrite : {true, false}) {
      ASSERT_TRUE(b->LinearBackwardThroughActivation(x, w, dy, ActivationKind::kGeluTanh, pre,
                                                     d_act, fused_pre, fused_dw, fused_db,
                                                     overwrite)
                      .ok());
      ASSERT_TRUE(b->Backend::LinearBackwardThroughActivation(
                       x, w, dy, ActivationKind::kGeluTanh, pre, d_act, composed_pre,
                       composed_dw, composed_db, overwrite)
                      .ok());
    }
    EXPECT_EQ(Get(b, fused_dw), Get(b, composed_dw));
    EXPECT_EQ(Get(b, fused_db), Get(b, composed_db));
    const std::vector<float> fused = Get(b, fused_pre), composed = Get(b, composed_pre);
    const std::vector<float> rounded_product = Get(b, d_act);  // round(dy · w), the last call's
    // |fused − composed| ≤ |dy · w| · max|gelu'| (1.13) · 3 roundings of the compute dtype (the
    // product's, and each output's); the same on average.
    const double unit = dtype == DType::kBF16 ? 0x1.0p-8 : 0x1.0p-11;
    double worst = 0, sum_fused = 0, sum_composed = 0;
    for (int64_t i = 0; i < M * K; ++i) {
      const double scale = std::max(std::fabs(rounded_product[i]) * 1.13, 1e-6);
      worst = std::max(worst, std::fabs(fused[i] - composed[i]) / scale);
      sum_fused += fused[i];
      sum_composed += composed[i];
    }
    // Which GELU the epilogue differentiates (informational): the fused values against
    // round(dy · w) · gelu'(pre) in double, for the tanh approximation and for erf's GELU.
    auto worst_against = [&](bool tanh_form) {
      double worst_ref = 0;
      for (int64_t i = 0; i < M * K; ++i) {
        const double v = pre_values[i];
        double derivative;
        if (tanh_form) {
          const double u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
          const double t = std::tanh(u);
          derivative = 0.5 * (1 + t) +
                       0.5 * v * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * v * v);
        } else {
          derivative = 0.5 * (1 + std::erf(v / std::sqrt(2.0))) +
                       v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
        }
        const double want = rounded_product[i] * derivative;
        const double scale = std::max(std::fabs(rounded_product[i]) * 1.13, 1e-6);
        worst_ref = std::max(worst_ref, std::fabs(fused[i] - want) / scale);
      }
      return worst_ref;
    };
    std::printf("DGELU dtype %d: worst |fused - composed| %.3g, against tanh GELU' %.3g, erf GELU' "
                "%.3g (units of |dy w|)\n",
                static_cast<int>(dtype), worst, worst_against(true), worst_against(false));
    EXPECT_LE(worst, 3 * unit) << "dtype " << static_cast<int>(dtype);
    EXPECT_NEAR(sum_fused, sum_composed, 1e-3 * std::fabs(sum_composed) + 1e-2);
    EXPECT_GT(worst, 0.0) << "the fused path should round once (it ran the composed calls?)";
  }
}

// The MLP's c_fc forward with GELU: pre = round(x · wᵀ + b) and y = round(gelu(·)) within a
// rounding of the compute dtype of the double-precision values (CUDA applies GELU in the GEMM's
// epilogue to the f32 value in fp16/bf16; fp32 rounds twice as the CPU backend does).
TEST(LanguageModelOps, LinearForwardWithGelu_MatchesDoublePrecision) {
  REQUIRE_GPU();
  auto gpu = Gpu();
  Backend* b = gpu.get();
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const int64_t M = 200, K = 128, N = 256;  // x [M, K], w [N, K], y [M, N]
    const std::vector<float> xv = Rounded(Random(M * K, 61, 1.0f), dtype);
    const std::vector<float> wv = Rounded(Random(N * K, 62, 0.2f), dtype);
    const std::vector<float> bv = Rounded(Random(N, 63, 0.5f), dtype);
    Tensor x = Put(b, dtype, M, K, xv), w = Put(b, dtype, N, K, wv), bias = Put(b, dtype, 1, N, bv);
    Tensor pre = Put(b, dtype, M, N, {}), y = Put(b, dtype, M, N, {});
    ASSERT_TRUE(b->LinearForward(x, w, bias, ActivationKind::kGeluTanh, pre, y).ok());
    const std::vector<float> got_pre = Get(b, pre), got_y = Get(b, y);
    const double unit = dtype == DType::kBF16 ? 0x1.0p-8 : dtype == DType::kF16 ? 0x1.0p-11 : 0x1.0p-23;
    auto gelu = [](double v) {
      return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    };
    int64_t y_not_gelu_of_pre = 0;
    for (int64_t r = 0; r < M; ++r) {
      for (int64_t c = 0; c < N; ++c) {
        double want = bv[c], magnitude = std::fabs(bv[c]);
        for (int64_t i = 0; i < K; ++i) {
          want += static_cast<double>(xv[r * K + i]) * wv[c * K + i];
          magnitude += std::fabs(static_cast<double>(xv[r * K + i]) * wv[c * K + i]);
        }
        // The GEMM's f32 sums (1e-6 of the magnitude) and one rounding of the output.
        const double slack = 1e-6 * magnitude + 1e-7;
        ASSERT_LE(std::fabs(got_pre[r * N + c] - want), unit * std::fabs(want) + slack)
            << "pre " << r << "," << c << " dtype " << static_cast<int>(dtype);
        // GELU of the f32 or of the rounded pre (|gelu'| <= 1.13): two roundings at most.
        ASSERT_LE(std::fabs(got_y[r * N + c] - gelu(want)),
                  unit * (std::fabs(gelu(want)) + 1.13 * std::fabs(want)) + 1.13 * slack + 1e-6)
            << "y " << r << "," << c << " dtype " << static_cast<int>(dtype);
        const float composed = Rounded({static_cast<float>(gelu(got_pre[r * N + c]))}, dtype)[0];
        if (got_y[r * N + c] != composed) ++y_not_gelu_of_pre;
      }
    }
    std::printf("GELU forward dtype %d: %lld of %lld outputs differ from round(gelu(pre))\n",
                static_cast<int>(dtype), static_cast<long long>(y_not_gelu_of_pre),
                static_cast<long long>(M * N));
  }
}

// Rows the fused kernel's passes treat apart, against the composed ops — the gradient bit for
// bit, the correct count exactly, the loss to its last bits — with and without a gradient (a
// loss alone is the target's term alone), with and without smoothing, in the staged kernel (a
// row in shared memory) and the unstaged one (a row too large: 110,003 columns): ties for the
// maximum (the first column holding it is the argmax), a non-integral id (no column is the
// target), targets in column 0, in a full vector, in the last full vector and in the partial
// one after it; then rows with a NaN, in column 0 (which stays the argmax) and elsewhere (which
// the maximum ignores), where both losses are NaN and the counts still agree.
TEST(LanguageModelOps, SoftmaxCrossEntropy_EdgeRows_MatchTheComposedOps) {
  REQUIRE_GPU();
  auto gpu = Gpu();
  Backend* b = gpu.get();
  // Bit for bit, any NaN equal to any other.
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& c) {
    if (a.size() != c.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!(std::isnan(a[i]) && std::isnan(c[i])) && std::memcmp(&a[i], &c[i], 4) != 0) {
        return false;
      }
    }
    return true;
  };
  for (const int64_t V : {int64_t{203}, int64_t{110003}}) {
    const int64_t Vp = (V + 7) / 8 * 8 + 8;  // Rows 16-byte aligned, columns past V untouched.
    const int64_t last_full = V / 8 * 8 - 1;  // The last column of the last whole 8-vector.
    for (const bool with_nans : {false, true}) {
      // Row r: its logits, then its id.
      std::vector<std::vector<float>> rows;
      std::vector<float> ids;
      float correct = 0;  // How many rows' argmax is their target.
      auto add = [&](uint32_t seed, std::vector<std::pair<int64_t, float>> set, float id) {
        std::vector<float> row = Random(V, seed, 2.0f);
        for (auto [c, v] : set) row[c] = v;
        rows.push_back(row);
        ids.push_back(id);
      };
      if (!with_nans) {
        add(1, {{10, 30.0f}, {50, 30.0f}}, 50.0f);         // Tie; the later column: not correct.
        add(2, {{10, 30.0f}, {50, 30.0f}}, 10.0f);         // Tie; the first column: correct.
        add(3, {{0, 30.0f}}, 0.0f);                       // Target and maximum in column 0.
        add(4, {{37, 30.0f}}, 4.5f);                      // No column is the target.
        add(5, {{last_full, 30.0f}}, static_cast<float>(last_full));
        add(6, {{V - 1, 30.0f}}, static_cast<float>(V - 1));  // The partial vector (V = 203).
        add(7, {{V - 1, 30.0f}}, static_cast<float>(V - 2));
        add(8, {{100, -9.0f}}, 100.0f);                  // An unlikely target.
        correct = 4;  // Rows 1, 2, 4 and 5.
      } else {
        add(9, {{0, NAN}, {20, 30.0f}}, 0.0f);   // NaN in column 0: the argmax, correct.
        add(10, {{0, NAN}, {20, 30.0f}}, 20.0f);  // ... so the maximum's column is not.
        add(11, {{7, NAN}, {20, 30.0f}}, 20.0f);  // A NaN elsewhere: ignored by the maximum.
        correct = 2;
      }
      const int64_t R = static_cast<int64_t>(rows.size());
      for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
        std::vector<float> packed, padded(R * Vp, 0.5f);
        for (int64_t r = 0; r < R; ++r) {
          const std::vector<float> row = Rounded(rows[r], dtype);
          packed.insert(packed.end(), row.begin(), row.end());
          std::copy(row.begin(), row.end(), padded.begin() + r * Vp);
        }
        for (const float smoothing : {0.0f, 0.1f}) {
          for (const bool gradient : {true, false}) {
            SCOPED_TRACE(::testing::Message() << "V " << V << " nans " << with_nans << " dtype "
                                              << static_cast<int>(dtype) << " smoothing "
                                              << smoothing << " gradient " << gradient);
            const float on = 1.0f - smoothing, off = smoothing / V;
            Tensor x = Put(b, dtype, R, V, packed), wide = Put(b, dtype, R, Vp, padded);
            Tensor t_ids = Put(b, DType::kF32, R, 1, ids);
            auto state = b->AllocateStepState(StepState{512.0f});
            ASSERT_TRUE(state.ok());
            const ComposedCrossEntropy composed =
                Composed(b, x, t_ids, on, off, 1.0f, 1.0f / R, *state, 1.0f);
            Tensor fused = Put(b, DType::kF32, 1, 2, {});
            const Tensor view = wide.ColumnSlice(0, V);
            ASSERT_TRUE(b->SoftmaxCrossEntropy(view, t_ids, on, off, -static_cast<double>(R),
                                               1.0f, fused, 1.0f / R, *state, 1.0f,
                                               gradient ? view : Tensor{})
                            .ok());
            const std::vector<float> want = Get(b, composed.metrics), got = Get(b, fused);
            EXPECT_EQ(got[1], want[1]) << "the correct count";
            EXPECT_EQ(got[1], correct);
            if (with_nans) {
              EXPECT_TRUE(std::isnan(got[0]) && std::isnan(want[0])) << got[0] << " " << want[0];
            } else {
              EXPECT_NEAR(got[0], want[0], 1e-6 * std::fabs(want[0]));
            }
            const std::vector<float> after = Get(b, wide);
            for (int64_t r = 0; r < R; ++r) {
              for (int64_t c = V; c < Vp; ++c) ASSERT_EQ(after[r * Vp + c], 0.5f) << r << "," << c;
            }
            if (gradient) {
              EXPECT_TRUE(same_bits(Get(b, view), Get(b, composed.gradient))) << "the gradient";
            } else {
              EXPECT_TRUE(same_bits(Get(b, view), packed)) << "x was written";
            }
          }
        }
      }
    }
  }
}

// The padded LM head's view: the loss over the first V columns of rows Vp apart, in place, is
// the contiguous one's bit for bit, and leaves the padded columns as they were.
TEST(LanguageModelOps, SoftmaxCrossEntropy_OverAColumnView_MatchesContiguous) {
  REQUIRE_GPU();
  auto gpu = Gpu();
  Backend* b = gpu.get();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    const int64_t R = 23, V = 1001, Vp = 1024;
    const std::vector<float> padded = Rounded(Random(R * Vp, 31, 2.0f), dtype);
    std::vector<float> packed(R * V);
    for (int64_t r = 0; r < R; ++r) {
      std::copy(padded.begin() + r * Vp, padded.begin() + r * Vp + V, packed.begin() + r * V);
    }
    std::vector<float> ids(R);
    for (int64_t r = 0; r < R; ++r) ids[r] = static_cast<float>((r * 37) % V);
    Tensor wide = Put(b, dtype, R, Vp, padded), narrow = Put(b, dtype, R, V, packed);
    Tensor t_ids = Put(b, DType::kF32, R, 1, ids);
    auto state = b->AllocateStepState(StepState{8.0f});
    ASSERT_TRUE(state.ok());
    Tensor m_wide = Put(b, DType::kF32, 1, 2, {}), m_narrow = Put(b, DType::kF32, 1, 2, {});
    const Tensor view = wide.ColumnSlice(0, V);
    ASSERT_TRUE(b->SoftmaxCrossEntropy(view, t_ids, 1.0f, 0.0f, -static_cast<double>(R), 1.0f,
                                       m_wide, 1.0f / R, *state, 1.0f, view).ok());
    ASSERT_TRUE(b->SoftmaxCrossEntropy(narrow, t_ids, 1.0f, 0.0f, -static_cast<double>(R), 1.0f,
                                       m_narrow, 1.0f / R, *state, 1.0f, narrow).ok());
    EXPECT_EQ(Get(b, m_wide), Get(b, m_narrow));
    EXPECT_EQ(Get(b, view), Get(b, narrow));  // Download packs a column view.
    const std::vector<float> after = Get(b, wide);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = V; c < Vp; ++c) ASSERT_EQ(after[r * Vp + c], padded[r * Vp + c]);
    }
    // Zero of a column view clears those columns only.
    ASSERT_TRUE(b->Zero(wide.ColumnSlice(V, Vp - V)).ok());
    const std::vector<float> zeroed = Get(b, wide);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = 0; c < Vp; ++c) {
        ASSERT_EQ(zeroed[r * Vp + c], c < V ? after[r * Vp + c] : 0.0f) << r << "," << c;
      }
    }
  }
}

// LayerNorm forward and backward against the CPU backend: widths on the 8-wide path and off
// it, row counts that leave a block partly empty and span many parameter-gradient chunks, fp32
// and low-precision inputs, gradients written and accumulated.
TEST(LanguageModelOps, LayerNorm_MatchesTheCpuBackend) {
  REQUIRE_GPU();
  auto gpu = Gpu();
  CpuBackend cpu(std::make_unique<testing::SingleRankCollective>());
  struct Shape { int64_t rows, cols; };
  for (const Shape shape : {Shape{37, 768}, Shape{3000, 64}, Shape{1025, 100}, Shape{9, 8200},
                            Shape{20000, 24}}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const int64_t R = shape.rows, C = shape.cols;
      SCOPED_TRACE(::testing::Message() << R << "x" << C << " dtype " << static_cast<int>(dtype));
      const std::vector<float> x = Rounded(Random(R * C, 41, 1.5f), dtype);
      std::vector<float> x_shifted = x;  // A mean far from 0 (the variance's cancellation).
      for (float& v : x_shifted) v = RoundTo(dtype, v + 3.0f);
      const std::vector<float> w = Random(C, 42), bias = Random(C, 43);
      const std::vector<float> dy = Rounded(Random(R * C, 44), dtype);
      const std::vector<float> dw0 = Random(C, 45), db0 = Random(C, 46);
      for (bool overwrite : {true, false}) {
        std::vector<float> got[5], want[5];
        for (Backend* b : {static_cast<Backend*>(gpu.get()), static_cast<Backend*>(&cpu)}) {
          std::vector<float>* out = b == &cpu ? want : got;
          Tensor tx = Put(b, dtype, R, C, x_shifted), tw = Put(b, DType::kF32, 1, C, w);
          Tensor tb = Put(b, DType::kF32, 1, C, bias), stats = Put(b, DType::kF32, R, 2, {});
          Tensor y = Put(b, dtype, R, C, {}), tdy = Put(b, dtype, R, C, dy);
          Tensor dx = Put(b, DType::kF32, R, C, {}), dw = Put(b, DType::kF32, 1, C, dw0);
          Tensor db = Put(b, DType::kF32, 1, C, db0);
          ASSERT_TRUE(b->LayerNormForward(tx, tw, tb, 1e-5f, stats, y).ok());
          ASSERT_TRUE(b->LayerNormBackward(tdy, tx, stats, tw, dx, dw, db, overwrite).ok());
          out[0] = Get(b, y), out[1] = Get(b, stats), out[2] = Get(b, dx);
          out[3] = Get(b, dw), out[4] = Get(b, db);
        }
        const char* names[] = {"y", "stats", "dx", "dweight", "dbias"};
        // y in the compute dtype: a rounding apart at most; the rest fp32 sums in other orders.
        const double tolerance[] = {dtype == DType::kF32 ? 1e-6 : 4e-3, 1e-6, 1e-5, 1e-5, 1e-5};
        for (int k = 0; k < 5; ++k) {
          EXPECT_LT(RelativeError(got[k], want[k]), tolerance[k]) << names[k];
        }
      }
    }
  }
}

// The LayerNorm backward into the residual with the branch's bias gradient summed in its pass
// (the fused kernel, CUDA) against the composed calls (LayerNormBackward, Add, Cast,
// BiasGradient): the residual, its low copy and the LayerNorm's gradients as before; the bias
// gradient round(Σ_rows low copy) summed in another order (one rounding of the compute dtype
// apart at most), accumulated over a second call; shapes the fused kernel does not take (1030
// columns, an odd width) take the separate pass.
TEST(LanguageModelOps, LayerNormBackwardIntoResidual_SumsTheBranchBiasGradient) {
  REQUIRE_GPU();
  auto gpu = Gpu();
  Backend* b = gpu.get();
  struct Shape { int64_t rows, cols; };
  for (const Shape shape : {Shape{1000, 768}, Shape{129, 1024}, Shape{77, 1030}, Shape{40, 12}}) {
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      const int64_t R = shape.rows, C = shape.cols;
      SCOPED_TRACE(::testing::Message() << R << "x" << C << " dtype " << static_cast<int>(dtype));
      const std::vector<float> x = Random(R * C, 71, 1.5f), w = Random(C, 72);
      const std::vector<float> dy = Rounded(Random(R * C, 73), dtype);
      const std::vector<float> resid0 = Random(R * C, 74), bias0 = Random(C, 75, 0.1f);
      Tensor tx = Put(b, DType::kF32, R, C, x), tw = Put(b, DType::kF32, 1, C, w);
      Tensor tb = Put(b, DType::kF32, 1, C, Random(C, 76)), stats = Put(b, DType::kF32, R, 2, {});
      Tensor y = Put(b, dtype, R, C, {}), tdy = Put(b, dtype, R, C, dy);
      ASSERT_TRUE(b->LayerNormForward(tx, tw, tb, 1e-5f, stats, y).ok());
      std::vector<float> got[6], want[6];
      for (bool fused : {true, false}) {
        std::vector<float>* out = fused ? got : want;
        Tensor scratch = Put(b, DType::kF32, R, C, {}), resid = Put(b, DType::kF32, R, C, resid0);
        Tensor low = Put(b, dtype, R, C, {}), dw = Put(b, DType::kF32, 1, C, {});
        Tensor db = Put(b, DType::kF32, 1, C, {}), branch_db = Put(b, DType::kF32, 1, C, bias0);
        for (bool overwrite : {true, false}) {
          absl::Status status =
              fused ? b->LayerNormBackwardIntoResidual(tdy, tx, stats, tw, scratch, resid, low, dw,
                                                       db, branch_db, overwrite)
                    : b->Backend::LayerNormBackwardIntoResidual(tdy, tx, stats, tw, scratch, resid,
                                                                low, dw, db, branch_db, overwrite);
          ASSERT_TRUE(status.ok()) << status;
        }
        out[0] = Get(b, resid), out[1] = Get(b, low), out[2] = Get(b, dw), out[3] = Get(b, db);
        out[4] = Get(b, branch_db), out[5] = Get(b, low);
      }
      EXPECT_EQ(got[0], want[0]) << "d_residual";
      EXPECT_EQ(got[1], want[1]) << "d_residual_low";
      EXPECT_LT(RelativeError(got[2], want[2]), 1e-5) << "dweight";
      EXPECT_LT(RelativeError(got[3], want[3]), 1e-5) << "dbias";
      // Σ_rows |low| per column bounds the f32 sums' order; each of the two calls' sums is
      // rounded to the compute dtype once.
      const double unit = dtype == DType::kBF16 ? 0x1.0p-8 : 0x1.0p-11;
      for (int64_t c = 0; c < C; ++c) {
        double magnitude = 0;
        for (int64_t r = 0; r < R; ++r) magnitude += std::fabs(got[5][r * C + c]);
        const double bound = 4 * unit * std::max<double>(std::fabs(want[4][c] - bias0[c]), 1.0) +
                             1e-5 * magnitude;
        ASSERT_LE(std::fabs(got[4][c] - want[4][c]), bound) << "branch bias column " << c;
      }
    }
  }
}

// The coordinator's estimate plans with TraitsForDevice(cuda); the CUDA rank with what its
// backend reports: the same plan.
TEST(GptBackendTraits, CudaBackend_IsWhatTraitsForDeviceSays) {
  REQUIRE_GPU();
  auto gpu = Gpu();
  GptConfig config;
  config.vocab_size = 97, config.padded_vocab_size = 128, config.context_length = 16;
  config.layers = 2, config.heads = 4, config.width = 32;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    absl::StatusOr<Tensor> low = gpu->Allocate(dtype, 1, 1);
    ASSERT_TRUE(low.ok());
    const GptBackendTraits got = BackendGptTraits(*gpu, low->element_bytes, dtype, 3, config);
    const GptBackendTraits want = TraitsForDevice(/*cuda=*/true, dtype, 3, config);
    EXPECT_EQ(got.low_element_bytes, want.low_element_bytes);
    EXPECT_EQ(got.attention_saved_rows, want.attention_saved_rows);
    EXPECT_EQ(got.attention_saved_cols, want.attention_saved_cols);
    EXPECT_EQ(got.fused_loss, want.fused_loss);
    EXPECT_EQ(LogitsColumns(config, got), 128);  // The padded head.
  }
}

// ---- GPT training: CUDA against the CPU backend ----

class RecordingObserver : public TrainingObserver {
 public:
  void OnStep(int64_t, const StepTelemetry* record) override {
    if (record != nullptr) records.push_back(*record);
  }
  bool ShouldStop() override { return false; }
  std::vector<StepTelemetry> records;
};

std::string PeriodicTokens(const std::string& name, int64_t count, int64_t vocab) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  FILE* file = std::fopen(path.c_str(), "wb");
  std::mt19937 generator(3);
  for (int64_t i = 0; i < count; ++i) {
    // A noisy period-11 stream: learnable, with some entropy left.
    const uint16_t token =
        static_cast<uint16_t>(generator() % 4 == 0 ? generator() % vocab : (i * 5) % 11);
    std::fwrite(&token, sizeof(token), 1, file);
  }
  std::fclose(file);
  return path;
}

struct GptCase {
  DType dtype;
  double init_scale;
  int expected_skips;  // At least (fp16: the logits' forced overflows; later gradients add some)
  double loss_tolerance, parameter_tolerance;  // Relative, against the CPU backend.
  GptConfig shape = {64, 72, 32, 2, 2, 64};
  int64_t micro_batch_size = 4, accumulation_steps = 2;
};

class GptTrainingParity : public ::testing::TestWithParam<GptCase> {};

TEST_P(GptTrainingParity, CudaMatchesCpu_SkipsAndScalesExactly) {
  REQUIRE_GPU();
  const GptCase c = GetParam();
  TrainingConfig config;
  config.world_size = 1;
  config.model.gpt = c.shape;
  config.loss.type = LossType::kCrossEntropy;
  config.data.source = DataConfig::Source::kTokens;
  config.data.token_files = {PeriodicTokens("gpt_train.bin", 20000, c.shape.vocab_size)};
  config.micro_batch_size = c.micro_batch_size;
  config.accumulation_steps = c.accumulation_steps;
  config.steps = 20;
  config.compute_dtype = c.dtype;
  config.optimizer.type = OptimizerType::kAdamW;
  config.optimizer.lr = 3e-3;
  config.optimizer.weight_decay = 0.1;
  config.max_grad_norm = 1.0;
  config.seed = 7;
  config.loss_scaler.enabled = c.dtype == DType::kF16;
  config.loss_scaler.init_scale = c.init_scale;
  // The worker's operator switch, for diagnosis on the GPU machine: every step op by op.
  if (const char* graphs = std::getenv("MPTRAIN_STEP_GRAPHS"); graphs && std::string(graphs) == "0") {
    config.record_steps = false;
  }
  RecordingObserver on_gpu, on_cpu;
  auto gpu = Gpu();
  CpuBackend cpu(std::make_unique<testing::SingleRankCollective>());
  absl::StatusOr<TrainingResult> gpu_result =
      RunTraining(config, 0, gpu.get(), &on_gpu, "", {"job-1", "alice"});
  absl::StatusOr<TrainingResult> cpu_result =
      RunTraining(config, 0, &cpu, &on_cpu, "", {"job-1", "alice"});
  ASSERT_TRUE(gpu_result.ok()) << gpu_result.status();
  ASSERT_TRUE(cpu_result.ok()) << cpu_result.status();
  ASSERT_EQ(on_gpu.records.size(), on_cpu.records.size());
  double worst_loss = 0;
  for (size_t i = 0; i < on_gpu.records.size(); ++i) {
    const StepTelemetry &g = on_gpu.records[i], &r = on_cpu.records[i];
    EXPECT_EQ(g.skipped, r.skipped) << "step " << i + 1;
    EXPECT_EQ(g.loss_scale, r.loss_scale) << "step " << i + 1;
    const double error = std::fabs(g.loss - r.loss) / std::fabs(r.loss);
    worst_loss = std::max(worst_loss, error);
    EXPECT_LT(error, c.loss_tolerance) << "step " << i + 1 << ": " << g.loss << " vs " << r.loss;
  }
  EXPECT_EQ(gpu_result->skipped_steps, cpu_result->skipped_steps);
  EXPECT_GE(gpu_result->skipped_steps, c.expected_skips) << "the forced overflows happened";
  EXPECT_LT(on_gpu.records.back().loss, 0.8 * on_gpu.records.front().loss) << "it learns";
  const double parameters = RelativeError(gpu_result->parameters, cpu_result->parameters);
  std::printf("gpt dtype %d V=%ld/%ld T=%ld L=%ld H=%ld C=%ld B=%ld A=%ld: worst loss error "
              "%.3g, parameter error %.3g, skips %ld\n",
              static_cast<int>(c.dtype), c.shape.vocab_size, c.shape.padded_vocab_size,
              c.shape.context_length, c.shape.layers, c.shape.heads, c.shape.width,
              c.micro_batch_size, c.accumulation_steps, worst_loss, parameters,
              gpu_result->skipped_steps);
  EXPECT_LT(parameters, c.parameter_tolerance);
}

// fp16 at 2^27: the logits' gradient overflows fp16 at 2^27, 2^26 and 2^25 (|p − q| · scale /
// (B·T · A) > 65504); deeper gradients overflow for a few more (9 skips on the H200, the same on
// the CPU backend).
INSTANTIATE_TEST_SUITE_P(Precisions, GptTrainingParity,
                         ::testing::Values(GptCase{DType::kF32, 1.0, 0, 1e-5, 1e-4},
                                           GptCase{DType::kBF16, 1.0, 0, 2e-2, 3e-2},
                                           GptCase{DType::kF16, 134217728.0, 3, 5e-3, 1e-2}));

// Shapes no kernel was written for: odd vocabularies (unpadded; padded to a width the fused loss
// reads as a column view), contexts that are no tile's multiple, head sizes 20 (fp32, our
// kernels), 48 and 96 (cuDNN), three micro-batches a step. fp16 from 2^24, where the logits'
// gradient overflows (|p − q| · 2^24 / (B·T·A = 144) > 65504).
INSTANTIATE_TEST_SUITE_P(
    OddShapes, GptTrainingParity,
    ::testing::Values(GptCase{DType::kF32, 1.0, 0, 1e-5, 1e-4, {203, 203, 37, 3, 5, 100}, 3, 3},
                      GptCase{DType::kBF16, 1.0, 0, 2e-2, 3e-2, {203, 203, 40, 3, 3, 144}, 3, 3},
                      GptCase{DType::kF16, 16777216.0, 1, 5e-3, 1e-2, {250, 264, 24, 2, 2, 192},
                              2, 3}));

// A GPT's steps recorded as CUDA graphs (token micro-batches staged before each step) and
// replayed are the steps issued op by op, bit for bit: the embedding's sort, the fused loss and
// (fp32) the attention inside the graph; fp16 and bf16, whose cuDNN attention is not recorded,
// run op by op. Two op-by-op runs first: equal, or a difference is not the recording's.
class GptRecordedSteps : public ::testing::TestWithParam<DType> {};

TEST_P(GptRecordedSteps, ReplaysAreBitIdenticalToStepsIssuedOpByOp) {
  REQUIRE_GPU();
  const DType dtype = GetParam();
  TrainingConfig config;
  config.world_size = 1;
  config.model.gpt = {64, 72, 32, 2, 2, 64};
  config.loss.type = LossType::kCrossEntropy;
  config.data.source = DataConfig::Source::kTokens;
  config.data.token_files = {PeriodicTokens("gpt_recorded.bin", 20000, 64)};
  config.micro_batch_size = 4;
  config.accumulation_steps = 3;
  config.steps = 10;
  config.compute_dtype = dtype;
  config.optimizer.type = OptimizerType::kAdamW;
  config.optimizer.lr = 3e-3;
  config.optimizer.weight_decay = 0.1;
  config.max_grad_norm = 1.0;
  config.seed = 9;
  config.loss_scaler.enabled = dtype == DType::kF16;
  config.loss_scaler.init_scale = 134217728.0;
  std::vector<float> parameters[3];
  int64_t replayed[3], skipped[3];
  for (int run = 0; run < 3; ++run) {
    config.record_steps = run == 2;
    RecordingObserver observer;
    auto gpu = Gpu();
    absl::StatusOr<TrainingResult> result =
        RunTraining(config, 0, gpu.get(), &observer, "", {"job-1", "alice"});
    ASSERT_TRUE(result.ok()) << "run " << run << ": " << result.status();
    parameters[run] = result->parameters;
    replayed[run] = result->replayed_steps;
    skipped[run] = result->skipped_steps;
  }
  EXPECT_EQ(parameters[1], parameters[0]) << "two runs issued op by op differ: not deterministic";
  EXPECT_EQ(replayed[0], 0);
  if (dtype == DType::kF32) {
    EXPECT_EQ(replayed[2], config.steps - 1) << "every step after the first is a replay";
  } else {
    // cuDNN's attention is not recorded (CudaBackend::CanRecordAttention): op by op.
    EXPECT_EQ(replayed[2], 0);
  }
  EXPECT_EQ(skipped[2], skipped[0]);
  if (dtype == DType::kF16) {
    EXPECT_GE(skipped[0], 3);
  }
  EXPECT_EQ(parameters[2], parameters[0]) << "the replays differ from the steps issued op by op";
}

INSTANTIATE_TEST_SUITE_P(Precisions, GptRecordedSteps,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16));

}  // namespace
}  // namespace mptrain::cuda
