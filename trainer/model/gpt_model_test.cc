// GptModel on the CPU backend: its table (HF names, Conv1D checkpoint shapes, decay groups,
// gradient groups in backward order), and its backward against central differences of its own
// forward in fp32 (every parameter), with the padded vocabulary and gradient accumulation.

#include "trainer/model/gpt_model.h"

#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_collectives.h"
#include "trainer/normal_draws.h"

namespace mptrain {
namespace {

GptConfig TinyConfig() {
  GptConfig config;
  config.vocab_size = 7;
  config.padded_vocab_size = 9;
  config.context_length = 4;
  config.layers = 2;
  config.heads = 2;
  config.width = 8;
  return config;
}

TEST(GptParameterTable, HuggingFaceNamesShapesAndGroups) {
  const ParameterTable table = GptParameterTable(TinyConfig());
  const ParameterSpec* wte = table.Find("transformer.wte.weight");
  ASSERT_NE(wte, nullptr);
  EXPECT_EQ(wte->offset, 0);
  EXPECT_EQ(wte->shape, (std::vector<int64_t>{9, 8}));
  EXPECT_EQ(wte->checkpoint_shape(), (std::vector<int64_t>{7, 8}));
  const ParameterSpec* attn = table.Find("transformer.h.1.attn.c_attn.weight");
  ASSERT_NE(attn, nullptr);
  EXPECT_EQ(attn->shape, (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(attn->checkpoint_shape(), (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(table.Find("transformer.h.0.mlp.c_proj.weight")->checkpoint_shape(),
            (std::vector<int64_t>{32, 8}));
  EXPECT_FALSE(table.Find("transformer.h.0.mlp.c_fc.bias")->weight_decay);
  EXPECT_FALSE(table.Find("transformer.ln_f.weight")->weight_decay);
  EXPECT_TRUE(table.Find("transformer.wpe.weight")->weight_decay);
  EXPECT_EQ(table.Find("lm_head.weight"), nullptr);  // Tied: not a parameter of its own.
  // wte, wpe, the blocks, ln_f: contiguous spans in order.
  ASSERT_EQ(table.groups().size(), 5u);
  EXPECT_EQ(table.groups()[0].end, 72);
  EXPECT_EQ(table.groups()[1].end, 72 + 32);
  EXPECT_EQ(table.groups()[4].end, table.total());
  for (size_t i = 1; i < table.groups().size(); ++i) {
    EXPECT_EQ(table.groups()[i].begin, table.groups()[i - 1].end);
  }
}

// The coordinator's estimate plans with TraitsForDevice(cpu); the CPU rank with what its backend
// reports: the same plan.
TEST(GptBackendTraits, CpuBackend_IsWhatTraitsForDeviceSays) {
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  GptConfig config;
  config.vocab_size = 97, config.padded_vocab_size = 128, config.context_length = 16;
  config.layers = 2, config.heads = 4, config.width = 32;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    absl::StatusOr<Tensor> low = backend.Allocate(dtype, 1, 1);
    ASSERT_TRUE(low.ok());
    const GptBackendTraits got = BackendGptTraits(backend, low->element_bytes, dtype, 3, config);
    const GptBackendTraits want = TraitsForDevice(/*cuda=*/false, dtype, 3, config);
    EXPECT_EQ(got.low_element_bytes, want.low_element_bytes);
    EXPECT_EQ(got.attention_saved_rows, want.attention_saved_rows);
    EXPECT_EQ(got.attention_saved_cols, want.attention_saved_cols);
    EXPECT_EQ(got.fused_loss, want.fused_loss);
    EXPECT_EQ(LogitsColumns(config, got), 97);  // The CPU's loss reads contiguous logits.
  }
}

// GPT-2's init: normal(0, 0.02) weights and embeddings, residual projections 0.02 / sqrt(2L),
// zero biases, LayerNorms 1 and 0; the same for a seed on every call (whatever was in the
// buffer before), another for another seed; each value std · the draw of its index.
TEST(GptModel, InitializeParameters_AreGpt2s_AndASeedsOwn) {
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  GptConfig config;
  config.vocab_size = 3000, config.padded_vocab_size = 3008, config.context_length = 64;
  config.layers = 3, config.heads = 4, config.width = 256;
  auto model = GptModel::Create(&backend, config, DType::kF32, 1, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  auto initialized = [&](uint64_t seed) {
    std::vector<float> values((*model)->table().total(), 0.0f);
    EXPECT_TRUE((*model)->InitializeParameters(seed).ok());
    EXPECT_TRUE(backend.Download((*model)->params(), values.data()).ok());
    return values;
  };
  std::vector<float> garbage((*model)->table().total(), 3.0f);
  ASSERT_TRUE(backend.Upload(garbage.data(), (*model)->params()).ok());
  const std::vector<float> init = initialized(7);
  EXPECT_EQ(init, initialized(7));
  EXPECT_NE(init, initialized(8));
  for (const ParameterSpec& spec : (*model)->table().parameters()) {
    if (spec.shape.size() == 2 && spec.name.find(".ln_") == std::string::npos) {
      const double std = spec.name.find("c_proj.weight") != std::string::npos
                             ? 0.02 / std::sqrt(6.0)
                             : 0.02;
      for (int64_t i : {int64_t{0}, spec.numel / 2, spec.numel - 1}) {
        EXPECT_EQ(init[spec.offset + i],
                  NormalParameterValue(7, static_cast<uint64_t>(spec.offset + i), std))
            << spec.name << " [" << i << "]";
      }
    }
    double sum = 0, squares = 0;
    for (int64_t i = 0; i < spec.numel; ++i) {
      sum += init[spec.offset + i];
      squares += static_cast<double>(init[spec.offset + i]) * init[spec.offset + i];
    }
    const double mean = sum / spec.numel, rms = std::sqrt(squares / spec.numel);
    if (spec.name.find(".ln_") != std::string::npos) {
      const bool weight = spec.name.find(".weight") != std::string::npos;
      EXPECT_EQ(mean, weight ? 1.0 : 0.0) << spec.name;
    } else if (spec.shape.size() == 1) {
      EXPECT_EQ(rms, 0.0) << spec.name;
    } else {
      const double want = spec.name.find("c_proj.weight") != std::string::npos
                              ? 0.02 / std::sqrt(6.0)
                              : 0.02;
      EXPECT_NEAR(rms, want, 0.03 * want) << spec.name;
      EXPECT_NEAR(mean, 0.0, 5 * want / std::sqrt(static_cast<double>(spec.numel))) << spec.name;
    }
  }
}

TEST(GptModel, RefusesConfigurationsThatAreNoGpt) {
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  GptConfig config = TinyConfig();
  config.heads = 3;
  EXPECT_EQ(GptModel::Create(&backend, config, DType::kF32, 2, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  config = TinyConfig();
  config.padded_vocab_size = 6;
  EXPECT_FALSE(GptModel::Create(&backend, config, DType::kF32, 2, 1).ok());
}

class GptGradientTest : public ::testing::Test {
 protected:
  GptGradientTest() : backend_(std::make_unique<testing::SingleRankCollective>()) {}

  void SetUp() override {
    model_ = *GptModel::Create(&backend_, TinyConfig(), DType::kF32, kSequences, 2);
    // Larger values than GPT-2's init, so that every gradient is well above fp32's noise.
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.4f);
    params_.resize(model_->table().total());
    for (float& p : params_) p = normal(rng);
    for (const ParameterSpec& spec : model_->table().parameters()) {
      if (spec.name.find("ln_") != std::string::npos &&
          spec.name.find("weight") != std::string::npos) {
        for (int64_t i = 0; i < spec.numel; ++i) params_[spec.offset + i] += 1.0f;
      }
    }
    ids_ = *backend_.Allocate(DType::kF32, kSequences * 4, 1);
    std::vector<float> ids = {1, 3, 6, 0, 2, 2, 5, 4};
    targets_ = {3, 6, 0, 2, 2, 5, 4, 1};
    ASSERT_TRUE(backend_.Upload(ids.data(), ids_).ok());
  }

  // The mean cross-entropy of the forward at `params` over the V logits; fills d_logits.
  double Loss(const std::vector<float>& params, std::vector<float>* d_logits = nullptr) {
    EXPECT_TRUE(backend_.Upload(params.data(), model_->params()).ok());
    EXPECT_TRUE(model_->Forward(ids_, false, true).ok());
    const Tensor logits = model_->output();
    std::vector<float> values(logits.numel());
    EXPECT_TRUE(backend_.Download(logits, values.data()).ok());
    const int64_t rows = logits.rows, V = logits.cols;
    EXPECT_EQ(V, 7);
    double loss = 0;
    if (d_logits != nullptr) d_logits->assign(values.size(), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      double max = -INFINITY, sum = 0;
      for (int64_t c = 0; c < V; ++c) max = std::max<double>(max, values[r * V + c]);
      for (int64_t c = 0; c < V; ++c) sum += std::exp(values[r * V + c] - max);
      loss += -(values[r * V + static_cast<int64_t>(targets_[r])] - max - std::log(sum)) / rows;
      if (d_logits != nullptr) {
        for (int64_t c = 0; c < V; ++c) {
          const double p = std::exp(values[r * V + c] - max) / sum;
          (*d_logits)[r * V + c] = static_cast<float>((p - (c == targets_[r] ? 1 : 0)) / rows);
        }
      }
    }
    return loss;
  }

  // One backward of micro-batch `micro` with the loss's gradient at params_.
  void Backward(int64_t micro) {
    std::vector<float> d_logits;
    Loss(params_, &d_logits);
    ASSERT_TRUE(backend_.Upload(d_logits.data(), model_->output_grad()).ok());
    ASSERT_TRUE(model_->Backward(micro, nullptr).ok());
  }

  static constexpr int64_t kSequences = 2;
  CpuBackend backend_;
  std::unique_ptr<GptModel> model_;
  std::vector<float> params_;
  Tensor ids_;
  std::vector<float> targets_;
};

TEST_F(GptGradientTest, EveryGradientMatchesCentralDifferences_PaddedRowsGetZero) {
  Backward(0);
  Backward(1);  // Accumulation: the two micro-batches' (equal) gradients summed.
  const int64_t n = model_->table().total();
  std::vector<float> grads(n);
  ASSERT_TRUE(backend_.Download(model_->param_grads(), grads.data()).ok());
  const ParameterSpec& wte = *model_->table().Find("transformer.wte.weight");
  for (int64_t i = 7 * 8; i < wte.numel; ++i) EXPECT_EQ(grads[i], 0.0f) << "padded row " << i;
  int checked = 0, large = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i >= 7 * 8 && i < wte.numel) continue;
    std::vector<float> plus = params_, minus = params_;
    const float h = 1e-2f;
    plus[i] += h;
    minus[i] -= h;
    const double numeric = 2 * (Loss(plus) - Loss(minus)) / (2.0 * h);
    const double error = std::abs(grads[i] - numeric);
    worst = std::max(worst, error / (1e-3 + std::abs(numeric)));
    EXPECT_NEAR(grads[i], numeric, 2e-3 + 0.03 * std::abs(numeric))
        << model_->table().parameters().size() << " element " << i;
    ++checked;
    if (std::abs(numeric) > 1e-2) ++large;
  }
  EXPECT_GT(large, checked / 4) << "too few gradients are large enough to mean anything";
  RecordProperty("worst_relative_error", std::to_string(worst));
}

TEST_F(GptGradientTest, RefusesTokenIdsOutsideTheVocabularyAndPartialSequences) {
  ASSERT_TRUE(backend_.Upload(params_.data(), model_->params()).ok());
  for (float id : {7.0f, 9.0f, -1.0f}) {  // 7, 8: padded rows of wte, yet no tokens.
    Tensor bad = *backend_.Allocate(DType::kF32, 4, 1);
    std::vector<float> ids = {1, 2, id, 0};
    ASSERT_TRUE(backend_.Upload(ids.data(), bad).ok());
    absl::Status status = model_->Forward(bad, false, true);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_NE(status.message().find("[0, 7)"), std::string::npos) << status;
  }
  // Not a whole number of sequences; more than the micro-batch.
  EXPECT_EQ(model_->Forward(*backend_.Allocate(DType::kF32, 3, 1), false, true).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->Forward(*backend_.Allocate(DType::kF32, 12, 1), false, true).code(),
            absl::StatusCode::kInvalidArgument);
  // One sequence (evaluation's remainder) is fine; Backward then needs a whole batch.
  ASSERT_TRUE(model_->Forward(*backend_.Allocate(DType::kF32, 4, 1), false, false).ok());
  EXPECT_EQ(model_->output().rows, 4);
  EXPECT_EQ(model_->Backward(0, nullptr).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace mptrain
