#pragma once

// What one rank trains, as a plain struct: built once from the wire spec, with its defaults
// applied and its rules checked (training_config_from_spec.h). Nothing below that builder (the
// loop, the model, the data, checkpoints) sees the protobuf schema.

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/backend_types.h"

namespace mptrain {

// The normalization after each hidden Linear, before its activation (README "Normalization
// layers"): torch.nn.LayerNorm, BatchNorm1d, or SyncBatchNorm over every rank's micro-batch.
enum class NormKind { kNone, kLayerNorm, kBatchNorm, kSyncBatchNorm };

inline bool IsBatchNorm(NormKind norm) {
  return norm == NormKind::kBatchNorm || norm == NormKind::kSyncBatchNorm;
}

// A GPT-2 language model (proto GptSpec, trainer/model/gpt_model.h); layers == 0: none.
struct GptConfig {
  int64_t vocab_size = 0;         // V: token ids are in [0, V).
  int64_t padded_vocab_size = 0;  // Vp >= V: wte's rows (llm.c's padding).
  int64_t context_length = 0;     // T: tokens per sequence, and wpe's rows.
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t width = 0;              // C
  bool enabled() const { return layers > 0; }
};

struct ModelConfig {
  // Layer widths [input_dim, hidden..., output_dim]: Linear(widths[i], widths[i + 1]) with the
  // activation between consecutive layers.
  std::vector<int64_t> widths;
  ActivationKind activation = ActivationKind::kRelu;
  NormKind norm = NormKind::kNone;
  // When enabled, the model is this GPT and widths, activation and norm are unused.
  GptConfig gpt;

  int64_t input_dim() const { return widths.front(); }
  int64_t output_dim() const { return widths.back(); }
};

enum class LossType { kMse, kCrossEntropy };

struct LossConfig {
  LossType type = LossType::kMse;
  double label_smoothing = 0;  // kCrossEntropy: ε in [0, 1].
};

struct DataConfig {
  enum class Source { kSynthetic, kNpy, kTokens };
  Source source = Source::kSynthetic;
  // kSynthetic: rank r draws one fixed batch from synthetic_seed + r.
  int64_t synthetic_seed = 0;
  // kNpy: float32 [N, input_dim] features and float32 [N, output_dim] targets, or int64/int32
  // [N] class ids in [0, output_dim) for a classification loss.
  std::string features_path;
  std::string targets_path;
  // kNpy: epochs with DistributedSampler(shuffle=True, seed=shuffle_seed) semantics
  // (trainer/data/sampler.h) instead of contiguous shards walked in order.
  bool shuffle = false;
  uint64_t shuffle_seed = 0;
  // kTokens (model.gpt): the token files in order, already expanded and confined by the
  // worker (trainer/data/token_shards.h); shuffle and shuffle_seed as TokenData's.
  std::vector<std::string> token_files;
};

// Held-out data evaluated every `every` steps (0: after the last step only) when not empty.
struct EvalConfig {
  std::string features_path;
  std::string targets_path;
  int64_t every = 0;
  // A language model's held-out tokens: eval_batches micro-batches of every rank from the
  // start of these files (never shuffled).
  std::vector<std::string> token_files;
  int64_t batches = 20;
  bool enabled() const { return !features_path.empty() || !token_files.empty(); }
};

enum class OptimizerType { kSgd, kAdam, kAdamW };

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kSgd;
  double lr = 0;  // The base learning rate.
  double weight_decay = 0;
  double momentum = 0;  // kSgd
  bool nesterov = false;
  double beta1 = 0.9;   // kAdam, kAdamW
  double beta2 = 0.999;
  double eps = 1e-8;
};

enum class ScheduleType { kConstant, kWarmupCosine, kWarmupLinear, kStep };

// The learning-rate schedule (trainer/optim/schedule.h).
struct ScheduleConfig {
  ScheduleType type = ScheduleType::kConstant;
  int64_t warmup_steps = 0;  // kWarmup*
  double min_lr = 0;         // kWarmup*
  int64_t step_size = 1;     // kStep
  double gamma = 1;          // kStep
};

// torch.amp.GradScaler.
struct LossScalerConfig {
  bool enabled = false;
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// Text generation after each evaluation and at the end (rank 0; proto SampleSpec,
// trainer/model/gpt_sampler.h).
struct SampleConfig {
  bool enabled = false;
  std::vector<int64_t> prompt;  // Token ids (prompt_text's bytes when byte_level).
  bool byte_level = false;      // The prompt was text: the sample is shown as text.
  int64_t max_new_tokens = 0;
  double temperature = 1;
  int64_t top_k = 0;  // 0: every token.
  uint64_t seed = 0;
};

struct TrainingConfig {
  int world_size = 1;
  ModelConfig model;
  LossConfig loss;
  DataConfig data;
  EvalConfig eval;
  SampleConfig sample;
  int64_t micro_batch_size = 1;
  int64_t accumulation_steps = 1;
  int64_t steps = 1;  // Optimizer steps.
  // The autocast dtype of GEMM inputs and activations (kF32: no autocast).
  DType compute_dtype = DType::kF16;
  // The dtype gradients are allreduced in: kF32, or kF16 / kBF16 with the semantics of DDP's
  // fp16/bf16 compress hooks (trainer/gradient_communicator.h).
  DType grad_comm_dtype = DType::kF32;
  OptimizerConfig optimizer;
  ScheduleConfig lr_schedule;
  LossScalerConfig loss_scaler;
  double max_grad_norm = 0;  // 0: no clipping.
  uint64_t seed = 0;         // Parameter initialisation.
  std::string init_checkpoint;    // Empty: initialise from the seed.
  std::string output_checkpoint;  // Empty: none.
  int64_t telemetry_every = 1;
  int64_t checkpoint_every = 0;  // 0: no checkpoints.
  std::string checkpoint_dir;
  // The job's newest checkpoints kept in checkpoint_dir (-1: all); older ones of the same job
  // go (only files stamped with the job's stamp: a run without one deletes nothing).
  int keep_checkpoints = 3;
  bool overwrite_output = false;
  // The output paths are already resolved (a worker's rank: realpath, confined to its output
  // roots): checkpoint and output writes then follow no symbolic link on the way, so a
  // directory swapped for a link during training cannot redirect them.
  bool output_paths_resolved = false;
  // Record one optimizer step where the backend can (CUDA graphs) and replay it for the next
  // ones: the same work, bit for bit, for a fraction of the launch cost (train_loop.cc says
  // when). Off: every step issued op by op (a rank started with MPTRAIN_STEP_GRAPHS=0).
  bool record_steps = true;
  // JobSpec.deterministic (Backend::SetDeterministic).
  bool deterministic = false;
};

}  // namespace mptrain
