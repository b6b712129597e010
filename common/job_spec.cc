#include "common/job_spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/path_rules.h"
#include "common/small_file.h"
#include "common/status_macros.h"
#include "common/token_file_pattern.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/util/json_util.h"

namespace mptrain {
namespace {

// Limits that keep a typo from asking for terabytes; a real model here is far below them.
constexpr int64_t kMaxLayerWidth = int64_t{1} << 20;
constexpr int kMaxLayers = 64;
constexpr int64_t kMaxMicroBatch = int64_t{1} << 24;
constexpr int kMaxRestarts = 100;
constexpr int64_t kMaxAccumulationSteps = int64_t{1} << 16;
constexpr int64_t kMaxSteps = 1'000'000'000;
constexpr double kMaxQueueTimeoutS = 30.0 * 24 * 3600;
// Timeouts are used in whole milliseconds: below one they would be 0 (no timeout at all).
constexpr double kMinTimeoutS = 0.001;
constexpr double kMaxProgressTimeoutS = 30.0 * 24 * 3600;
// The scaler's growth tracker is a 32-bit counter on the device.
constexpr int64_t kMaxGrowthInterval = 1'000'000'000;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// The shortest text that reads back as `value`: "%g" rounded 2592001 to 2.592e+06, the limit
// it broke.
std::string Num(double value) {
  char text[64];
  const std::to_chars_result end = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, end.ptr);
}
// The same for a float's limits (FLT_MAX is 3.4028235e+38 as a float, not its double digits).
std::string FloatNum(float value) {
  char text[64];
  const std::to_chars_result end = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, end.ptr);
}

// The bounds of a spec number that the ranks use as a float32.
struct FloatRange {
  double low;
  bool low_open;  // (low, ... rather than [low, ...
  double high;
  bool high_open;
  std::string text;  // E.g. "(0, 1]".
};

FloatRange Range(double low, bool low_open, double high, bool high_open) {
  return {low, low_open, high, high_open,
          absl::StrCat(low_open ? "(" : "[", FloatNum(static_cast<float>(low)), ", ",
                       FloatNum(static_cast<float>(high)), high_open ? ")" : "]")};
}

bool InRange(double value, const FloatRange& range) {
  return (range.low_open ? value > range.low : value >= range.low) &&
         (range.high_open ? value < range.high : value <= range.high);
}

constexpr double kFloatMax = std::numeric_limits<float>::max();

// `value` must be finite and in `range` both as given and once rounded to float32, as the
// ranks use it: 3.5e38 is infinity as a float, 1e-50 is 0 and 0.9999999999 is 1. A value
// other than 0 must not become 0, even where 0 is in the range: 0 often means "off"
// (max_grad_norm 1e-46 would have turned clipping off).
absl::Status CheckFloat32(const std::string& field, double value, const FloatRange& range) {
  // Beyond FLT_MAX the conversion has no float value (and is undefined behaviour).
  const bool representable = std::isfinite(value) && std::fabs(value) <= kFloatMax;
  if (representable && InRange(value, range) &&
      InRange(static_cast<double>(static_cast<float>(value)), range)) {
    if (value != 0 && static_cast<float>(value) == 0) {
      return Invalid(absl::StrCat(field, " must be in ", range.text, " and not round to 0 as a "
                                  "float32, got ", Num(value), " (0 as a float32)"));
    }
    return absl::OkStatus();
  }
  std::string got = Num(value);
  if (representable && InRange(value, range)) {
    absl::StrAppend(&got, " (", FloatNum(static_cast<float>(value)), " as a float32)");
  } else if (std::isfinite(value) && !representable) {
    absl::StrAppend(&got, " (infinite as a float32)");
  }
  return Invalid(absl::StrCat(field, " must be in ", range.text, ", got ", got));
}

// The paths a spec names, for the character rule (the coordinator and the workers check the
// rest of their syntax and their roots).
std::vector<std::pair<const char*, const std::string*>> SpecPathFields(const v1::JobSpec& spec) {
  return {{"data.npy.features_path", &spec.data().npy().features_path()},
          {"data.npy.targets_path", &spec.data().npy().targets_path()},
          {"eval_data.features_path", &spec.eval_data().features_path()},
          {"eval_data.targets_path", &spec.eval_data().targets_path()},
          {"init_checkpoint", &spec.init_checkpoint()},
          {"output_checkpoint", &spec.output_checkpoint()},
          {"checkpoint_dir", &spec.checkpoint_dir()}};
}

absl::Status ValidateGpt(const v1::GptSpec& gpt) {
  struct Bound {
    const char* name;
    int64_t value, max;
  };
  for (const Bound& bound : {Bound{"vocab_size", gpt.vocab_size(), kMaxGptVocabSize},
                             Bound{"context_length", gpt.context_length(), kMaxGptContextLength},
                             Bound{"layers", gpt.layers(), kMaxGptLayers},
                             Bound{"width", gpt.width(), kMaxGptWidth}}) {
    if (bound.value < 1 || bound.value > bound.max) {
      return Invalid(absl::StrCat("model.gpt.", bound.name, " must be in [1, ", bound.max,
                                  "], got ", bound.value));
    }
  }
  if (gpt.heads() < 1 || gpt.width() % gpt.heads() != 0) {
    return Invalid(absl::StrCat("model.gpt.heads must be >= 1 and divide model.gpt.width = ",
                                gpt.width(), ", got ", gpt.heads()));
  }
  if (gpt.padded_vocab_size() != 0 && (gpt.padded_vocab_size() < gpt.vocab_size() ||
                                       gpt.padded_vocab_size() > kMaxGptVocabSize)) {
    return Invalid(absl::StrCat("model.gpt.padded_vocab_size must be 0 (= vocab_size) or in "
                                "[vocab_size = ", gpt.vocab_size(), ", ", kMaxGptVocabSize,
                                "], got ", gpt.padded_vocab_size()));
  }
  return absl::OkStatus();
}

// The shapes the CUDA backend's attention runs (job_spec.h, kCudaFusedAttention*): refused
// here, naming the fields, rather than by the rank at its first step.
absl::Status ValidateGptOnCuda(const v1::JobSpec& spec) {
  const v1::GptSpec& gpt = spec.model().gpt();
  const int64_t head_size = gpt.width() / gpt.heads();
  if (spec.precision() == v1::FP32) {
    if (gpt.context_length() > kMaxCudaFp32AttentionContext) {
      return Invalid(absl::StrCat(
          "model.gpt.context_length must be at most ", kMaxCudaFp32AttentionContext,
          " for an fp32 GPT on cuda (its attention keeps a row's scores in shared memory), got ",
          gpt.context_length(), ": use precision bf16 or fp16 (cuDNN's fused attention)"));
    }
    return absl::OkStatus();
  }
  const char* precision = spec.precision() == v1::BF16 ? "a bf16" : "an fp16";
  if (head_size % kCudaFusedAttentionHeadSizeMultiple != 0 ||
      head_size > kMaxCudaFusedAttentionHeadSize) {
    return Invalid(absl::StrCat(
        "model.gpt.width / model.gpt.heads (the head size) must be a multiple of ",
        kCudaFusedAttentionHeadSizeMultiple, " and at most ", kMaxCudaFusedAttentionHeadSize,
        " for ", precision, " GPT on cuda (cuDNN's fused attention), got ", gpt.width(),
        " / ", gpt.heads(), " = ", head_size, ": change width or heads, or use precision fp32"));
  }
  if (gpt.context_length() < kMinCudaFusedAttentionContext) {
    return Invalid(absl::StrCat("model.gpt.context_length must be at least ",
                                kMinCudaFusedAttentionContext, " for ", precision,
                                " GPT on cuda (cuDNN's fused attention), got ",
                                gpt.context_length(), ": use precision fp32"));
  }
  return absl::OkStatus();
}

// TokenData at `field` ("data.tokens", "eval_tokens").
absl::Status ValidateTokenData(const v1::TokenData& tokens, const std::string& field) {
  if (tokens.files_size() < 1 || tokens.files_size() > kMaxTokenFileEntries) {
    return Invalid(absl::StrCat(field, ".files must name 1 to ", kMaxTokenFileEntries,
                                " token files or patterns, got ", tokens.files_size()));
  }
  for (int i = 0; i < tokens.files_size(); ++i) {
    RETURN_IF_ERROR(CheckTokenFileEntry(absl::StrCat(field, ".files[", i, "]"), tokens.files(i)));
  }
  if (tokens.shuffle_seed() < 0) {
    return Invalid(absl::StrCat(field, ".shuffle_seed must be >= 0, got ", tokens.shuffle_seed()));
  }
  if (!tokens.shuffle() && tokens.shuffle_seed() != 0) {
    return Invalid(absl::StrCat(field, ".shuffle_seed needs ", field, ".shuffle"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSample(const v1::SampleSpec& sample, const v1::GptSpec& gpt) {
  if (sample.max_new_tokens() < 1 || sample.max_new_tokens() > kMaxSampleTokens) {
    return Invalid(absl::StrCat("sample.max_new_tokens must be in [1, ", kMaxSampleTokens,
                                "], got ", sample.max_new_tokens()));
  }
  if (!std::isfinite(sample.temperature()) || sample.temperature() <= 0) {
    return Invalid(absl::StrCat("sample.temperature must be a finite number > 0 (default 1), got ",
                                Num(sample.temperature())));
  }
  if (sample.top_k() < 0 || sample.top_k() > gpt.vocab_size()) {
    return Invalid(absl::StrCat("sample.top_k must be in [0, model.gpt.vocab_size = ",
                                gpt.vocab_size(), "] (0 = every token), got ", sample.top_k()));
  }
  if (sample.seed() < 0) {
    return Invalid(absl::StrCat("sample.seed must be >= 0, got ", sample.seed()));
  }
  if (sample.prompt_tokens_size() > 0 && !sample.prompt_text().empty()) {
    return Invalid("sample sets prompt_tokens or prompt_text, not both");
  }
  if (sample.prompt_tokens_size() == 0 && sample.prompt_text().empty()) {
    return Invalid("sample needs a prompt: prompt_tokens (token ids) or prompt_text");
  }
  if (sample.prompt_tokens_size() > kMaxSampleTokens) {
    return Invalid(absl::StrCat("sample.prompt_tokens may hold at most ", kMaxSampleTokens,
                                " tokens, got ", sample.prompt_tokens_size()));
  }
  for (int i = 0; i < sample.prompt_tokens_size(); ++i) {
    const int64_t token = sample.prompt_tokens(i);
    if (token < 0 || token >= gpt.vocab_size()) {
      return Invalid(absl::StrCat("sample.prompt_tokens[", i, "] must be in [0, vocab_size = ",
                                  gpt.vocab_size(), "), got ", token));
    }
  }
  if (static_cast<int64_t>(sample.prompt_text().size()) > kMaxSampleTokens) {
    return Invalid(absl::StrCat("sample.prompt_text may hold at most ", kMaxSampleTokens,
                                " bytes, got ", sample.prompt_text().size()));
  }
  // Its bytes are its tokens: every byte value must be a token id.
  if (!sample.prompt_text().empty() && gpt.vocab_size() < 256) {
    return Invalid(absl::StrCat("sample.prompt_text needs a byte-level vocabulary (model.gpt."
                                "vocab_size >= 256: each byte is a token), got vocab_size ",
                                gpt.vocab_size(), "; use prompt_tokens"));
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const v1::ModelSpec& model) {
  if (model.has_gpt()) {
    if (model.input_dim() != 0 || model.hidden_dims_size() != 0 || model.output_dim() != 0 ||
        model.activation() != v1::ACTIVATION_UNSPECIFIED ||
        model.norm() != v1::NORM_KIND_UNSPECIFIED) {
      return Invalid("model.gpt replaces the MLP: model.input_dim, hidden_dims, output_dim, "
                     "activation and norm must be unset");
    }
    return ValidateGpt(model.gpt());
  }
  if (model.input_dim() <= 0 || model.input_dim() > kMaxLayerWidth) {
    return Invalid(absl::StrCat("model.input_dim must be in [1, ", kMaxLayerWidth, "], got ",
                                model.input_dim()));
  }
  if (model.hidden_dims_size() + 1 > kMaxLayers) {
    return Invalid(absl::StrCat("model.hidden_dims may have at most ", kMaxLayers - 1,
                                " entries, got ", model.hidden_dims_size()));
  }
  for (int i = 0; i < model.hidden_dims_size(); ++i) {
    int64_t width = model.hidden_dims(i);
    if (width <= 0) {
      return Invalid(absl::StrCat("model.hidden_dims[", i, "] must be > 0, got ", width));
    }
    if (width > kMaxLayerWidth) {
      return Invalid(absl::StrCat("model.hidden_dims[", i, "] must be <= ", kMaxLayerWidth,
                                  ", got ", width));
    }
  }
  if (model.output_dim() <= 0 || model.output_dim() > kMaxLayerWidth) {
    return Invalid(absl::StrCat("model.output_dim must be in [1, ", kMaxLayerWidth, "], got ",
                                model.output_dim()));
  }
  if (model.activation() != v1::RELU && model.activation() != v1::GELU) {
    return Invalid(absl::StrCat("model.activation must be relu or gelu, got ",
                                model.activation()));
  }
  if (model.norm() != v1::NONE && model.norm() != v1::LAYER_NORM &&
      model.norm() != v1::BATCH_NORM && model.norm() != v1::SYNC_BATCH_NORM) {
    return Invalid(absl::StrCat(
        "model.norm must be none, layer_norm, batch_norm or sync_batch_norm, got ",
        model.norm()));
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::DataSpec& data) {
  switch (data.source_case()) {
    case v1::DataSpec::kSynthetic:
      if (data.synthetic().seed() < 0) {
        return Invalid(absl::StrCat("data.synthetic.seed must be >= 0, got ",
                                    data.synthetic().seed()));
      }
      return absl::OkStatus();
    case v1::DataSpec::kNpy:
      if (data.npy().features_path().empty()) {
        return Invalid("data.npy.features_path must name a .npy file, got an empty string");
      }
      if (data.npy().targets_path().empty()) {
        return Invalid("data.npy.targets_path must name a .npy file, got an empty string");
      }
      if (data.npy().shuffle_seed() < 0) {
        return Invalid(absl::StrCat("data.npy.shuffle_seed must be >= 0, got ",
                                    data.npy().shuffle_seed()));
      }
      if (!data.npy().shuffle() && data.npy().shuffle_seed() != 0) {
        return Invalid("data.npy.shuffle_seed needs data.npy.shuffle");
      }
      return absl::OkStatus();
    case v1::DataSpec::kTokens:
      return ValidateTokenData(data.tokens(), "data.tokens");
    case v1::DataSpec::SOURCE_NOT_SET:
      break;
  }
  return Invalid("data must set exactly one of data.synthetic, data.npy or data.tokens");
}

absl::Status ValidateOptimizer(const v1::OptimizerSpec& optimizer) {
  RETURN_IF_ERROR(CheckFloat32("optimizer.lr", optimizer.lr(), Range(0, true, kFloatMax, false)));
  const v1::OptimizerKind kind = optimizer.kind();
  if (kind != v1::SGD && kind != v1::ADAM && kind != v1::ADAMW) {
    return Invalid(absl::StrCat("optimizer.kind must be sgd, adam or adamw, got ", kind));
  }
  if (kind == v1::SGD) {
    if (optimizer.has_beta1() || optimizer.has_beta2() || optimizer.has_eps()) {
      return Invalid("optimizer.beta1, beta2 and eps apply to adam and adamw only");
    }
    if (optimizer.nesterov() && !(optimizer.momentum() > 0)) {
      return Invalid("optimizer.nesterov needs optimizer.momentum > 0");
    }
  } else {
    if (optimizer.momentum() != 0 || optimizer.nesterov()) {
      return Invalid("optimizer.momentum and nesterov apply to sgd only");
    }
    RETURN_IF_ERROR(CheckFloat32("optimizer.beta1", optimizer.beta1(), Range(0, false, 1, true)));
    RETURN_IF_ERROR(CheckFloat32("optimizer.beta2", optimizer.beta2(), Range(0, false, 1, true)));
    // > 0: Adam divides by sqrt(v) + eps, and v is 0 for a parameter whose gradient is.
    RETURN_IF_ERROR(CheckFloat32("optimizer.eps", optimizer.eps(), Range(0, true, 1, false)));
  }
  RETURN_IF_ERROR(
      CheckFloat32("optimizer.momentum", optimizer.momentum(), Range(0, false, 1, true)));
  RETURN_IF_ERROR(CheckFloat32("optimizer.weight_decay", optimizer.weight_decay(),
                               Range(0, false, kFloatMax, false)));
  return absl::OkStatus();
}

absl::Status ValidateLrSchedule(const v1::LrSchedule& schedule, const v1::JobSpec& spec) {
  const v1::LrScheduleKind kind = schedule.kind();
  const bool warmup = kind == v1::WARMUP_COSINE || kind == v1::WARMUP_LINEAR;
  if (kind != v1::CONSTANT && !warmup && kind != v1::STEP) {
    return Invalid(absl::StrCat(
        "lr_schedule.kind must be constant, warmup_cosine, warmup_linear or step, got ", kind));
  }
  if (!warmup && (schedule.warmup_steps() != 0 || schedule.min_lr() != 0)) {
    return Invalid("lr_schedule.warmup_steps and min_lr apply to warmup_cosine and "
                   "warmup_linear only");
  }
  if (kind != v1::STEP && (schedule.step_size() != 0 || schedule.gamma() != 0)) {
    return Invalid("lr_schedule.step_size and gamma apply to step only");
  }
  if (warmup) {
    if (schedule.warmup_steps() < 0 || schedule.warmup_steps() > spec.steps()) {
      return Invalid(absl::StrCat("lr_schedule.warmup_steps must be in [0, steps = ",
                                  spec.steps(), "], got ", schedule.warmup_steps()));
    }
    if (!std::isfinite(schedule.min_lr()) || schedule.min_lr() < 0 ||
        schedule.min_lr() > spec.optimizer().lr()) {
      return Invalid(absl::StrCat("lr_schedule.min_lr must be in [0, optimizer.lr], got ",
                                  Num(schedule.min_lr())));
    }
    // (optimizer.lr passed its own check: min_lr is finite as a float32 too.)
  }
  if (kind == v1::STEP) {
    if (schedule.step_size() < 1 || schedule.step_size() > kMaxSteps) {
      return Invalid(absl::StrCat("lr_schedule.step_size must be in [1, ", kMaxSteps, "], got ",
                                  schedule.step_size()));
    }
    RETURN_IF_ERROR(
        CheckFloat32("lr_schedule.gamma", schedule.gamma(), Range(0, true, 1, false)));
  }
  return absl::OkStatus();
}

absl::Status ValidateLossScaler(const v1::LossScalerSpec& scaler) {
  // The scale and its factors are float32 on the ranks (as GradScaler's tensors): each must
  // stay finite, and within its range, once rounded to float.
  constexpr double kFloatMin = std::numeric_limits<float>::min();
  const double init = scaler.init_scale();
  if (!std::isfinite(init) || init < kFloatMin || init > kFloatMax) {
    return Invalid(absl::StrCat("loss_scaler.init_scale must be a number in [", FloatNum(kFloatMin),
                                ", ", FloatNum(kFloatMax), "] (the scale is a float), got ",
                                Num(init)));
  }
  const double growth = scaler.growth_factor();
  if (!std::isfinite(growth) || growth > kFloatMax || static_cast<float>(growth) <= 1.0f) {
    return Invalid(absl::StrCat("loss_scaler.growth_factor must be > 1 as a float and at most ",
                                FloatNum(kFloatMax), ", got ", Num(growth)));
  }
  const double backoff = scaler.backoff_factor();
  if (!std::isfinite(backoff) || static_cast<float>(backoff) <= 0.0f ||
      static_cast<float>(backoff) >= 1.0f) {
    return Invalid(absl::StrCat("loss_scaler.backoff_factor must be in (0, 1) as a float, got ",
                                Num(backoff)));
  }
  if (scaler.growth_interval() < 1 || scaler.growth_interval() > kMaxGrowthInterval) {
    return Invalid(absl::StrCat("loss_scaler.growth_interval must be in [1, ",
                                kMaxGrowthInterval, "], got ", scaler.growth_interval()));
  }
  return absl::OkStatus();
}

// Fields this build does not know (from a newer client, or in a hand-made message) would be
// kept, stored and copied into every rank's assignment while meaning nothing here: refused,
// in the spec and in every message inside it.
absl::Status RefuseUnknownFields(const google::protobuf::Message& message,
                                 const std::string& path) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = reflection->GetUnknownFields(message);
  if (unknown.field_count() > 0) {
    return Invalid(absl::StrCat(path, " has ", unknown.field_count(),
                                " field(s) this coordinator does not know (field number ",
                                unknown.field(0).number(),
                                "): is the client newer than the coordinator?"));
  }
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const google::protobuf::FieldDescriptor* field : fields) {
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (!field->is_repeated()) {
      RETURN_IF_ERROR(RefuseUnknownFields(reflection->GetMessage(message, field),
                                          absl::StrCat(path, ".", field->name())));
      continue;
    }
    for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
      RETURN_IF_ERROR(RefuseUnknownFields(reflection->GetRepeatedMessage(message, field, i),
                                          absl::StrCat(path, ".", field->name(), "[", i, "]")));
    }
  }
  return absl::OkStatus();
}

}  // namespace


absl::StatusOr<v1::JobSpec> ParseJobSpecJson(std::string_view json) {
  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  options.case_insensitive_enum_parsing = true;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &spec, options);
  if (!status.ok()) {
    return Invalid(absl::StrCat("job spec is not valid JSON for JobSpec: ",
                                std::string(status.message())));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path) {
  // A regular file of bounded size (a FIFO, a device or /dev/zero is refused, not read forever).
  ASSIGN_OR_RETURN(std::string json, ReadSmallFile("job spec file", path, kMaxSpecJsonBytes));
  auto spec = ParseJobSpecJson(json);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

void ApplyJobSpecDefaults(v1::JobSpec* spec) {
  // model.gpt leaves the MLP's fields unset (ValidateJobSpec checks that they are).
  const bool gpt = spec->model().has_gpt();
  if (!gpt && spec->model().activation() == v1::ACTIVATION_UNSPECIFIED) {
    spec->mutable_model()->set_activation(v1::RELU);
  }
  if (!gpt && spec->model().norm() == v1::NORM_KIND_UNSPECIFIED) {
    spec->mutable_model()->set_norm(v1::NONE);
  }
  if (spec->loss() == v1::LOSS_KIND_UNSPECIFIED) spec->set_loss(gpt ? v1::CROSS_ENTROPY : v1::MSE);
  if (spec->has_eval_tokens() && spec->eval_batches() == 0) {
    spec->set_eval_batches(kDefaultEvalBatches);
  }
  if (spec->has_sample() && spec->sample().temperature() == 0) {
    spec->mutable_sample()->set_temperature(1.0);
  }
  if (spec->precision() == v1::PRECISION_UNSPECIFIED) spec->set_precision(v1::FP16);
  if (spec->grad_comm_dtype() == v1::PRECISION_UNSPECIFIED) spec->set_grad_comm_dtype(v1::FP32);
  if (spec->telemetry_every() == 0) spec->set_telemetry_every(1);
  if (spec->accumulation_steps() == 0) spec->set_accumulation_steps(1);  // No accumulation.
  if (spec->progress_timeout_s() == 0) spec->set_progress_timeout_s(kDefaultProgressTimeoutS);
  if (spec->keep_checkpoints() == 0) spec->set_keep_checkpoints(kDefaultKeptCheckpoints);
  if (spec->collective_timeout_s() == 0) {
    spec->set_collective_timeout_s(kDefaultCollectiveTimeoutS);
  }
  auto* scaler = spec->mutable_loss_scaler();
  if (!scaler->has_enabled()) scaler->set_enabled(spec->precision() == v1::FP16);
  if (!scaler->has_init_scale()) scaler->set_init_scale(kDefaultInitScale);
  if (!scaler->has_growth_factor()) scaler->set_growth_factor(kDefaultGrowthFactor);
  if (!scaler->has_backoff_factor()) scaler->set_backoff_factor(kDefaultBackoffFactor);
  if (!scaler->has_growth_interval()) scaler->set_growth_interval(kDefaultGrowthInterval);
  if (spec->lr_schedule().kind() == v1::LR_SCHEDULE_KIND_UNSPECIFIED) {
    spec->mutable_lr_schedule()->set_kind(v1::CONSTANT);
  }
  // torch.optim.lr_scheduler.StepLR's default (0 is no valid gamma, so unset means it).
  if (spec->lr_schedule().kind() == v1::STEP && spec->lr_schedule().gamma() == 0) {
    spec->mutable_lr_schedule()->set_gamma(0.1);
  }
  if (spec->has_optimizer()) {
    v1::OptimizerSpec* optimizer = spec->mutable_optimizer();
    if (optimizer->kind() == v1::OPTIMIZER_KIND_UNSPECIFIED) optimizer->set_kind(v1::SGD);
    if (optimizer->kind() == v1::ADAM || optimizer->kind() == v1::ADAMW) {
      if (!optimizer->has_beta1()) optimizer->set_beta1(kDefaultAdamBeta1);
      if (!optimizer->has_beta2()) optimizer->set_beta2(kDefaultAdamBeta2);
      if (!optimizer->has_eps()) optimizer->set_eps(kDefaultAdamEps);
    }
  }
}

absl::Status ValidateLabels(const google::protobuf::Map<std::string, std::string>& labels,
                            const std::string& field) {
  constexpr size_t kMaxLabelBytes = 63;
  if (labels.size() > static_cast<size_t>(kMaxLabels)) {
    return Invalid(absl::StrCat(field, ": at most ", kMaxLabels, " labels, got ", labels.size()));
  }
  auto label_text = [](const std::string& text) {
    return std::all_of(text.begin(), text.end(), [](char c) {
      return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
             c == '-';
    });
  };
  for (const auto& [key, value] : labels) {
    if (key.empty() || key.size() > kMaxLabelBytes || !label_text(key) ||
        !absl::ascii_isalnum(static_cast<unsigned char>(key[0]))) {
      return Invalid(absl::StrCat(field, ": a key is 1 to ", kMaxLabelBytes,
                                  " of letters, digits, '.', '_' and '-', starting with a "
                                  "letter or digit"));
    }
    if (value.size() > kMaxLabelBytes || !label_text(value)) {
      return Invalid(absl::StrCat(field, "[", key, "]: a value is 0 to ", kMaxLabelBytes,
                                  " of letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  RETURN_IF_ERROR(RefuseUnknownFields(spec, "spec"));
  RETURN_IF_ERROR(ValidateLabels(spec.labels(), "labels"));
  // One character rule for the name and every path (common/path_rules.h); the echo is bounded
  // and escaped there.
  RETURN_IF_ERROR(CheckNameSyntax("name", spec.name()));
  for (const auto& [field, path] : SpecPathFields(spec)) {
    RETURN_IF_ERROR(CheckTextCharacters(field, *path));
  }
  if (spec.world_size() < 1 || spec.world_size() > kMaxWorldSize) {
    return Invalid(absl::StrCat("world_size must be in [1, ", kMaxWorldSize, "], got ",
                                spec.world_size()));
  }
  if (spec.device() != v1::CPU && spec.device() != v1::CUDA) {
    return Invalid(absl::StrCat("device must be cpu or cuda, got ",
                                v1::DeviceKind_Name(spec.device()).empty()
                                    ? std::to_string(spec.device())
                                    : v1::DeviceKind_Name(spec.device())));
  }
  if (!spec.has_model()) return Invalid("model is required");
  if (auto status = ValidateModel(spec.model()); !status.ok()) return status;
  if (spec.loss() != v1::MSE && spec.loss() != v1::CROSS_ENTROPY) {
    return Invalid(absl::StrCat("loss must be mse or cross_entropy, got ", spec.loss()));
  }
  RETURN_IF_ERROR(
      CheckFloat32("label_smoothing", spec.label_smoothing(), Range(0, false, 1, false)));
  if (spec.label_smoothing() != 0 && spec.loss() != v1::CROSS_ENTROPY) {
    return Invalid("label_smoothing applies to loss cross_entropy only");
  }
  if (auto status = ValidateData(spec.data()); !status.ok()) return status;
  const bool gpt = spec.model().has_gpt();
  if (gpt && spec.loss() != v1::CROSS_ENTROPY) {
    return Invalid(absl::StrCat("model.gpt trains with loss cross_entropy (its default), got ",
                                v1::LossKind_Name(spec.loss())));
  }
  if (gpt != spec.data().has_tokens()) {
    return Invalid(gpt ? "model.gpt needs data.tokens (token files)"
                       : "data.tokens is for model.gpt (a language model)");
  }
  if (spec.has_eval_tokens()) {
    if (!gpt) return Invalid("eval_tokens is for model.gpt (a language model)");
    RETURN_IF_ERROR(ValidateTokenData(spec.eval_tokens(), "eval_tokens"));
    if (spec.eval_tokens().shuffle()) {
      return Invalid("eval_tokens.shuffle must be off: every evaluation reads the same batches");
    }
    if (spec.eval_batches() < 1 || spec.eval_batches() > kMaxEvalBatches) {
      return Invalid(absl::StrCat("eval_batches must be in [1, ", kMaxEvalBatches, "] (default ",
                                  kDefaultEvalBatches, "), got ", spec.eval_batches()));
    }
  } else if (spec.eval_batches() != 0) {
    return Invalid("eval_batches needs eval_tokens");
  }
  if (gpt && spec.has_eval_data()) {
    return Invalid("model.gpt evaluates on eval_tokens, not eval_data");
  }
  if (spec.has_sample()) {
    if (!gpt) return Invalid("sample is for model.gpt (a language model)");
    RETURN_IF_ERROR(ValidateSample(spec.sample(), spec.model().gpt()));
  }
  if (spec.has_eval_data()) {
    if (spec.eval_data().features_path().empty() || spec.eval_data().targets_path().empty()) {
      return Invalid("eval_data.features_path and eval_data.targets_path must name .npy files");
    }
    if (spec.eval_data().shuffle() || spec.eval_data().shuffle_seed() != 0) {
      return Invalid("eval_data.shuffle must be off: evaluation visits every row once");
    }
  }
  if (spec.eval_every() < 0 || spec.eval_every() > kMaxSteps) {
    return Invalid(absl::StrCat("eval_every must be in [0, ", kMaxSteps, "], got ",
                                spec.eval_every()));
  }
  if (spec.eval_every() > 0 && !spec.has_eval_data() && !spec.has_eval_tokens()) {
    return Invalid("eval_every needs eval_data (or eval_tokens for model.gpt)");
  }
  if (spec.micro_batch_size() < 1 || spec.micro_batch_size() > kMaxMicroBatch) {
    return Invalid(absl::StrCat("micro_batch_size must be in [1, ", kMaxMicroBatch, "], got ",
                                spec.micro_batch_size()));
  }
  // As torch: "Expected more than 1 value per channel when training".
  if (spec.model().norm() == v1::BATCH_NORM && spec.micro_batch_size() < 2) {
    return Invalid(absl::StrCat("model.norm batch_norm needs micro_batch_size >= 2 (batch "
                                "statistics of one row are undefined), got ",
                                spec.micro_batch_size()));
  }
  if (spec.model().norm() == v1::SYNC_BATCH_NORM &&
      spec.micro_batch_size() * spec.world_size() < 2) {
    return Invalid(absl::StrCat("model.norm sync_batch_norm needs micro_batch_size * world_size "
                                ">= 2 (batch statistics of one row are undefined), got ",
                                spec.micro_batch_size(), " * ", spec.world_size()));
  }
  if (gpt && spec.micro_batch_size() >
                 kMaxGptTokensPerMicroBatch / spec.model().gpt().context_length()) {
    return Invalid(absl::StrCat("micro_batch_size * model.gpt.context_length must be at most ",
                                kMaxGptTokensPerMicroBatch, " tokens, got ",
                                spec.micro_batch_size(), " * ",
                                spec.model().gpt().context_length()));
  }
  if (spec.accumulation_steps() < 1 || spec.accumulation_steps() > kMaxAccumulationSteps) {
    return Invalid(absl::StrCat("accumulation_steps must be in [1, ", kMaxAccumulationSteps,
                                "], got ", spec.accumulation_steps()));
  }
  if (spec.steps() < 1 || spec.steps() > kMaxSteps) {
    return Invalid(absl::StrCat("steps must be in [1, ", kMaxSteps, "], got ", spec.steps()));
  }
  if (spec.precision() != v1::FP16 && spec.precision() != v1::BF16 &&
      spec.precision() != v1::FP32) {
    return Invalid(absl::StrCat("precision must be fp16, bf16 or fp32, got ", spec.precision()));
  }
  if (gpt && spec.device() == v1::CUDA) RETURN_IF_ERROR(ValidateGptOnCuda(spec));
  if (spec.grad_comm_dtype() != v1::PRECISION_UNSPECIFIED && spec.grad_comm_dtype() != v1::FP32 &&
      spec.grad_comm_dtype() != v1::FP16 && spec.grad_comm_dtype() != v1::BF16) {
    return Invalid(absl::StrCat("grad_comm_dtype must be fp32, fp16 or bf16, got ",
                                spec.grad_comm_dtype()));
  }
  if (spec.grad_comm_lanes() > kMaxGradCommLanes) {
    return Invalid(absl::StrCat("grad_comm_lanes must be in [0, ", kMaxGradCommLanes, "], got ",
                                spec.grad_comm_lanes()));
  }
  if (!spec.has_optimizer()) return Invalid("optimizer is required (optimizer.lr at least)");
  if (auto status = ValidateOptimizer(spec.optimizer()); !status.ok()) return status;
  if (auto status = ValidateLrSchedule(spec.lr_schedule(), spec); !status.ok()) return status;
  if (auto status = ValidateLossScaler(spec.loss_scaler()); !status.ok()) return status;
  RETURN_IF_ERROR(CheckFloat32("max_grad_norm (0 = no clipping)", spec.max_grad_norm(),
                               Range(0, false, kFloatMax, false)));
  if (spec.seed() < 0) return Invalid(absl::StrCat("seed must be >= 0, got ", spec.seed()));
  if (spec.telemetry_every() < 1) {
    return Invalid(absl::StrCat("telemetry_every must be >= 1, got ", spec.telemetry_every()));
  }
  if (!std::isfinite(spec.progress_timeout_s()) || spec.progress_timeout_s() < kMinTimeoutS ||
      spec.progress_timeout_s() > kMaxProgressTimeoutS) {
    return Invalid(absl::StrCat("progress_timeout_s must be in [", Num(kMinTimeoutS), ", ",
                                Num(kMaxProgressTimeoutS), "] seconds (default ",
                                Num(kDefaultProgressTimeoutS), "), got ",
                                Num(spec.progress_timeout_s())));
  }
  if (!std::isfinite(spec.collective_timeout_s()) ||
      spec.collective_timeout_s() < kMinTimeoutS ||
      spec.collective_timeout_s() > kMaxCollectiveTimeoutS) {
    return Invalid(absl::StrCat("collective_timeout_s must be in [", Num(kMinTimeoutS), ", ",
                                Num(kMaxCollectiveTimeoutS), "] seconds (default ",
                                Num(kDefaultCollectiveTimeoutS), "), got ",
                                Num(spec.collective_timeout_s())));
  }
  if (spec.checkpoint_every() < 0) {
    return Invalid(absl::StrCat("checkpoint_every must be >= 0 (0 = no checkpoints), got ",
                                spec.checkpoint_every()));
  }
  if (spec.checkpoint_every() > 0 && spec.checkpoint_dir().empty()) {
    return Invalid("checkpoint_dir must be set when checkpoint_every > 0");
  }
  if (spec.keep_checkpoints() != 0 && spec.keep_checkpoints() != -1 &&
      (spec.keep_checkpoints() < 1 || spec.keep_checkpoints() > kMaxKeptCheckpoints)) {
    return Invalid(absl::StrCat("keep_checkpoints must be -1 (keep every one), 0 (the default, ",
                                kDefaultKeptCheckpoints, ") or in [1, ", kMaxKeptCheckpoints,
                                "], got ", spec.keep_checkpoints()));
  }
  if (!std::isfinite(spec.queue_timeout_s()) || spec.queue_timeout_s() < 0 ||
      spec.queue_timeout_s() > kMaxQueueTimeoutS) {
    return Invalid(absl::StrCat("queue_timeout_s must be in [0, ", Num(kMaxQueueTimeoutS),
                                "] (0 = no limit), got ", Num(spec.queue_timeout_s())));
  }
  if (spec.max_restarts() < 0 || spec.max_restarts() > kMaxRestarts) {
    return Invalid(absl::StrCat("max_restarts must be in [0, ", kMaxRestarts, "], got ",
                                spec.max_restarts()));
  }
  if (gpt && !kGptModelTrainable) {
    return absl::UnimplementedError(
        "model.gpt is valid but this build does not train it yet (issue #28)");
  }
  return absl::OkStatus();
}

std::vector<SpecPath> SpecPaths(const v1::JobSpec& spec) {
  std::vector<SpecPath> paths;
  if (spec.data().has_npy()) {
    paths.push_back({"data.npy.features_path", spec.data().npy().features_path(), false});
    paths.push_back({"data.npy.targets_path", spec.data().npy().targets_path(), false});
  }
  if (spec.has_eval_data()) {
    paths.push_back({"eval_data.features_path", spec.eval_data().features_path(), false});
    paths.push_back({"eval_data.targets_path", spec.eval_data().targets_path(), false});
  }
  // Token files, patterns included: a pattern's wildcards lie in its last component
  // (common/token_file_pattern.h), so the lexical check against the data roots holds for
  // every file it can match.
  for (const auto& [field, tokens] :
       {std::pair<const char*, const v1::TokenData*>{"data.tokens.files", &spec.data().tokens()},
        {"eval_tokens.files", &spec.eval_tokens()}}) {
    for (int i = 0; i < tokens->files_size(); ++i) {
      paths.push_back({absl::StrCat(field, "[", i, "]"), tokens->files(i), false});
    }
  }
  if (!spec.init_checkpoint().empty()) {
    paths.push_back({"init_checkpoint", spec.init_checkpoint(), false});
  }
  if (!spec.output_checkpoint().empty()) {
    paths.push_back({"output_checkpoint", spec.output_checkpoint(), true});
  }
  if (!spec.checkpoint_dir().empty()) {
    paths.push_back({"checkpoint_dir", spec.checkpoint_dir(), true});
  }
  return paths;
}

std::vector<int64_t> LayerWidths(const v1::ModelSpec& model) {
  std::vector<int64_t> widths;
  widths.push_back(model.input_dim());
  for (int64_t hidden : model.hidden_dims()) widths.push_back(hidden);
  widths.push_back(model.output_dim());
  return widths;
}

int64_t ParameterCount(const v1::ModelSpec& model) {
  std::vector<int64_t> widths = LayerWidths(model);
  int64_t count = 0;
  for (size_t i = 0; i + 1 < widths.size(); ++i) count += widths[i] * widths[i + 1] + widths[i + 1];
  return count;
}

bool LossScalingEnabled(const v1::JobSpec& spec) {
  return spec.loss_scaler().has_enabled() ? spec.loss_scaler().enabled()
                                          : spec.precision() == v1::FP16;
}

}  // namespace mptrain
