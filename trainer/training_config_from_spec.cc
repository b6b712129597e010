#include "trainer/training_config_from_spec.h"

#include "common/job_spec.h"

namespace mptrain {
namespace {

DType ComputeDType(v1::Precision precision) {
  switch (precision) {
    case v1::BF16: return DType::kBF16;
    case v1::FP32: return DType::kF32;
    default: return DType::kF16;
  }
}

}  // namespace

absl::StatusOr<TrainingConfig> TrainingConfigFromSpec(const v1::JobSpec& original) {
  v1::JobSpec spec = original;
  ApplyJobSpecDefaults(&spec);
  if (absl::Status status = ValidateJobSpec(spec); !status.ok()) return status;

  TrainingConfig config;
  config.world_size = spec.world_size();
  config.model.widths = LayerWidths(spec.model());
  config.model.activation =
      spec.model().activation() == v1::GELU ? ActivationKind::kGelu : ActivationKind::kRelu;
  switch (spec.model().norm()) {
    case v1::LAYER_NORM: config.model.norm = NormKind::kLayerNorm; break;
    case v1::BATCH_NORM: config.model.norm = NormKind::kBatchNorm; break;
    case v1::SYNC_BATCH_NORM: config.model.norm = NormKind::kSyncBatchNorm; break;
    default: config.model.norm = NormKind::kNone; break;
  }
  if (spec.model().has_gpt()) {
    const v1::GptSpec& gpt = spec.model().gpt();
    config.model.gpt.vocab_size = gpt.vocab_size();
    config.model.gpt.padded_vocab_size =
        gpt.padded_vocab_size() != 0 ? gpt.padded_vocab_size() : gpt.vocab_size();
    config.model.gpt.context_length = gpt.context_length();
    config.model.gpt.layers = gpt.layers();
    config.model.gpt.heads = gpt.heads();
    config.model.gpt.width = gpt.width();
  }
  config.loss.type =
      spec.loss() == v1::CROSS_ENTROPY ? LossType::kCrossEntropy : LossType::kMse;
  config.loss.label_smoothing = spec.label_smoothing();
  if (spec.data().has_npy()) {
    config.data.source = DataConfig::Source::kNpy;
    config.data.features_path = spec.data().npy().features_path();
    config.data.targets_path = spec.data().npy().targets_path();
    config.data.shuffle = spec.data().npy().shuffle();
    config.data.shuffle_seed = static_cast<uint64_t>(spec.data().npy().shuffle_seed());
  } else if (spec.data().has_tokens()) {
    config.data.source = DataConfig::Source::kTokens;
    config.data.token_files.assign(spec.data().tokens().files().begin(),
                                   spec.data().tokens().files().end());
    config.data.shuffle = spec.data().tokens().shuffle();
    config.data.shuffle_seed = static_cast<uint64_t>(spec.data().tokens().shuffle_seed());
  } else {
    config.data.source = DataConfig::Source::kSynthetic;
    config.data.synthetic_seed = spec.data().synthetic().seed();
  }
  if (spec.has_eval_data()) {
    config.eval.features_path = spec.eval_data().features_path();
    config.eval.targets_path = spec.eval_data().targets_path();
    config.eval.every = spec.eval_every();
  }
  if (spec.has_eval_tokens()) {
    config.eval.token_files.assign(spec.eval_tokens().files().begin(),
                                   spec.eval_tokens().files().end());
    config.eval.batches = spec.eval_batches();
    config.eval.every = spec.eval_every();
  }
  if (spec.has_sample()) {
    const v1::SampleSpec& sample = spec.sample();
    config.sample.enabled = true;
    config.sample.prompt.assign(sample.prompt_tokens().begin(), sample.prompt_tokens().end());
    for (unsigned char byte : sample.prompt_text()) config.sample.prompt.push_back(byte);
    config.sample.byte_level = !sample.prompt_text().empty();
    config.sample.max_new_tokens = sample.max_new_tokens();
    config.sample.temperature = sample.temperature();
    config.sample.top_k = sample.top_k();
    config.sample.seed = static_cast<uint64_t>(sample.seed());
  }
  config.micro_batch_size = spec.micro_batch_size();
  config.accumulation_steps = spec.accumulation_steps();
  config.steps = spec.steps();
  config.compute_dtype = ComputeDType(spec.precision());
  config.grad_comm_dtype = ComputeDType(spec.grad_comm_dtype());
  const v1::OptimizerSpec& optimizer = spec.optimizer();
  config.optimizer.type = optimizer.kind() == v1::ADAM    ? OptimizerType::kAdam
                          : optimizer.kind() == v1::ADAMW ? OptimizerType::kAdamW
                                                          : OptimizerType::kSgd;
  config.optimizer.lr = optimizer.lr();
  config.optimizer.weight_decay = optimizer.weight_decay();
  config.optimizer.momentum = optimizer.momentum();
  config.optimizer.nesterov = optimizer.nesterov();
  if (config.optimizer.type != OptimizerType::kSgd) {  // Set by the defaults.
    config.optimizer.beta1 = optimizer.beta1();
    config.optimizer.beta2 = optimizer.beta2();
    config.optimizer.eps = optimizer.eps();
  }
  const v1::LrSchedule& schedule = spec.lr_schedule();
  switch (schedule.kind()) {
    case v1::WARMUP_COSINE: config.lr_schedule.type = ScheduleType::kWarmupCosine; break;
    case v1::WARMUP_LINEAR: config.lr_schedule.type = ScheduleType::kWarmupLinear; break;
    case v1::STEP: config.lr_schedule.type = ScheduleType::kStep; break;
    default: config.lr_schedule.type = ScheduleType::kConstant; break;
  }
  config.lr_schedule.warmup_steps = schedule.warmup_steps();
  config.lr_schedule.min_lr = schedule.min_lr();
  if (schedule.kind() == v1::STEP) {
    config.lr_schedule.step_size = schedule.step_size();
    config.lr_schedule.gamma = schedule.gamma();
  }
  const v1::LossScalerSpec& scaler = spec.loss_scaler();  // Every field set by the defaults.
  config.loss_scaler.enabled = scaler.enabled();
  config.loss_scaler.init_scale = scaler.init_scale();
  config.loss_scaler.growth_factor = scaler.growth_factor();
  config.loss_scaler.backoff_factor = scaler.backoff_factor();
  config.loss_scaler.growth_interval = scaler.growth_interval();
  config.max_grad_norm = spec.max_grad_norm();
  config.deterministic = spec.deterministic();
  config.seed = static_cast<uint64_t>(spec.seed());
  config.init_checkpoint = spec.init_checkpoint();
  config.output_checkpoint = spec.output_checkpoint();
  config.telemetry_every = spec.telemetry_every();
  config.checkpoint_every = spec.checkpoint_every();
  config.checkpoint_dir = spec.checkpoint_dir();
  if (spec.keep_checkpoints() != 0) config.keep_checkpoints = spec.keep_checkpoints();
  config.overwrite_output = spec.overwrite_output();
  return config;
}

}  // namespace mptrain
