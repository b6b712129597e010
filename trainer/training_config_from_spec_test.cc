#include "trainer/training_config_from_spec.h"

#include <utility>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

v1::JobSpec MinimalSpec() {
  v1::JobSpec spec;
  spec.set_world_size(2);
  spec.set_device(v1::CPU);
  spec.mutable_model()->set_input_dim(8);
  spec.mutable_model()->add_hidden_dims(6);
  spec.mutable_model()->set_output_dim(3);
  spec.mutable_data()->mutable_synthetic()->set_seed(4);
  spec.set_micro_batch_size(5);
  spec.set_accumulation_steps(2);
  spec.set_steps(7);
  spec.mutable_optimizer()->set_lr(0.25);
  return spec;
}

TEST(TrainingConfigFromSpec, MinimalSpec_GetsTheDefaultsOnce) {
  absl::StatusOr<TrainingConfig> config = TrainingConfigFromSpec(MinimalSpec());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->world_size, 2);
  EXPECT_EQ(config->model.widths, (std::vector<int64_t>{8, 6, 3}));
  EXPECT_EQ(config->model.activation, ActivationKind::kRelu);
  EXPECT_EQ(config->model.norm, NormKind::kNone);
  EXPECT_EQ(config->loss.type, LossType::kMse);
  EXPECT_EQ(config->data.source, DataConfig::Source::kSynthetic);
  EXPECT_EQ(config->data.synthetic_seed, 4);
  EXPECT_EQ(config->micro_batch_size, 5);
  EXPECT_EQ(config->accumulation_steps, 2);
  EXPECT_EQ(config->steps, 7);
  EXPECT_EQ(config->compute_dtype, DType::kF16);  // precision defaults to fp16
  EXPECT_TRUE(config->loss_scaler.enabled);       // ... which turns the scaler on
  EXPECT_EQ(config->loss_scaler.init_scale, 65536.0);
  EXPECT_EQ(config->loss_scaler.growth_factor, 2.0);
  EXPECT_EQ(config->loss_scaler.backoff_factor, 0.5);
  EXPECT_EQ(config->loss_scaler.growth_interval, 2000);
  EXPECT_EQ(config->telemetry_every, 1);
  EXPECT_EQ(config->optimizer.lr, 0.25);
}

TEST(TrainingConfigFromSpec, ExplicitValues_AreKept) {
  v1::JobSpec spec = MinimalSpec();
  spec.set_precision(v1::BF16);
  spec.mutable_model()->set_activation(v1::GELU);
  spec.mutable_data()->mutable_npy()->set_features_path("/d/x.npy");
  spec.mutable_data()->mutable_npy()->set_targets_path("/d/y.npy");
  spec.mutable_loss_scaler()->set_growth_interval(10);
  spec.set_telemetry_every(3);
  spec.set_checkpoint_every(4);
  spec.set_checkpoint_dir("/out");
  spec.set_seed(99);
  absl::StatusOr<TrainingConfig> config = TrainingConfigFromSpec(spec);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->compute_dtype, DType::kBF16);
  EXPECT_FALSE(config->loss_scaler.enabled) << "the scaler is on by default for fp16 only";
  EXPECT_EQ(config->model.activation, ActivationKind::kGelu);
  EXPECT_EQ(config->data.source, DataConfig::Source::kNpy);
  EXPECT_EQ(config->data.features_path, "/d/x.npy");
  EXPECT_EQ(config->data.targets_path, "/d/y.npy");
  EXPECT_EQ(config->loss_scaler.growth_interval, 10);
  EXPECT_EQ(config->telemetry_every, 3);
  EXPECT_EQ(config->checkpoint_every, 4);
  EXPECT_EQ(config->checkpoint_dir, "/out");
  EXPECT_EQ(config->seed, 99u);
}

TEST(TrainingConfigFromSpec, Norm_IsCarried) {
  for (const auto& [wire, kind] :
       {std::pair{v1::NONE, NormKind::kNone}, std::pair{v1::LAYER_NORM, NormKind::kLayerNorm},
        std::pair{v1::BATCH_NORM, NormKind::kBatchNorm},
        std::pair{v1::SYNC_BATCH_NORM, NormKind::kSyncBatchNorm}}) {
    v1::JobSpec spec = MinimalSpec();
    spec.mutable_model()->set_norm(wire);
    absl::StatusOr<TrainingConfig> config = TrainingConfigFromSpec(spec);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->model.norm, kind) << wire;
  }
}

TEST(TrainingConfigFromSpec, BrokenRule_IsInvalidArgumentNamingTheField) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_model()->set_hidden_dims(0, 0);
  absl::StatusOr<TrainingConfig> config = TrainingConfigFromSpec(spec);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(config.status().message().find("model.hidden_dims[0]"), absl::string_view::npos)
      << config.status();
}

}  // namespace
}  // namespace mptrain
