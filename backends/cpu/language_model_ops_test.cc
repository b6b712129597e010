// The CPU backend's language-model primitives (Add, EmbeddingForward/Backward,
// CausalAttentionForward/Backward, GELU-tanh) against straightforward references: double loops
// over the formulas of trainer/backend.h, and, for the backward passes, the gradient of the
// reference forward taken by central differences in double.

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_collectives.h"
#include "trainer/activation_math.h"

namespace mptrain {
namespace {

class LanguageModelOpsTest : public ::testing::Test {
 protected:
  LanguageModelOpsTest() : backend_(std::make_unique<testing::SingleRankCollective>()) {}

  Tensor Make(DType dtype, int64_t rows, int64_t cols, const std::vector<float>& values) {
    Tensor tensor = *backend_.Allocate(dtype, rows, cols);
    EXPECT_TRUE(backend_.Upload(values.data(), tensor).ok());
    return tensor;
  }
  std::vector<float> Read(Tensor tensor) {
    std::vector<float> values(tensor.numel());
    EXPECT_TRUE(backend_.Download(tensor, values.data()).ok());
    return values;
  }
  static std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> values(n);
    for (float& v : values) v = normal(rng);
    return values;
  }

  CpuBackend backend_;
};

TEST_F(LanguageModelOpsTest, Add_WidensAndRoundsToTheOutput) {
  Tensor a = Make(DType::kF32, 1, 2, {1.0f, 2.5f});
  Tensor b = Make(DType::kBF16, 1, 2, {0.00390625f, -1.0f});
  ASSERT_TRUE(backend_.Add(a, b, a).ok());  // In place, F + B -> F.
  EXPECT_EQ(Read(a), (std::vector<float>{1.00390625f, 1.5f}));
  Tensor low = Make(DType::kBF16, 1, 2, {0, 0});
  ASSERT_TRUE(backend_.Add(a, Make(DType::kF32, 1, 2, {0.0009765625f, 0}), low).ok());
  // 1.0048828125 is not bf16: the sum is rounded once (to 1.0078125, its nearest).
  EXPECT_EQ(Read(low), (std::vector<float>{1.0078125f, 1.5f}));
  EXPECT_FALSE(backend_.Add(a, Make(DType::kF32, 1, 3, {0, 0, 0}), a).ok());
}

TEST_F(LanguageModelOpsTest, EmbeddingForward_SumsTokenAndPositionRows) {
  Tensor wte = Make(DType::kF32, 3, 2, {0, 1, 10, 11, 20, 21});
  Tensor wpe = Make(DType::kF32, 4, 2, {0.5f, 0.25f, 1.5f, 1.25f, 9, 9, 9, 9});
  Tensor ids = Make(DType::kF32, 4, 1, {2, 0, 1, 1});  // Two sequences of 2.
  Tensor out = *backend_.Allocate(DType::kF32, 4, 2);
  ASSERT_TRUE(backend_.EmbeddingForward(ids, wte, wpe, 2, out).ok());
  EXPECT_EQ(Read(out),
            (std::vector<float>{20.5f, 21.25f, 1.5f, 2.25f, 10.5f, 11.25f, 11.5f, 12.25f}));
}

TEST_F(LanguageModelOpsTest, EmbeddingForward_RefusesIdsOutsideTheTable) {
  Tensor wte = Make(DType::kF32, 3, 1, {0, 1, 2});
  Tensor wpe = Make(DType::kF32, 2, 1, {0, 0});
  Tensor out = *backend_.Allocate(DType::kF32, 2, 1);
  for (float bad : {3.0f, -1.0f, 0.5f, NAN}) {
    absl::Status status =
        backend_.EmbeddingForward(Make(DType::kF32, 2, 1, {0, bad}), wte, wpe, 2, out);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("row 1"), std::string::npos) << status;
  }
  // A sequence longer than wpe.
  EXPECT_FALSE(backend_
                   .EmbeddingForward(Make(DType::kF32, 3, 1, {0, 0, 0}), wte, wpe, 3,
                                     *backend_.Allocate(DType::kF32, 3, 1))
                   .ok());
}

TEST_F(LanguageModelOpsTest, EmbeddingBackward_ScatterAddsTokensAndSumsPositions) {
  Tensor ids = Make(DType::kF32, 4, 1, {2, 0, 2, 2});
  Tensor dout = Make(DType::kF32, 4, 1, {1, 2, 4, 8});
  Tensor dwte = Make(DType::kF32, 3, 1, {100, 100, 100});
  Tensor dwpe = Make(DType::kF32, 3, 1, {100, 100, 100});
  ASSERT_TRUE(backend_.EmbeddingBackward(ids, dout, 2, dwte, dwpe, false, true).ok());
  EXPECT_EQ(Read(dwte), (std::vector<float>{102, 100, 113}));  // Added to (the tied LM head's).
  EXPECT_EQ(Read(dwpe), (std::vector<float>{5, 10, 0}));       // Written; position 2 unused.
  ASSERT_TRUE(backend_.EmbeddingBackward(ids, dout, 2, dwte, dwpe, true, false).ok());
  EXPECT_EQ(Read(dwte), (std::vector<float>{2, 0, 13}));
  EXPECT_EQ(Read(dwpe), (std::vector<float>{10, 20, 0}));
}

TEST(GeluTanhTest, MatchesTheFormulaAndItsDerivative) {
  for (double x : {-6.0, -2.5, -1.0, -0.1, 0.0, 0.3, 1.0, 2.0, 5.0}) {
    auto gelu = [](double v) {
      return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    };
    EXPECT_NEAR(ActivationForward(ActivationKind::kGeluTanh, static_cast<float>(x)), gelu(x), 1e-6)
        << x;
    const double h = 1e-4;
    const double derivative = (gelu(x + h) - gelu(x - h)) / (2 * h);
    EXPECT_NEAR(ActivationGradient(ActivationKind::kGeluTanh, static_cast<float>(x), 2.0f),
                2 * derivative, 1e-5)
        << x;
  }
}

// The attention of trainer/backend.h in double, without rounding: y [B·T, C].
std::vector<double> ReferenceAttention(const std::vector<double>& qkv, int64_t B, int64_t T,
                                       int64_t H, int64_t C, std::vector<double>* probs) {
  const int64_t hs = C / H;
  std::vector<double> y(B * T * C, 0.0);
  if (probs != nullptr) probs->assign(B * H * T * T, 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double max = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t d = 0; d < hs; ++d) {
            dot +=
                qkv[(b * T + t) * 3 * C + h * hs + d] * qkv[(b * T + u) * 3 * C + C + h * hs + d];
          }
          s[u] = dot / std::sqrt(static_cast<double>(hs));
          max = std::max(max, s[u]);
        }
        double sum = 0;
        for (double& v : s) sum += (v = std::exp(v - max));
        for (int64_t u = 0; u <= t; ++u) {
          const double p = s[u] / sum;
          if (probs != nullptr) (*probs)[((b * H + h) * T + t) * T + u] = p;
          for (int64_t d = 0; d < hs; ++d) {
            y[(b * T + t) * C + h * hs + d] += p * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + d];
          }
        }
      }
    }
  }
  return y;
}

TEST_F(LanguageModelOpsTest, CausalAttention_Fp32MatchesTheDoubleReference) {
  const int64_t B = 2, T = 5, H = 2, C = 8;
  const std::vector<float> values = Random(B * T * 3 * C, 1);
  const std::vector<float> upstream = Random(B * T * C, 2);
  Tensor qkv = Make(DType::kF32, B * T, 3 * C, values);
  Tensor probs = *backend_.Allocate(DType::kF32, B * H * T, T);
  Tensor y = *backend_.Allocate(DType::kF32, B * T, C);
  ASSERT_TRUE(backend_.CausalAttentionForward(qkv, B, H, probs, y).ok());
  std::vector<double> qkv_d(values.begin(), values.end()), probs_d;
  const std::vector<double> y_d = ReferenceAttention(qkv_d, B, T, H, C, &probs_d);
  const std::vector<float> y_ours = Read(y), probs_ours = Read(probs);
  for (size_t i = 0; i < y_d.size(); ++i) EXPECT_NEAR(y_ours[i], y_d[i], 1e-5) << i;
  for (size_t i = 0; i < probs_d.size(); ++i) EXPECT_NEAR(probs_ours[i], probs_d[i], 1e-6) << i;

  // The backward against central differences of L = Σ y · upstream in double.
  Tensor dy = Make(DType::kF32, B * T, C, upstream);
  Tensor dqkv = *backend_.Allocate(DType::kF32, B * T, 3 * C);
  ASSERT_TRUE(backend_.CausalAttentionBackward(qkv, probs, y, dy, B, H, dqkv).ok());
  const std::vector<float> grad = Read(dqkv);
  auto loss = [&](const std::vector<double>& x) {
    const std::vector<double> out = ReferenceAttention(x, B, T, H, C, nullptr);
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += out[i] * upstream[i];
    return sum;
  };
  for (size_t i = 0; i < qkv_d.size(); ++i) {
    std::vector<double> plus = qkv_d, minus = qkv_d;
    plus[i] += 1e-6;
    minus[i] -= 1e-6;
    EXPECT_NEAR(grad[i], (loss(plus) - loss(minus)) / 2e-6, 2e-5) << "element " << i;
  }
}

TEST_F(LanguageModelOpsTest, CausalAttention_Bf16RoundsAtTheDocumentedPoints) {
  const int64_t B = 1, T = 4, H = 1, C = 4;
  std::vector<float> values = Random(B * T * 3 * C, 3);
  for (float& v : values) v = RoundToBF16(v);
  Tensor qkv = Make(DType::kBF16, B * T, 3 * C, values);
  Tensor probs = *backend_.Allocate(DType::kF32, B * H * T, T);
  Tensor y = *backend_.Allocate(DType::kBF16, B * T, C);
  ASSERT_TRUE(backend_.CausalAttentionForward(qkv, B, H, probs, y).ok());
  // The emulation written out, per row: hs = 4, so the scale 0.5 is exact.
  const std::vector<float> p = Read(probs), out = Read(y);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> s(t + 1);
    float max = -INFINITY;
    for (int64_t u = 0; u <= t; ++u) {
      float dot = 0;
      for (int64_t d = 0; d < C; ++d) dot += values[t * 3 * C + d] * values[u * 3 * C + C + d];
      s[u] = RoundToBF16(RoundToBF16(dot) * 0.5f);
      max = std::max(max, s[u]);
    }
    float sum = 0;
    for (float& v : s) sum += (v = std::exp(v - max));
    for (int64_t u = 0; u < T; ++u) {
      EXPECT_NEAR(p[t * T + u], u <= t ? s[u] / sum : 0.0f, 1e-6);
    }
    for (int64_t d = 0; d < C; ++d) {
      float acc = 0;
      for (int64_t u = 0; u <= t; ++u)
        acc += RoundToBF16(p[t * T + u]) * values[u * 3 * C + 2 * C + d];
      EXPECT_EQ(out[t * C + d], RoundToBF16(acc)) << t << "," << d;
    }
  }
  // Every gradient is bf16 (rounded where it leaves each op).
  Tensor dy = Make(DType::kBF16, B * T, C, Random(B * T * C, 4));
  Tensor dqkv = *backend_.Allocate(DType::kBF16, B * T, 3 * C);
  ASSERT_TRUE(backend_.CausalAttentionBackward(qkv, probs, y, dy, B, H, dqkv).ok());
  for (float g : Read(dqkv)) EXPECT_EQ(g, RoundToBF16(g));
}

TEST_F(LanguageModelOpsTest, CausalAttention_RefusesShapesThatDoNotSplit) {
  Tensor qkv = *backend_.Allocate(DType::kF32, 4, 12);
  Tensor probs = *backend_.Allocate(DType::kF32, 12, 4);
  Tensor y = *backend_.Allocate(DType::kF32, 4, 4);
  EXPECT_FALSE(backend_.CausalAttentionForward(qkv, 1, 3, probs, y).ok());  // 4 % 3 heads
  EXPECT_FALSE(backend_.CausalAttentionForward(qkv, 3, 1, probs, y).ok());  // 4 rows / 3
  EXPECT_FALSE(backend_.CausalAttentionForward(qkv, 1, 2, probs, y).ok());  // probs rows
}

TEST_F(LanguageModelOpsTest, LinearForward_WithoutBias) {
  Tensor x = Make(DType::kF32, 1, 2, {1, 2});
  Tensor w = Make(DType::kF32, 2, 2, {1, 1, 3, -1});
  Tensor y = *backend_.Allocate(DType::kF32, 1, 2);
  ASSERT_TRUE(backend_.LinearForward(x, w, Tensor{}, ActivationKind::kNone, y, y).ok());
  EXPECT_EQ(Read(y), (std::vector<float>{3, 1}));
  Tensor dw = *backend_.Allocate(DType::kF32, 2, 2);
  ASSERT_TRUE(
      backend_.LinearBackward(x, w, Make(DType::kF32, 1, 2, {1, 1}), Tensor{}, dw, Tensor{}, true)
          .ok());
  EXPECT_EQ(Read(dw), (std::vector<float>{1, 2, 1, 2}));
}

}  // namespace
}  // namespace mptrain
