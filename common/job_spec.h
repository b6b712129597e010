#pragma once

// Job specs: parsing from JSON (protobuf's JSON mapping), defaults, and validation.
// Validation is a pure function so that the coordinator, the CLI and the tests share it.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/mptrain.pb.h"

namespace mptrain {

// PyTorch's GradScaler defaults.
inline constexpr double kDefaultInitScale = 65536.0;
inline constexpr double kDefaultGrowthFactor = 2.0;
inline constexpr double kDefaultBackoffFactor = 0.5;
inline constexpr int64_t kDefaultGrowthInterval = 2000;
inline constexpr double kDefaultProgressTimeoutS = 300;
inline constexpr double kDefaultCollectiveTimeoutS = 60;
inline constexpr double kMaxCollectiveTimeoutS = 3600;
// Ranks of one job; also the most slots one worker may declare (coordinator/worker_registry.h).
inline constexpr int kMaxWorldSize = 1024;
// Checkpoints a job keeps in its checkpoint_dir (JobSpec.keep_checkpoints).
inline constexpr int kDefaultKeptCheckpoints = 3;
inline constexpr int kMaxKeptCheckpoints = 1000;
// JobSpec.grad_comm_lanes: at most comm/lane_plan.h's kMaxLanes communicators.
inline constexpr uint32_t kMaxGradCommLanes = 8;
// model.gpt (proto GptSpec) and its data (TokenData, SampleSpec): the bounds of issue #28.
inline constexpr int64_t kMaxGptVocabSize = int64_t{1} << 20;
inline constexpr int64_t kMaxGptContextLength = int64_t{1} << 16;
inline constexpr int64_t kMaxGptLayers = 256;
inline constexpr int64_t kMaxGptWidth = int64_t{1} << 16;
// micro_batch_size * context_length: the token buffers of one micro-batch stay bounded (the
// same bound as trainer/data/token_shards.h kMaxTokensPerMicroBatch).
inline constexpr int64_t kMaxGptTokensPerMicroBatch = int64_t{1} << 24;
// What the CUDA backend's causal attention runs (backends/cuda/cuda_language_model_ops.cc
// checks the same): in fp16/bf16 cuDNN's fused SDPA, which takes a head size (width / heads)
// that is a multiple of 8 and at most 256 (at most 128 before Hopper: such a GPU's rank fails
// at its first step, naming cuDNN's limit) and sequences of at least 2 positions; in fp32 our
// own kernel, which keeps a row's scores in shared memory: at most 8192 positions.
inline constexpr int64_t kCudaFusedAttentionHeadSizeMultiple = 8;
inline constexpr int64_t kMaxCudaFusedAttentionHeadSize = 256;
inline constexpr int64_t kMinCudaFusedAttentionContext = 2;
inline constexpr int64_t kMaxCudaFp32AttentionContext = 8192;
inline constexpr int kMaxTokenFileEntries = 4096;  // TokenData.files
inline constexpr int64_t kDefaultEvalBatches = 20;
inline constexpr int64_t kMaxEvalBatches = 10000;
inline constexpr int64_t kMaxSampleTokens = 4096;  // max_new_tokens, prompt_tokens, prompt_text
// Until the GPT model is trained by this build (#28), a spec that passes every rule for
// model.gpt is still refused (UNIMPLEMENTED) at the end of ValidateJobSpec; the model's commit
// sets this to true.
inline constexpr bool kGptModelTrainable = true;
// torch.optim.Adam's defaults.
inline constexpr double kDefaultAdamBeta1 = 0.9;
inline constexpr double kDefaultAdamBeta2 = 0.999;
inline constexpr double kDefaultAdamEps = 1e-8;

// Parses a JSON job spec. Unknown fields are refused; enum values are case-insensitive.
// INVALID_ARGUMENT: malformed JSON, unknown field or wrong type (protobuf's message says which).
absl::StatusOr<v1::JobSpec> ParseJobSpecJson(std::string_view json);

// Reads and parses a JSON job spec file. NOT_FOUND / INVALID_ARGUMENT name the file.
// The largest job spec file read (JSON is far larger than the binary spec's kMaxSpecBytes).
inline constexpr size_t kMaxSpecJsonBytes = size_t{1} << 20;
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path);

// Fills fields the user may leave out: activation (RELU) and norm (NONE) for the MLP, loss (MSE;
// CROSS_ENTROPY for model.gpt), eval_batches (20, with eval_tokens), sample.temperature (1, with
// sample), precision (FP16),
// telemetry_every (1), progress_timeout_s (300), collective_timeout_s (60), every unset
// loss_scaler field (PyTorch's defaults; enabled only for FP16), optimizer.kind (SGD) and, for
// adam/adamw, the unset betas and eps (PyTorch's defaults). Idempotent.
void ApplyJobSpecDefaults(v1::JobSpec* spec);

// Checks every rule of a spec (after ApplyJobSpecDefaults). INVALID_ARGUMENT names the first
// field at fault, the rule and the value, e.g. "model.hidden_dims[1] must be > 0, got 0".
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// JobSpec.labels' rules (at most kMaxLabels; keys 1-63, values 0-63 characters of
// [A-Za-z0-9._-], a key starting with a letter or digit), for `field` ("labels",
// "label_selector"). INVALID_ARGUMENT names the field and the rule, never the text.
constexpr int kMaxLabels = 16;
absl::Status ValidateLabels(const google::protobuf::Map<std::string, std::string>& labels,
                            const std::string& field);

// A file or directory a spec names: its field ("data.tokens.files[2]"), the path (for token
// files possibly a pattern in its last component) and whether the rank writes it. The
// coordinator checks each against the workers' roots at submit.
struct SpecPath {
  std::string field;
  std::string path;
  bool write = false;
};
std::vector<SpecPath> SpecPaths(const v1::JobSpec& spec);

// Layer widths [input_dim, hidden_dims..., output_dim].
std::vector<int64_t> LayerWidths(const v1::ModelSpec& model);

// Total number of parameters (weights and biases) of the MLP.
int64_t ParameterCount(const v1::ModelSpec& model);

// Whether this spec trains with a loss scaler (after defaults).
bool LossScalingEnabled(const v1::JobSpec& spec);

}  // namespace mptrain
