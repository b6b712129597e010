#include "common/job_spec.h"

#include <cmath>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

// A valid spec in JSON; each test breaks one rule of it.
constexpr char kValidJson[] = R"({
  "name": "t", "world_size": 2, "device": "cpu",
  "model": {"input_dim": 8, "hidden_dims": [4, 4], "output_dim": 2, "activation": "gelu"},
  "data": {"synthetic": {"seed": 1}},
  "micro_batch_size": 4, "accumulation_steps": 2, "steps": 3, "precision": "bf16",
  "optimizer": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}
})";

v1::JobSpec ValidSpec() {
  auto spec = ParseJobSpecJson(kValidJson);
  EXPECT_TRUE(spec.ok()) << spec.status();
  ApplyJobSpecDefaults(&*spec);
  return *spec;
}

void ExpectInvalid(const v1::JobSpec& spec, const std::string& message) {
  absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(message), std::string::npos)
      << "got: " << status.message() << "\nwanted: " << message;
}

TEST(ParseJobSpecJson, ValidSpec_ParsesEnumsCaseInsensitively) {
  v1::JobSpec spec = ValidSpec();
  EXPECT_EQ(spec.device(), v1::CPU);
  EXPECT_EQ(spec.precision(), v1::BF16);
  EXPECT_EQ(spec.model().activation(), v1::GELU);
  ASSERT_EQ(spec.model().hidden_dims_size(), 2);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ParseJobSpecJson, UnknownField_IsRefused) {
  auto spec = ParseJobSpecJson(R"({"name": "x", "wolrd_size": 2})");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(spec.status().message()).find("wolrd_size"), std::string::npos)
      << spec.status();
}

TEST(ParseJobSpecJson, MalformedJson_IsRefused) {
  auto spec = ParseJobSpecJson("{\"name\": ");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseJobSpecJson, UnknownEnumValue_IsRefused) {
  auto spec = ParseJobSpecJson(R"({"device": "tpu"})");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadJobSpecFile, MissingFile_IsNotFoundNamingIt) {
  auto spec = LoadJobSpecFile("/nonexistent/job.json");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(spec.status().message()).find("/nonexistent/job.json"),
            std::string::npos);
}

// ReadSmallFile (job specs, token files) says the limit, not the size of a file the caller
// may not be able to read.
TEST(LoadJobSpecFile, TooLarge_IsInvalidWithoutItsSize) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/large.json";
  std::ofstream(path) << std::string(1'777'777, ' ');
  auto spec = LoadJobSpecFile(path);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(spec.status().message());
  EXPECT_NE(message.find(": larger than the limit of "), std::string::npos) << message;
  EXPECT_EQ(message.find("1777777"), std::string::npos) << message;
}

TEST(ApplyJobSpecDefaults, FillsPyTorchScalerDefaults) {
  v1::JobSpec spec;
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.precision(), v1::FP16);
  EXPECT_EQ(spec.loss(), v1::MSE);
  EXPECT_EQ(spec.model().activation(), v1::RELU);
  EXPECT_EQ(spec.telemetry_every(), 1);
  EXPECT_TRUE(spec.loss_scaler().enabled());
  EXPECT_EQ(spec.loss_scaler().init_scale(), 65536.0);
  EXPECT_EQ(spec.loss_scaler().growth_factor(), 2.0);
  EXPECT_EQ(spec.loss_scaler().backoff_factor(), 0.5);
  EXPECT_EQ(spec.loss_scaler().growth_interval(), 2000);
}

TEST(ApplyJobSpecDefaults, ScalerOffByDefaultForBf16_AndExplicitValuesKept) {
  v1::JobSpec spec;
  spec.set_precision(v1::BF16);
  spec.mutable_loss_scaler()->set_init_scale(1024);
  ApplyJobSpecDefaults(&spec);
  EXPECT_FALSE(spec.loss_scaler().enabled());
  EXPECT_EQ(spec.loss_scaler().init_scale(), 1024);
}

TEST(ValidateJobSpec, DigitsExample_IsValid) {
  auto spec = LoadJobSpecFile("examples/digits.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ApplyJobSpecDefaults(&*spec);
  EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << ValidateJobSpec(*spec);
  EXPECT_EQ(spec->loss(), v1::CROSS_ENTROPY);
  EXPECT_EQ(spec->optimizer().kind(), v1::ADAMW);
  EXPECT_EQ(spec->lr_schedule().kind(), v1::WARMUP_COSINE);
  EXPECT_TRUE(spec->data().npy().shuffle());
  EXPECT_TRUE(spec->has_eval_data());
}

TEST(LoadJobSpecFile, DevicesAndHugeFiles_AreRefusedNotRead) {
  auto device = LoadJobSpecFile("/dev/zero");
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find("not a regular file"), std::string::npos)
      << device.status();
  const std::string path = ::testing::TempDir() + "/huge_spec.json";
  {
    std::ofstream huge(path);
    huge << "{\"name\": \"" << std::string(kMaxSpecJsonBytes, 'x') << "\"}";
  }
  auto big = LoadJobSpecFile(path);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("larger than the limit of"), std::string::npos)
      << big.status();
}

TEST(ValidateJobSpec, SeedExamples_AreValid) {
  for (const char* path : {"examples/seed.json", "examples/seed_cpu.json"}) {
    auto spec = LoadJobSpecFile(path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    ApplyJobSpecDefaults(&*spec);
    EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << path << ": " << ValidateJobSpec(*spec);
    EXPECT_EQ(spec->model().input_dim(), 1024);
    EXPECT_EQ(spec->model().output_dim(), 16);
    EXPECT_EQ(spec->micro_batch_size(), 64);
    EXPECT_EQ(spec->accumulation_steps(), 4);
    EXPECT_EQ(spec->steps(), 5);
    EXPECT_EQ(spec->world_size(), 2);
  }
}

TEST(ValidateJobSpec, Name_MustBeSimple) {
  v1::JobSpec spec = ValidSpec();
  spec.set_name("a b");
  ExpectInvalid(spec, "name must be");
}

TEST(ValidateJobSpec, Labels_AreBoundedInNumberLengthAndCharacters_NeverEchoed) {
  v1::JobSpec spec = ValidSpec();
  (*spec.mutable_labels())["team"] = "vision";
  (*spec.mutable_labels())["run.id"] = "";
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  for (int i = 0; i < kMaxLabels; ++i) (*spec.mutable_labels())[absl::StrCat("k", i)] = "v";
  ExpectInvalid(spec, "labels: at most 16 labels, got 18");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"SECRET key", "v"}, {"", "v"}, {"-SECRET", "v"}, {std::string(64, 'k'), "v"},
      {"k", "SECRET\nvalue"}, {"k", std::string(64, 'v')}};
  for (const auto& [key, value] : bad) {
    v1::JobSpec labelled = ValidSpec();
    (*labelled.mutable_labels())[key] = value;
    const absl::Status status = ValidateJobSpec(labelled);
    ASSERT_FALSE(status.ok()) << key;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("labels"), std::string::npos) << status;
    EXPECT_EQ(status.message().find("SECRET"), std::string::npos) << status;
  }
}

// The issue's names: none may read as an option or a directory; no name is fine.
TEST(ValidateJobSpec, Name_OptionOrDirectoryLookalike_IsRefused) {
  for (const char* name : {"-rf", ".", "..", "a\nb", "a\xe2\x80\xae" "b"}) {
    v1::JobSpec spec = ValidSpec();
    spec.set_name(name);
    ExpectInvalid(spec, "name must");
  }
  v1::JobSpec spec = ValidSpec();
  spec.set_name("");
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << "the name is optional";
}

// The file the issue's tester created: "ü\nx\u202e.safetensors".
TEST(ValidateJobSpec, PathWithNewlineOrBidiOverride_IsRefusedNamingTheField) {
  v1::JobSpec spec = ValidSpec();
  spec.set_output_checkpoint("/out/\xc3\xbc\nx\xe2\x80\xae.safetensors");
  ExpectInvalid(spec, "output_checkpoint must not contain U+000A (a control character)");
  spec.set_output_checkpoint("/out/x\xe2\x80\xae.safetensors");
  ExpectInvalid(spec, "output_checkpoint must not contain U+202E");
  spec.set_output_checkpoint("/out/\xff.safetensors");
  ExpectInvalid(spec, "output_checkpoint must be valid UTF-8");
  spec.set_output_checkpoint("/out/\xc3\xbc.safetensors");
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << "printable Unicode is fine";

  v1::JobSpec npy = ValidSpec();
  npy.mutable_data()->mutable_npy()->set_features_path("/data/x\xe2\x81\xa6.npy");
  npy.mutable_data()->mutable_npy()->set_targets_path("/data/y.npy");
  ExpectInvalid(npy, "data.npy.features_path must not contain U+2066");
  v1::JobSpec dir = ValidSpec();
  dir.set_checkpoint_dir("/ckpt\r");
  ExpectInvalid(dir, "checkpoint_dir must not contain U+000D");
}

// The issue's values: each passes a check in double and is infinite, zero or out of range as
// the float32 the ranks use.
TEST(ValidateJobSpec, Floats_MustBeFiniteAndInRangeAsFloat32) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_optimizer()->set_lr(3.5e38);
  ExpectInvalid(spec, "optimizer.lr must be in (0, 3.4028235e+38], got 3.5e+38 (infinite as a "
                      "float32)");
  spec.mutable_optimizer()->set_lr(1e-50);
  ExpectInvalid(spec, "optimizer.lr must be in (0, 3.4028235e+38], got 1e-50 (0 as a float32)");
  spec = ValidSpec();
  spec.mutable_optimizer()->set_weight_decay(1e308);
  ExpectInvalid(spec, "optimizer.weight_decay must be in [0, 3.4028235e+38], got 1e+308");
  spec = ValidSpec();
  spec.mutable_optimizer()->set_momentum(0.99999999999);
  ExpectInvalid(spec, "optimizer.momentum must be in [0, 1), got 0.99999999999 (1 as a float32)");
  spec = ValidSpec();
  spec.set_max_grad_norm(1e39);
  ExpectInvalid(spec, "max_grad_norm (0 = no clipping) must be in [0, 3.4028235e+38]");
  // Inside the range as given and as a float (0), but 0 means no clipping: refused.
  spec = ValidSpec();
  spec.set_max_grad_norm(1e-46);
  ExpectInvalid(spec, "max_grad_norm (0 = no clipping) must be in [0, 3.4028235e+38] and not "
                      "round to 0 as a float32, got 1e-46 (0 as a float32)");
  spec = ValidSpec();
  spec.mutable_optimizer()->set_weight_decay(1e-50);
  ExpectInvalid(spec, "optimizer.weight_decay must be in [0, 3.4028235e+38] and not round to 0");
  spec = ValidSpec();
  spec.set_max_grad_norm(1e-40);  // A float32 subnormal, not 0: kept.
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);

  v1::JobSpec adam = ValidSpec();
  adam.mutable_optimizer()->set_kind(v1::ADAM);
  adam.mutable_optimizer()->set_momentum(0);
  ApplyJobSpecDefaults(&adam);
  ASSERT_TRUE(ValidateJobSpec(adam).ok()) << ValidateJobSpec(adam);
  adam.mutable_optimizer()->set_eps(0);
  ExpectInvalid(adam, "optimizer.eps must be in (0, 1], got 0");
  adam.mutable_optimizer()->set_eps(1e-50);
  ExpectInvalid(adam, "optimizer.eps must be in (0, 1], got 1e-50 (0 as a float32)");
  adam.mutable_optimizer()->set_eps(1e-8);
  adam.mutable_optimizer()->set_beta2(0.9999999999);
  ExpectInvalid(adam, "optimizer.beta2 must be in [0, 1), got 0.9999999999 (1 as a float32)");
}

TEST(ValidateJobSpec, WorldSize_MustBePositive) {
  v1::JobSpec spec = ValidSpec();
  spec.set_world_size(0);
  ExpectInvalid(spec, "world_size must be in [1, 1024], got 0");
}

TEST(ValidateJobSpec, Device_MustBeSet) {
  v1::JobSpec spec = ValidSpec();
  spec.set_device(v1::DEVICE_KIND_UNSPECIFIED);
  ExpectInvalid(spec, "device must be cpu or cuda");
}

TEST(ValidateJobSpec, Model_IsRequired) {
  v1::JobSpec spec = ValidSpec();
  spec.clear_model();
  ExpectInvalid(spec, "model is required");
}

TEST(ValidateJobSpec, InputDim_MustBePositive) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_model()->set_input_dim(-3);
  ExpectInvalid(spec, "model.input_dim must be in [1, 1048576], got -3");
}

TEST(ValidateJobSpec, HiddenDim_MustBePositive_NamingIndex) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_model()->set_hidden_dims(1, 0);
  ExpectInvalid(spec, "model.hidden_dims[1] must be > 0, got 0");
}

TEST(ValidateJobSpec, HiddenDim_MustNotBeHuge) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_model()->set_hidden_dims(0, int64_t{1} << 40);
  ExpectInvalid(spec, "model.hidden_dims[0] must be <= 1048576");
}

TEST(ValidateJobSpec, OutputDim_MustBePositive) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_model()->set_output_dim(0);
  ExpectInvalid(spec, "model.output_dim must be in [1, 1048576], got 0");
}

TEST(ParseJobSpecJson, Norm_ParsesAndDefaultsToNone) {
  EXPECT_EQ(ValidSpec().model().norm(), v1::NONE);
  for (const auto& [text, kind] : std::vector<std::pair<std::string, v1::NormKind>>{
           {"none", v1::NONE},
           {"layer_norm", v1::LAYER_NORM},
           {"BATCH_NORM", v1::BATCH_NORM},
           {"sync_batch_norm", v1::SYNC_BATCH_NORM}}) {
    auto spec = ParseJobSpecJson(R"({"model": {"input_dim": 2, "output_dim": 1, "norm": ")" +
                                 text + R"("}})");
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_EQ(spec->model().norm(), kind) << text;
  }
  EXPECT_FALSE(ParseJobSpecJson(R"({"model": {"norm": "group_norm"}})").ok());
}

TEST(ValidateJobSpec, Norm_MustBeKnown) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_model()->set_norm(static_cast<v1::NormKind>(9));
  ExpectInvalid(spec, "model.norm must be none, layer_norm, batch_norm or sync_batch_norm");
}

TEST(ValidateJobSpec, Norm_EveryKindIsValid) {
  for (v1::NormKind kind : {v1::NONE, v1::LAYER_NORM, v1::BATCH_NORM, v1::SYNC_BATCH_NORM}) {
    v1::JobSpec spec = ValidSpec();
    spec.mutable_model()->set_norm(kind);
    EXPECT_TRUE(ValidateJobSpec(spec).ok()) << kind << ": " << ValidateJobSpec(spec);
  }
}

TEST(ValidateJobSpec, BatchNorm_NeedsTwoRowsPerMicroBatch) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_model()->set_norm(v1::BATCH_NORM);
  spec.set_micro_batch_size(1);
  ExpectInvalid(spec, "model.norm batch_norm needs micro_batch_size >= 2");
  // Layer norm normalises each row by itself: one row is fine.
  spec.mutable_model()->set_norm(v1::LAYER_NORM);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ValidateJobSpec, SyncBatchNorm_NeedsTwoRowsOverAllRanks) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_model()->set_norm(v1::SYNC_BATCH_NORM);
  spec.set_micro_batch_size(1);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);  // 1 row on each of 2 ranks
  spec.set_world_size(1);
  ExpectInvalid(spec, "model.norm sync_batch_norm needs micro_batch_size * world_size >= 2");
}

TEST(ValidateJobSpec, Activation_MustBeKnown) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_model()->set_activation(static_cast<v1::Activation>(9));
  ExpectInvalid(spec, "model.activation must be relu or gelu");
}

TEST(ValidateJobSpec, Data_MustBeSet) {
  v1::JobSpec spec = ValidSpec();
  spec.clear_data();
  ExpectInvalid(spec, "data must set exactly one of");
}

TEST(ValidateJobSpec, NpyPaths_MustBeGiven) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_data()->mutable_npy()->set_features_path("x.npy");
  ExpectInvalid(spec, "data.npy.targets_path must name a .npy file");
  spec.mutable_data()->mutable_npy()->set_features_path("");
  ExpectInvalid(spec, "data.npy.features_path must name a .npy file");
}

TEST(ValidateJobSpec, SyntheticSeed_MustBeNonNegative) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_data()->mutable_synthetic()->set_seed(-1);
  ExpectInvalid(spec, "data.synthetic.seed must be >= 0, got -1");
}

TEST(ValidateJobSpec, MicroBatch_MustBePositive) {
  v1::JobSpec spec = ValidSpec();
  spec.set_micro_batch_size(0);
  ExpectInvalid(spec, "micro_batch_size must be in [1, 16777216], got 0");
}

TEST(ValidateJobSpec, AccumulationSteps_MustBeInRange) {
  v1::JobSpec spec = ValidSpec();
  spec.set_accumulation_steps(0);
  ExpectInvalid(spec, "accumulation_steps must be in [1, 65536], got 0");
  spec.set_accumulation_steps(65537);
  ExpectInvalid(spec, "accumulation_steps must be in [1, 65536], got 65537");
  spec.clear_accumulation_steps();  // Unset: no accumulation (it was refused as 0).
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.accumulation_steps(), 1);
}

TEST(ValidateJobSpec, Steps_MustBeInRange) {
  v1::JobSpec spec = ValidSpec();
  spec.set_steps(-5);
  ExpectInvalid(spec, "steps must be in [1, 1000000000], got -5");
  spec.set_steps(int64_t{1} << 40);
  ExpectInvalid(spec, "steps must be in [1, 1000000000], got 1099511627776");
}

TEST(ValidateJobSpec, QueueTimeout_MustBeFiniteAndNonNegative) {
  v1::JobSpec spec = ValidSpec();
  spec.set_queue_timeout_s(-1);
  ExpectInvalid(spec, "queue_timeout_s must be in [0, 2592000] (0 = no limit), got -1");
  // The value as given, not rounded to the limit it broke ("got 2.592e+06").
  spec.set_queue_timeout_s(30 * 86400 + 1);
  ExpectInvalid(spec, "queue_timeout_s must be in [0, 2592000] (0 = no limit), got 2592001");
  spec.set_queue_timeout_s(30 * 86400 + 0.25);
  ExpectInvalid(spec, "got 2592000.25");
  spec.set_queue_timeout_s(std::nan(""));
  ExpectInvalid(spec, "queue_timeout_s must be in");
}

TEST(ValidateJobSpec, Precision_MustBeKnown) {
  v1::JobSpec spec = ValidSpec();
  spec.set_precision(static_cast<v1::Precision>(7));
  ExpectInvalid(spec, "precision must be fp16, bf16 or fp32");
}

TEST(ValidateJobSpec, GradCommDtype_MustBeKnown_AndDefaultsToFp32) {
  v1::JobSpec spec = ValidSpec();
  spec.set_grad_comm_dtype(static_cast<v1::Precision>(9));
  ExpectInvalid(spec, "grad_comm_dtype must be fp32, fp16 or bf16, got 9");
  v1::JobSpec defaulted;
  ApplyJobSpecDefaults(&defaulted);
  EXPECT_EQ(defaulted.grad_comm_dtype(), v1::FP32) << "not the autocast dtype's FP16 default";
  spec.set_grad_comm_dtype(v1::BF16);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

TEST(ValidateJobSpec, GradCommLanes_AtMostEight_ZeroLeftToTheRendezvous) {
  v1::JobSpec spec = ValidSpec();
  spec.set_grad_comm_lanes(9);
  ExpectInvalid(spec, "grad_comm_lanes must be in [0, 8], got 9");
  spec.set_grad_comm_lanes(8);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  v1::JobSpec defaulted;
  ApplyJobSpecDefaults(&defaulted);
  EXPECT_EQ(defaulted.grad_comm_lanes(), 0u) << "0 means: rank 0 decides from where ranks run";
}

TEST(ValidateJobSpec, Optimizer_IsRequired) {
  v1::JobSpec spec = ValidSpec();
  spec.clear_optimizer();
  ExpectInvalid(spec, "optimizer is required");
}

TEST(ValidateJobSpec, LearningRate_MustBePositive) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_optimizer()->set_lr(0);
  ExpectInvalid(spec, "optimizer.lr must be in (0, 3.4028235e+38], got 0");
}

TEST(ValidateJobSpec, Momentum_MustBeBelowOne) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_optimizer()->set_momentum(1.0);
  ExpectInvalid(spec, "optimizer.momentum must be in [0, 1), got 1");
}

// A field this build does not know (a newer client, or a hand-made binary message) would be
// stored and copied into every rank's assignment: refused, naming where it is.
TEST(ValidateJobSpec, UnknownFields_AreRefusedAnywhere) {
  v1::JobSpec spec = ValidSpec();
  spec.GetReflection()->MutableUnknownFields(&spec)->AddLengthDelimited(999, std::string(100, 'x'));
  ExpectInvalid(spec, "spec has 1 field(s) this coordinator does not know (field number 999)");
  spec = ValidSpec();
  v1::ModelSpec* model = spec.mutable_model();
  model->GetReflection()->MutableUnknownFields(model)->AddVarint(77, 1);
  ExpectInvalid(spec, "spec.model has 1 field(s) this coordinator does not know (field "
                      "number 77)");
}

TEST(ValidateJobSpec, WeightDecay_MustBeNonNegative) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_optimizer()->set_weight_decay(-0.1);
  ExpectInvalid(spec, "optimizer.weight_decay must be in [0, 3.4028235e+38], got -0.1");
}

TEST(ValidateJobSpec, InitScale_MustBeAPositiveFiniteFloat) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_loss_scaler()->set_init_scale(0);
  ExpectInvalid(spec, "loss_scaler.init_scale must be a number in [1.1754944e-38, 3.4028235e+38] "
                      "(the scale is a float), got 0");
  // Finite as a double, infinite or zero as the float the ranks keep it in.
  spec.mutable_loss_scaler()->set_init_scale(1e39);
  ExpectInvalid(spec, "loss_scaler.init_scale must be a number in [1.1754944e-38, 3.4028235e+38]");
  spec.mutable_loss_scaler()->set_init_scale(1e-39);
  ExpectInvalid(spec, "got 1e-39");
  spec.mutable_loss_scaler()->set_init_scale(3e38);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ValidateJobSpec, GrowthFactor_MustExceedOneAsAFloat) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_loss_scaler()->set_growth_factor(1.0);
  ExpectInvalid(spec, "loss_scaler.growth_factor must be > 1 as a float and at most "
                      "3.4028235e+38, got 1");
  spec.mutable_loss_scaler()->set_growth_factor(1.00000001);  // 1.0f: the scale would never grow.
  ExpectInvalid(spec, "loss_scaler.growth_factor must be > 1 as a float");
  spec.mutable_loss_scaler()->set_growth_factor(1e39);
  ExpectInvalid(spec, "loss_scaler.growth_factor must be > 1 as a float and at most");
}

TEST(ValidateJobSpec, BackoffFactor_MustBeInUnitIntervalAsAFloat) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_loss_scaler()->set_backoff_factor(1.5);
  ExpectInvalid(spec, "loss_scaler.backoff_factor must be in (0, 1) as a float, got 1.5");
  spec.mutable_loss_scaler()->set_backoff_factor(0.99999999);  // 1.0f
  ExpectInvalid(spec, "loss_scaler.backoff_factor must be in (0, 1) as a float");
  spec.mutable_loss_scaler()->set_backoff_factor(1e-50);  // 0.0f
  ExpectInvalid(spec, "loss_scaler.backoff_factor must be in (0, 1) as a float");
}

TEST(ValidateJobSpec, GrowthInterval_MustBePositiveAndBounded) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_loss_scaler()->set_growth_interval(0);
  ExpectInvalid(spec, "loss_scaler.growth_interval must be in [1, 1000000000], got 0");
  spec.mutable_loss_scaler()->set_growth_interval(int64_t{1} << 32);
  ExpectInvalid(spec, "loss_scaler.growth_interval must be in [1, 1000000000], got 4294967296");
}

TEST(ValidateJobSpec, CrossEntropy_IsALoss_WithLabelSmoothingInUnitInterval) {
  v1::JobSpec spec = ValidSpec();
  spec.set_loss(v1::CROSS_ENTROPY);
  spec.set_label_smoothing(0.1);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.set_label_smoothing(1.5);
  ExpectInvalid(spec, "label_smoothing must be in [0, 1], got 1.5");
  spec.set_label_smoothing(std::nan(""));
  ExpectInvalid(spec, "label_smoothing must be in [0, 1], got nan");
}

TEST(ValidateJobSpec, LabelSmoothing_NeedsCrossEntropy) {
  v1::JobSpec spec = ValidSpec();
  spec.set_label_smoothing(0.1);
  ExpectInvalid(spec, "label_smoothing applies to loss cross_entropy only");
}

TEST(ApplyJobSpecDefaults, AdamGetsTorchBetasAndEps_SgdNone) {
  v1::JobSpec spec = ValidSpec();
  EXPECT_EQ(spec.optimizer().kind(), v1::SGD);
  EXPECT_FALSE(spec.optimizer().has_beta1());
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_optimizer()->set_momentum(0);
  spec.mutable_optimizer()->set_beta2(0.95);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.optimizer().beta1(), 0.9);
  EXPECT_EQ(spec.optimizer().beta2(), 0.95);
  EXPECT_EQ(spec.optimizer().eps(), 1e-8);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ValidateJobSpec, Optimizer_FieldsOfTheOtherKind_AreRefused) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_optimizer()->set_beta1(0.5);
  ExpectInvalid(spec, "optimizer.beta1, beta2 and eps apply to adam and adamw only");
  spec = ValidSpec();
  spec.mutable_optimizer()->set_momentum(0);
  spec.mutable_optimizer()->set_nesterov(true);
  ExpectInvalid(spec, "optimizer.nesterov needs optimizer.momentum > 0");
  spec = ValidSpec();
  spec.mutable_optimizer()->set_kind(v1::ADAM);
  ApplyJobSpecDefaults(&spec);
  ExpectInvalid(spec, "optimizer.momentum and nesterov apply to sgd only");
}

TEST(ValidateJobSpec, AdamBetasAndEps_AreBounded) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_optimizer()->set_kind(v1::ADAM);
  spec.mutable_optimizer()->set_momentum(0);
  spec.mutable_optimizer()->set_beta1(1.0);
  ApplyJobSpecDefaults(&spec);
  ExpectInvalid(spec, "optimizer.beta1 must be in [0, 1), got 1");
  spec.mutable_optimizer()->set_beta1(0.9);
  spec.mutable_optimizer()->set_beta2(-0.1);
  ExpectInvalid(spec, "optimizer.beta2 must be in [0, 1), got -0.1");
  spec.mutable_optimizer()->set_beta2(0.99);
  spec.mutable_optimizer()->set_eps(std::nan(""));
  ExpectInvalid(spec, "optimizer.eps must be in (0, 1], got nan");
}

TEST(ValidateJobSpec, LrSchedule_FieldsAreBoundedAndBelongToTheirKind) {
  v1::JobSpec spec = ValidSpec();
  EXPECT_EQ(spec.lr_schedule().kind(), v1::CONSTANT);
  spec.mutable_lr_schedule()->set_gamma(0.5);
  ExpectInvalid(spec, "lr_schedule.step_size and gamma apply to step only");
  spec = ValidSpec();
  spec.mutable_lr_schedule()->set_kind(v1::WARMUP_COSINE);
  spec.mutable_lr_schedule()->set_warmup_steps(4);
  ExpectInvalid(spec, "lr_schedule.warmup_steps must be in [0, steps = 3], got 4");
  spec.mutable_lr_schedule()->set_warmup_steps(1);
  spec.mutable_lr_schedule()->set_min_lr(0.2);
  ExpectInvalid(spec, "lr_schedule.min_lr must be in [0, optimizer.lr], got 0.2");
  spec.mutable_lr_schedule()->set_min_lr(0.01);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec = ValidSpec();
  spec.mutable_lr_schedule()->set_kind(v1::STEP);
  ExpectInvalid(spec, "lr_schedule.step_size must be in [1, 1000000000], got 0");
  spec.mutable_lr_schedule()->set_step_size(2);
  spec.mutable_lr_schedule()->set_gamma(1.5);
  ExpectInvalid(spec, "lr_schedule.gamma must be in (0, 1], got 1.5");
  // Unset, gamma is StepLR's 0.1 (it was refused as 0).
  spec.mutable_lr_schedule()->clear_gamma();
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.lr_schedule().gamma(), 0.1);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ValidateJobSpec, ShuffleAndEvalData_Rules) {
  v1::JobSpec spec = ValidSpec();
  spec.mutable_data()->mutable_npy()->set_features_path("/d/x.npy");
  spec.mutable_data()->mutable_npy()->set_targets_path("/d/y.npy");
  spec.mutable_data()->mutable_npy()->set_shuffle_seed(3);
  ExpectInvalid(spec, "data.npy.shuffle_seed needs data.npy.shuffle");
  spec.mutable_data()->mutable_npy()->set_shuffle(true);
  spec.mutable_data()->mutable_npy()->set_shuffle_seed(-3);
  ExpectInvalid(spec, "data.npy.shuffle_seed must be >= 0, got -3");
  spec.mutable_data()->mutable_npy()->set_shuffle_seed(3);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.set_eval_every(2);
  ExpectInvalid(spec, "eval_every needs eval_data");
  spec.mutable_eval_data()->set_features_path("/d/ex.npy");
  ExpectInvalid(spec, "eval_data.features_path and eval_data.targets_path must name .npy files");
  spec.mutable_eval_data()->set_targets_path("/d/ey.npy");
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.mutable_eval_data()->set_shuffle(true);
  ExpectInvalid(spec, "eval_data.shuffle must be off");
  spec.mutable_eval_data()->set_shuffle(false);
  spec.set_eval_every(-1);
  ExpectInvalid(spec, "eval_every must be in [0, 1000000000], got -1");
}

TEST(ValidateJobSpec, MaxGradNorm_MustBeNonNegative) {
  v1::JobSpec spec = ValidSpec();
  spec.set_max_grad_norm(-1);
  ExpectInvalid(spec, "max_grad_norm (0 = no clipping) must be in [0, 3.4028235e+38]");
}

TEST(ValidateJobSpec, Seed_MustBeNonNegative) {
  v1::JobSpec spec = ValidSpec();
  spec.set_seed(-2);
  ExpectInvalid(spec, "seed must be >= 0, got -2");
}

TEST(ValidateJobSpec, TelemetryEvery_MustBePositive) {
  v1::JobSpec spec = ValidSpec();
  spec.set_telemetry_every(-1);
  ExpectInvalid(spec, "telemetry_every must be >= 1, got -1");
}

TEST(ValidateJobSpec, ProgressTimeout_MustBeAtLeastAMillisecondAndBounded) {
  v1::JobSpec spec = ValidSpec();
  EXPECT_EQ(spec.progress_timeout_s(), 300) << "default";
  spec.set_progress_timeout_s(-1);
  ExpectInvalid(spec, "progress_timeout_s must be in [0.001, 2592000] seconds (default 300), "
                      "got -1");
  // 0 ms, and an overflowing conversion to ms: each would switch stall detection off.
  spec.set_progress_timeout_s(0.0001);
  ExpectInvalid(spec, "progress_timeout_s must be in [0.001, 2592000]");
  spec.set_progress_timeout_s(1e16);
  ExpectInvalid(spec, "progress_timeout_s must be in [0.001, 2592000]");
  spec.set_progress_timeout_s(0.001);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ValidateJobSpec, CollectiveTimeout_DefaultsTo60_AndMustBeInRange) {
  v1::JobSpec spec = ValidSpec();
  EXPECT_EQ(spec.collective_timeout_s(), 60) << "default";
  spec.set_collective_timeout_s(3600);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.set_collective_timeout_s(0.5);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.set_collective_timeout_s(-1);
  ExpectInvalid(spec, "collective_timeout_s must be in [0.001, 3600] seconds (default 60), got -1");
  spec.set_collective_timeout_s(3600.5);
  ExpectInvalid(spec, "collective_timeout_s must be in [0.001, 3600] seconds (default 60), got 3600.5");
  spec.set_collective_timeout_s(std::nan(""));
  ExpectInvalid(spec, "collective_timeout_s must be in [0.001, 3600]");
  spec.set_collective_timeout_s(INFINITY);
  ExpectInvalid(spec, "collective_timeout_s must be in [0.001, 3600]");
  spec.set_collective_timeout_s(0.0004);  // 0 ms once rounded: the ranks would refuse it.
  ExpectInvalid(spec, "collective_timeout_s must be in [0.001, 3600]");
  // Unset after defaults is impossible, but a spec validated without them is refused too.
  spec.set_collective_timeout_s(0);
  ExpectInvalid(spec, "collective_timeout_s must be in [0.001, 3600]");
}

TEST(ApplyJobSpecDefaults, ExplicitCollectiveTimeoutKept) {
  auto spec = ParseJobSpecJson(R"({"collective_timeout_s": 7.5})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ApplyJobSpecDefaults(&*spec);
  EXPECT_EQ(spec->collective_timeout_s(), 7.5);
}

TEST(ValidateJobSpec, CheckpointEvery_NeedsADirectory) {
  v1::JobSpec spec = ValidSpec();
  spec.set_checkpoint_every(-1);
  ExpectInvalid(spec, "checkpoint_every must be >= 0");
  spec.set_checkpoint_every(10);
  ExpectInvalid(spec, "checkpoint_dir must be set when checkpoint_every > 0");
  spec.set_checkpoint_dir("/tmp/ckpt");
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

TEST(ValidateJobSpec, KeepCheckpoints_AllDefaultThreeOrOneToAThousand) {
  v1::JobSpec spec = ValidSpec();
  for (int keep : {-2, 1001}) {
    spec.set_keep_checkpoints(keep);
    ExpectInvalid(spec, absl::StrCat("keep_checkpoints must be -1 (keep every one), 0 (the "
                                     "default, 3) or in [1, 1000], got ", keep));
  }
  for (int keep : {-1, 0, 1, 1000}) {
    spec.set_keep_checkpoints(keep);
    EXPECT_TRUE(ValidateJobSpec(spec).ok()) << keep;
  }
  spec.set_keep_checkpoints(0);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.keep_checkpoints(), 3);
}

TEST(ValidateJobSpec, MaxRestarts_MustBeInRange) {
  v1::JobSpec spec = ValidSpec();
  spec.set_max_restarts(-1);
  ExpectInvalid(spec, "max_restarts must be in [0, 100], got -1");
}

// A valid language-model spec: model.gpt over token files.
constexpr char kValidGptJson[] = R"({
  "name": "lm", "world_size": 2, "device": "cpu",
  "model": {"gpt": {"vocab_size": 256, "context_length": 64, "layers": 2, "heads": 4,
                    "width": 32}},
  "data": {"tokens": {"files": ["/data/text/train_*.bin", "/data/text/extra.bin"]}},
  "eval_tokens": {"files": ["/data/text/val_000.bin"]},
  "sample": {"prompt_text": "In the beginning", "max_new_tokens": 100, "top_k": 40},
  "micro_batch_size": 8, "steps": 10, "precision": "fp32",
  "optimizer": {"lr": 0.001, "kind": "adamw"}
})";

v1::JobSpec ValidGptSpec() {
  auto spec = ParseJobSpecJson(kValidGptJson);
  EXPECT_TRUE(spec.ok()) << spec.status();
  ApplyJobSpecDefaults(&*spec);
  return *spec;
}

// Every rule passed: OK once the model is trained (kGptModelTrainable), until then the one
// refusal that says so.
void ExpectValidGpt(const v1::JobSpec& spec) {
  absl::Status status = ValidateJobSpec(spec);
  if (kGptModelTrainable) {
    EXPECT_TRUE(status.ok()) << status;
  } else {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
    EXPECT_NE(std::string(status.message()).find("does not train it yet"), std::string::npos)
        << status;
  }
}

TEST(ValidateJobSpec, Gpt_CudaIsAccepted) {
  v1::JobSpec spec = ValidGptSpec();
  spec.clear_sample();
  spec.set_device(v1::CUDA);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

// The shapes the CUDA backend's attention cannot run are refused at submit, naming the fields
// (before: an INTERNAL error from cuDNN at the rank's first step): fp16/bf16 go through cuDNN's
// fused SDPA (head size a multiple of 8 up to 256, at least 2 positions), fp32 through our
// kernel (at most 8192 positions). The CPU backend runs them all.
TEST(ValidateJobSpec, Gpt_OnCuda_OnlyShapesItsAttentionRuns) {
  struct Case {
    v1::Precision precision;
    int64_t width, heads, context_length;
    const char* refusal;  // nullptr: valid
  };
  const std::vector<Case> cases = {
      {v1::BF16, 200, 8, 64,
       "model.gpt.width / model.gpt.heads (the head size) must be a multiple of 8 and at most 256 "
       "for a bf16 GPT on cuda (cuDNN's fused attention), got 200 / 8 = 25"},
      {v1::FP16, 1024, 2, 64,
       "model.gpt.width / model.gpt.heads (the head size) must be a multiple of 8 and at most 256 "
       "for an fp16 GPT on cuda (cuDNN's fused attention), got 1024 / 2 = 512"},
      {v1::BF16, 36, 6, 64, "got 36 / 6 = 6"},
      {v1::BF16, 64, 2, 1,
       "model.gpt.context_length must be at least 2 for a bf16 GPT on cuda (cuDNN's fused "
       "attention), got 1"},
      {v1::FP32, 32, 4, 8193,
       "model.gpt.context_length must be at most 8192 for an fp32 GPT on cuda"},
      {v1::BF16, 1024, 4, 2, nullptr},   // head size 256, 2 positions
      {v1::FP16, 80, 1, 100, nullptr},   // 80, a length that is no multiple of 64
      {v1::FP32, 200, 8, 8192, nullptr},  // any head size, up to 8192 positions
      {v1::FP32, 32, 4, 1, nullptr},
  };
  for (const Case& c : cases) {
    for (v1::DeviceKind device : {v1::CUDA, v1::CPU}) {
      v1::JobSpec spec = ValidGptSpec();
      spec.clear_sample();
      spec.set_device(device);
      spec.set_precision(c.precision);
      spec.set_micro_batch_size(1);
      v1::GptSpec* gpt = spec.mutable_model()->mutable_gpt();
      gpt->set_width(c.width);
      gpt->set_heads(c.heads);
      gpt->set_context_length(c.context_length);
      SCOPED_TRACE(absl::StrCat(v1::DeviceKind_Name(device), " ", v1::Precision_Name(c.precision),
                                " width ", c.width, " heads ", c.heads, " T ",
                                c.context_length));
      if (device == v1::CUDA && c.refusal != nullptr) {
        ExpectInvalid(spec, c.refusal);
      } else {
        EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
      }
    }
  }
}

TEST(ApplyJobSpecDefaults, Gpt_LeavesTheMlpUnset_CrossEntropyEvalBatchesTemperature) {
  v1::JobSpec spec = ValidGptSpec();
  EXPECT_EQ(spec.model().activation(), v1::ACTIVATION_UNSPECIFIED);
  EXPECT_EQ(spec.model().norm(), v1::NORM_KIND_UNSPECIFIED);
  EXPECT_EQ(spec.loss(), v1::CROSS_ENTROPY);
  EXPECT_EQ(spec.eval_batches(), kDefaultEvalBatches);
  EXPECT_EQ(spec.sample().temperature(), 1.0);
  ExpectValidGpt(spec);
  // Without eval_tokens no eval_batches default (it would then be refused).
  spec.clear_eval_tokens();
  spec.set_eval_batches(0);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.eval_batches(), 0);
  ExpectValidGpt(spec);
}

TEST(ValidateJobSpec, Gpt_ShapeFieldsAreBounded) {
  struct Case {
    void (*apply)(v1::GptSpec*);
    const char* message;
  };
  const std::vector<Case> cases = {
      {[](v1::GptSpec* g) { g->set_vocab_size(0); },
       "model.gpt.vocab_size must be in [1, 1048576], got 0"},
      {[](v1::GptSpec* g) { g->set_vocab_size((1 << 20) + 1); },
       "model.gpt.vocab_size must be in [1, 1048576], got 1048577"},
      {[](v1::GptSpec* g) { g->set_context_length(65537); },
       "model.gpt.context_length must be in [1, 65536], got 65537"},
      {[](v1::GptSpec* g) { g->set_context_length(-1); },
       "model.gpt.context_length must be in [1, 65536], got -1"},
      {[](v1::GptSpec* g) { g->set_layers(257); }, "model.gpt.layers must be in [1, 256], got 257"},
      {[](v1::GptSpec* g) { g->set_layers(0); }, "model.gpt.layers must be in [1, 256], got 0"},
      {[](v1::GptSpec* g) { g->set_width(65537); },
       "model.gpt.width must be in [1, 65536], got 65537"},
      {[](v1::GptSpec* g) { g->set_heads(0); },
       "model.gpt.heads must be >= 1 and divide model.gpt.width = 32, got 0"},
      {[](v1::GptSpec* g) { g->set_heads(5); },
       "model.gpt.heads must be >= 1 and divide model.gpt.width = 32, got 5"},
      {[](v1::GptSpec* g) { g->set_heads(64); },
       "model.gpt.heads must be >= 1 and divide model.gpt.width = 32, got 64"},
      {[](v1::GptSpec* g) { g->set_padded_vocab_size(255); },
       "model.gpt.padded_vocab_size must be 0 (= vocab_size) or in [vocab_size = 256, 1048576], "
       "got 255"},
      {[](v1::GptSpec* g) { g->set_padded_vocab_size((1 << 20) + 1); },
       "model.gpt.padded_vocab_size must be 0"},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec = ValidGptSpec();
    c.apply(spec.mutable_model()->mutable_gpt());
    ExpectInvalid(spec, c.message);
  }
  v1::JobSpec spec = ValidGptSpec();
  spec.mutable_model()->mutable_gpt()->set_padded_vocab_size(320);
  ExpectValidGpt(spec);
  spec.mutable_model()->mutable_gpt()->set_heads(32);
  ExpectValidGpt(spec);
}

TEST(ValidateJobSpec, Gpt_ReplacesTheMlpAndGoesWithTokensAndCrossEntropy) {
  for (void (*apply)(v1::ModelSpec*) :
       {+[](v1::ModelSpec* m) { m->set_input_dim(8); },
        +[](v1::ModelSpec* m) { m->add_hidden_dims(4); },
        +[](v1::ModelSpec* m) { m->set_output_dim(2); },
        +[](v1::ModelSpec* m) { m->set_activation(v1::GELU); },
        +[](v1::ModelSpec* m) { m->set_norm(v1::NONE); }}) {
    v1::JobSpec spec = ValidGptSpec();
    apply(spec.mutable_model());
    ExpectInvalid(spec, "model.gpt replaces the MLP");
  }
  v1::JobSpec spec = ValidGptSpec();
  spec.set_loss(v1::MSE);
  ExpectInvalid(spec, "model.gpt trains with loss cross_entropy (its default), got MSE");
  spec = ValidGptSpec();
  spec.mutable_data()->mutable_synthetic()->set_seed(1);
  ExpectInvalid(spec, "model.gpt needs data.tokens");
  // Tokens, eval_tokens and sample without model.gpt.
  v1::JobSpec mlp = ValidSpec();
  *mlp.mutable_data()->mutable_tokens() = ValidGptSpec().data().tokens();
  ExpectInvalid(mlp, "data.tokens is for model.gpt");
  mlp = ValidSpec();
  *mlp.mutable_eval_tokens() = ValidGptSpec().eval_tokens();
  ExpectInvalid(mlp, "eval_tokens is for model.gpt");
  mlp = ValidSpec();
  *mlp.mutable_sample() = ValidGptSpec().sample();
  ExpectInvalid(mlp, "sample is for model.gpt");
  spec = ValidGptSpec();
  spec.mutable_eval_data()->set_features_path("/d/x.npy");
  spec.mutable_eval_data()->set_targets_path("/d/y.npy");
  ExpectInvalid(spec, "model.gpt evaluates on eval_tokens, not eval_data");
}

TEST(ValidateJobSpec, Gpt_MicroBatchTokensAreBounded) {
  v1::JobSpec spec = ValidGptSpec();
  spec.mutable_model()->mutable_gpt()->set_context_length(65536);
  spec.set_micro_batch_size(256);
  ExpectValidGpt(spec);
  spec.set_micro_batch_size(257);
  ExpectInvalid(spec, "micro_batch_size * model.gpt.context_length must be at most 16777216 "
                      "tokens, got 257 * 65536");
}

TEST(ValidateJobSpec, TokenFiles_AreBoundedPathsOrLastComponentPatterns) {
  v1::JobSpec spec = ValidGptSpec();
  spec.mutable_data()->mutable_tokens()->clear_files();
  ExpectInvalid(spec, "data.tokens.files must name 1 to 4096 token files or patterns, got 0");
  for (int i = 0; i < 4097; ++i) spec.mutable_data()->mutable_tokens()->add_files("/d/a.bin");
  ExpectInvalid(spec, "data.tokens.files must name 1 to 4096 token files or patterns, got 4097");
  spec = ValidGptSpec();
  spec.mutable_data()->mutable_tokens()->add_files("relative.bin");
  ExpectInvalid(spec, "data.tokens.files[2] must be an absolute path");
  spec = ValidGptSpec();
  spec.mutable_data()->mutable_tokens()->add_files("/d/../etc/passwd");
  ExpectInvalid(spec, "data.tokens.files[2]");
  spec = ValidGptSpec();
  spec.mutable_data()->mutable_tokens()->add_files("/d/*/a.bin");
  ExpectInvalid(spec,
                "data.tokens.files[2] may hold the wildcards * and ? in its last component only");
  spec = ValidGptSpec();
  spec.mutable_data()->mutable_tokens()->add_files("/d/a[0-9]*.bin");
  ExpectInvalid(spec, "data.tokens.files[2]: a pattern's wildcards are * and ? only");
  spec = ValidGptSpec();
  spec.mutable_eval_tokens()->add_files("/d/?al_*.bin");
  ExpectValidGpt(spec);
  spec.mutable_eval_tokens()->add_files("/d/../x.bin");
  ExpectInvalid(spec, "eval_tokens.files[2]");
  // Shuffling: a seed needs shuffle; never for evaluation.
  spec = ValidGptSpec();
  spec.mutable_data()->mutable_tokens()->set_shuffle_seed(3);
  ExpectInvalid(spec, "data.tokens.shuffle_seed needs data.tokens.shuffle");
  spec.mutable_data()->mutable_tokens()->set_shuffle(true);
  ExpectValidGpt(spec);
  spec.mutable_data()->mutable_tokens()->set_shuffle_seed(-1);
  ExpectInvalid(spec, "data.tokens.shuffle_seed must be >= 0, got -1");
  spec = ValidGptSpec();
  spec.mutable_eval_tokens()->set_shuffle(true);
  ExpectInvalid(spec, "eval_tokens.shuffle must be off");
}

TEST(ValidateJobSpec, EvalBatchesAndEvalEvery_GoWithEvalTokens) {
  v1::JobSpec spec = ValidGptSpec();
  spec.set_eval_batches(10001);
  ExpectInvalid(spec, "eval_batches must be in [1, 10000] (default 20), got 10001");
  spec.set_eval_batches(-1);
  ExpectInvalid(spec, "eval_batches must be in [1, 10000] (default 20), got -1");
  spec.set_eval_batches(10000);
  spec.set_eval_every(5);
  ExpectValidGpt(spec);
  spec.clear_eval_tokens();
  ExpectInvalid(spec, "eval_batches needs eval_tokens");
  spec.set_eval_batches(0);
  ExpectInvalid(spec, "eval_every needs eval_data (or eval_tokens for model.gpt)");
}

TEST(ValidateJobSpec, Sample_FieldsAreBounded) {
  struct Case {
    void (*apply)(v1::SampleSpec*);
    const char* message;
  };
  const std::vector<Case> cases = {
      {[](v1::SampleSpec* s) { s->set_max_new_tokens(0); },
       "sample.max_new_tokens must be in [1, 4096], got 0"},
      {[](v1::SampleSpec* s) { s->set_max_new_tokens(4097); },
       "sample.max_new_tokens must be in [1, 4096], got 4097"},
      {[](v1::SampleSpec* s) { s->set_temperature(-0.5); },
       "sample.temperature must be a finite number > 0 (default 1), got -0.5"},
      {[](v1::SampleSpec* s) { s->set_temperature(std::nan("")); },
       "sample.temperature must be a finite number > 0"},
      {[](v1::SampleSpec* s) { s->set_temperature(INFINITY); },
       "sample.temperature must be a finite number > 0"},
      {[](v1::SampleSpec* s) { s->set_top_k(257); },
       "sample.top_k must be in [0, model.gpt.vocab_size = 256] (0 = every token), got 257"},
      {[](v1::SampleSpec* s) { s->set_top_k(-1); }, "sample.top_k must be in [0"},
      {[](v1::SampleSpec* s) { s->set_seed(-1); }, "sample.seed must be >= 0, got -1"},
      {[](v1::SampleSpec* s) { s->add_prompt_tokens(1); },
       "sample sets prompt_tokens or prompt_text, not both"},
      {[](v1::SampleSpec* s) { s->clear_prompt_text(); }, "sample needs a prompt"},
      {[](v1::SampleSpec* s) { s->set_prompt_text(std::string(4097, 'a')); },
       "sample.prompt_text may hold at most 4096 bytes, got 4097"},
      {[](v1::SampleSpec* s) {
         s->clear_prompt_text();
         s->add_prompt_tokens(3);
         s->add_prompt_tokens(256);
       },
       "sample.prompt_tokens[1] must be in [0, vocab_size = 256), got 256"},
      {[](v1::SampleSpec* s) {
         s->clear_prompt_text();
         s->add_prompt_tokens(-1);
       },
       "sample.prompt_tokens[0] must be in [0, vocab_size = 256), got -1"},
      {[](v1::SampleSpec* s) {
         s->clear_prompt_text();
         for (int i = 0; i < 4097; ++i) s->add_prompt_tokens(1);
       },
       "sample.prompt_tokens may hold at most 4096 tokens, got 4097"},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec = ValidGptSpec();
    c.apply(spec.mutable_sample());
    ExpectInvalid(spec, c.message);
  }
  // Text needs a byte-level vocabulary; token ids do not.
  v1::JobSpec spec = ValidGptSpec();
  spec.mutable_model()->mutable_gpt()->set_vocab_size(100);
  spec.mutable_sample()->set_top_k(0);
  ExpectInvalid(spec, "sample.prompt_text needs a byte-level vocabulary (model.gpt.vocab_size >= "
                      "256: each byte is a token), got vocab_size 100");
  spec.mutable_sample()->clear_prompt_text();
  spec.mutable_sample()->add_prompt_tokens(99);
  ExpectValidGpt(spec);
  spec.mutable_model()->mutable_gpt()->set_vocab_size(50257);
  spec.mutable_sample()->set_prompt_text("Hi");
  spec.mutable_sample()->clear_prompt_tokens();
  ExpectValidGpt(spec);
}

TEST(SpecPaths, TokenFilesAndPatterns_AreReadPathsNamedByIndex) {
  v1::JobSpec spec = ValidGptSpec();
  spec.set_output_checkpoint("/out/final.st");
  std::vector<std::string> listed;
  for (const SpecPath& path : SpecPaths(spec)) {
    listed.push_back(absl::StrCat(path.field, "=", path.path, path.write ? " (write)" : ""));
  }
  EXPECT_EQ(listed, (std::vector<std::string>{"data.tokens.files[0]=/data/text/train_*.bin",
                                              "data.tokens.files[1]=/data/text/extra.bin",
                                              "eval_tokens.files[0]=/data/text/val_000.bin",
                                              "output_checkpoint=/out/final.st (write)"}));
}

TEST(ParameterCount, CountsWeightsAndBiases) {
  v1::JobSpec spec = ValidSpec();  // 8 -> 4 -> 4 -> 2
  EXPECT_EQ(ParameterCount(spec.model()), 8 * 4 + 4 + 4 * 4 + 4 + 4 * 2 + 2);
}

}  // namespace
}  // namespace mptrain
