// Careless or hostile input on real processes: impossible models are refused at submit, a job
// that cannot be placed does not block the queue, hostile data and checkpoint files fail their
// job with a reason naming the file (never a crash or a hang of the rank), and a flood of jobs
// keeps the coordinator small and `trainctl list` working. After each, the workers are alive
// and take the next job.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <future>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "tests/local_cluster.h"

namespace mptrain::testing {
namespace {

// A float32 .npy file with a header written by hand (so it can lie).
void WriteRawNpy(const std::string& path, const std::string& dict, size_t data_bytes) {
  std::string header = dict;
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  out << "\x93NUMPY" << '\x01' << '\x00';
  out.put(static_cast<char>(header.size() & 0xff));
  out.put(static_cast<char>(header.size() >> 8));
  out << header << std::string(data_bytes, '\0');
}

int64_t RssKiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestTempDir() + "/bad";
    RunCommand("rm -rf " + dir_ + " && mkdir -p " + dir_);
    LocalCluster::Options options;
    options.roots = dir_;
    // FiveThousandQueuedJobs submits them all as one user.
    options.coordinator_flags = {"--max_pending_jobs_per_principal=10000"};
    cluster_ = std::make_unique<LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start().ok());
    NpyMatrix features{8, 4, std::vector<float>(32, 0.5f)};
    NpyMatrix targets{8, 2, std::vector<float>(16, 0.25f)};
    ASSERT_TRUE(WriteNpyMatrix(dir_ + "/features.npy", features).ok());
    ASSERT_TRUE(WriteNpyMatrix(dir_ + "/targets.npy", targets).ok());
  }

  std::string Spec(const std::string& name, const std::string& fields) {
    return WriteSpec(name, absl::StrCat(R"({"name": ")", name, R"(", "world_size": 2,
      "device": "cpu", "model": {"input_dim": 4, "output_dim": 2}, "micro_batch_size": 2,
      "accumulation_steps": 1, "steps": 2, "optimizer": {"lr": 0.1}, "progress_timeout_s": 60)",
                                        fields, "}"));
  }

  std::string NpyData(const std::string& features, const std::string& targets = "") {
    return absl::StrCat(R"(, "data": {"npy": {"features_path": ")", features,
                        R"(", "targets_path": ")",
                        targets.empty() ? dir_ + "/targets.npy" : targets, R"("}})");
  }

  // The job fails within a bounded time naming `what`, and the workers take the next job.
  void ExpectFailsNaming(const std::string& name, const std::string& fields,
                         const std::vector<std::string>& what) {
    SCOPED_TRACE(name);
    const std::string job_id = cluster_->Submit(Spec(name, fields));
    auto ended = cluster_->WaitForEnd(job_id, 30);
    ASSERT_TRUE(ended.ok()) << ended.status() << " (a hostile file must not hang the rank)";
    EXPECT_EQ(ended->state(), v1::FAILED);
    for (const std::string& text : what) {
      EXPECT_NE(ended->error().find(text), std::string::npos)
          << "the reason must name " << text << ": " << ended->error();
    }
    EXPECT_EQ(ended->error().find("signal"), std::string::npos) << ended->error();
  }

  void ExpectNextJobSucceeds() {
    CommandResult next = cluster_->Trainctl(
        "submit " + Spec("next", NpyData(dir_ + "/features.npy")) + " --wait");
    EXPECT_EQ(next.exit_code, 0) << next.output;
    for (int i = 0; i < 2; ++i) EXPECT_EQ(kill(cluster_->worker_pid(i), 0), 0) << "worker died";
  }

  std::string dir_;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(BadInput, ImpossibleModels_RefusedAtSubmitWithTheEstimate) {
  CommandResult wide = cluster_->Trainctl(
      "submit " + WriteSpec("wide", R"({"name": "wide", "world_size": 1, "device": "cpu",
        "model": {"input_dim": 1048576, "hidden_dims": [1048576, 1048576], "output_dim": 1048576},
        "data": {"synthetic": {"seed": 0}}, "micro_batch_size": 1, "accumulation_steps": 1,
        "steps": 1, "optimizer": {"lr": 0.1}})"));
  EXPECT_EQ(wide.exit_code, 1);
  EXPECT_NE(wide.output.find("INVALID_ARGUMENT: the model does not fit"), std::string::npos)
      << wide.output;
  EXPECT_NE(wide.output.find("per rank"), std::string::npos) << wide.output;
  CommandResult batch = cluster_->Trainctl(
      "submit " + WriteSpec("batch", R"({"name": "batch", "world_size": 1, "device": "cpu",
        "model": {"input_dim": 1024, "output_dim": 16}, "data": {"synthetic": {"seed": 0}},
        "micro_batch_size": 16777216, "accumulation_steps": 1, "steps": 1,
        "optimizer": {"lr": 0.1}})"));
  EXPECT_EQ(batch.exit_code, 1);
  EXPECT_NE(batch.output.find("does not fit"), std::string::npos) << batch.output;
  CommandResult steps = cluster_->Trainctl("submit " + Spec("steps", R"(, "steps": 99999999999,
      "data": {"synthetic": {"seed": 0}})"));
  EXPECT_NE(steps.output.find("steps must be in [1, 1000000000]"), std::string::npos)
      << steps.output;
  ExpectNextJobSucceeds();
}

TEST_F(BadInput, UnplaceableJob_DoesNotBlockTheQueue) {
  const std::string wide =
      cluster_->Submit(Spec("three", R"(, "world_size": 3, "data": {"synthetic": {"seed": 0}})"));
  CommandResult status = cluster_->Trainctl("status " + wide);
  EXPECT_NE(status.output.find("needs 3 cpu slots; 2 exist"), std::string::npos)
      << status.output;
  const auto start = std::chrono::steady_clock::now();
  ExpectNextJobSucceeds();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  auto still = cluster_->WaitForJob(wide, [](const v1::Job&) { return true; }, 5);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->state(), v1::PENDING);
  // With a queue timeout it gives up by itself, saying why.
  const std::string timed = cluster_->Submit(Spec(
      "timed", R"(, "world_size": 3, "queue_timeout_s": 1, "data": {"synthetic": {"seed": 0}})"));
  auto ended = cluster_->WaitForEnd(timed, 20);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state(), v1::FAILED);
  EXPECT_NE(ended->error().find("not placed within queue_timeout_s 1: needs 3 cpu slots"),
            std::string::npos)
      << ended->error();
}

TEST_F(BadInput, HostileDataFiles_FailTheJobNamingTheFile) {
  mkdir((dir_ + "/a_directory.npy").c_str(), 0755);
  mkfifo((dir_ + "/fifo.npy").c_str(), 0644);
  WriteRawNpy(dir_ + "/negative.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (-3, 4), }", 48);
  WriteRawNpy(dir_ + "/huge.npy",
              "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 4), }", 16);
  // A character device like /dev/zero (no root may be /dev): never opened, so never read
  // for ever. The tests run as root (CI does); mknod needs it.
  ASSERT_EQ(RunCommand("mknod " + dir_ + "/zero.npy c 1 5").exit_code, 0)
      << "mknod needs root: run the tests as root, as CI does";
  WriteRawNpy(dir_ + "/wraps.npy",
              "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", 0);
  WriteRawNpy(dir_ + "/truncated.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (8, 4), }", 20);
  WriteRawNpy(dir_ + "/fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (8, 4), }", 128);
  WriteRawNpy(dir_ + "/float64.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (8, 4), }", 256);
  struct Case {
    std::string file;
    std::string reason;
  };
  int index = 0;
  for (const Case& c : std::vector<Case>{{dir_ + "/a_directory.npy", "not a regular file"},
                                         {dir_ + "/fifo.npy", "not a regular file"},
                                         {dir_ + "/zero.npy", "not a regular file"},
                                         {dir_ + "/negative.npy", "'shape'[0] is negative"},
                                         {dir_ + "/huge.npy", "too large for int64"},
                                         {dir_ + "/wraps.npy", "more elements than fit in 64 bits"},
                                         {dir_ + "/truncated.npy",
                                          "truncated: its data is shorter than 'shape' and "
                                          "'descr' need"},
                                         {dir_ + "/fortran.npy", "ortran"},
                                         {dir_ + "/float64.npy", "'descr' is not '<f4'"}}) {
    ExpectFailsNaming(absl::StrCat("hostile", index++), NpyData(c.file), {c.file, c.reason});
  }
  ExpectNextJobSucceeds();
}

TEST_F(BadInput, HostileInitCheckpoints_FailTheJobNamingTheFile) {
  TensorMap nan;
  nan["layers.0.weight"] = {{2, 4}, std::vector<float>(8, std::nanf(""))};
  nan["layers.0.bias"] = {{2}, std::vector<float>(2, 0.0f)};
  ASSERT_TRUE(WriteSafetensors(dir_ + "/nan.safetensors", nan).ok());
  mkdir((dir_ + "/dir.safetensors").c_str(), 0755);
  std::ofstream(dir_ + "/garbage.safetensors") << std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8)
                                               << "not json";
  const std::string synthetic = R"(, "data": {"synthetic": {"seed": 0}})";
  ExpectFailsNaming("nan", synthetic + R"(, "init_checkpoint": ")" + dir_ + R"(/nan.safetensors")",
                    {"nan.safetensors", "tensor 'layers.0.weight' holds a NaN or infinity"});
  ExpectFailsNaming("dir", synthetic + R"(, "init_checkpoint": ")" + dir_ + R"(/dir.safetensors")",
                    {"dir.safetensors", "not a regular file"});
  ExpectFailsNaming("garbage",
                    synthetic + R"(, "init_checkpoint": ")" + dir_ + R"(/garbage.safetensors")",
                    {"garbage.safetensors"});
  ExpectNextJobSucceeds();
}

// Issue #27 item 9: a NaN in the features is refused naming the file, row and column (not the
// value); a run that diverges ends FAILED naming the step instead of SUCCEEDED with loss nan.
TEST_F(BadInput, NaNFeaturesRefused_DivergedRunFailsNamingTheStep) {
  NpyMatrix features{8, 4, std::vector<float>(32, 0.5f)};
  features.values[5 * 4 + 2] = std::nanf("");
  ASSERT_TRUE(WriteNpyMatrix(dir_ + "/nan_features.npy", features).ok());
  ExpectFailsNaming("nan-features", NpyData(dir_ + "/nan_features.npy"),
                    {dir_ + "/nan_features.npy", "row 5, column 2 is not finite"});

  // fp32 without a loss scaler skips no step: lr 1e30 (finite as a float32, so accepted)
  // blows the parameters up within a few steps.
  const std::string diverges = WriteSpec("diverges", absl::StrCat(R"({"name": "diverges",
      "world_size": 2, "device": "cpu", "model": {"input_dim": 4, "output_dim": 2},
      "micro_batch_size": 2, "accumulation_steps": 1, "steps": 30, "precision": "fp32",
      "optimizer": {"lr": 1e30}, "progress_timeout_s": 60)", NpyData(dir_ + "/features.npy"),
                                                    "}"));
  const std::string job_id = cluster_->Submit(diverges);
  auto ended = cluster_->WaitForEnd(job_id, 60);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state(), v1::FAILED) << "a diverged run must not succeed";
  EXPECT_NE(ended->error().find("the training diverged: the loss of step "), std::string::npos)
      << ended->error();
  ExpectNextJobSucceeds();
}

// Issue #27 item 2: an init_checkpoint naming a file that is not the user's (here the first
// bytes of /etc/shadow) fails without the error spelling its bytes as a header length, its
// size or any of its text.
TEST_F(BadInput, ForeignFileAsCheckpoint_ErrorQuotesNothingOfIt) {
  // Padded to a size (77777 bytes) that no other part of the error spells by chance.
  std::string shadow = "root:*:20000:0:99999:7:::\ndaemon:*:20000:0:99999:7:::\n";
  shadow.resize(77777, '#');
  std::ofstream(dir_ + "/shadow") << shadow;
  ExpectFailsNaming("shadow", R"(, "data": {"synthetic": {"seed": 0}}, "init_checkpoint": ")" +
                                  dir_ + R"(/shadow")",
                    {dir_ + "/shadow", "its header length (the first 8 bytes) exceeds"});
  auto jobs = cluster_->WaitForEnd(cluster_->Submit(Spec(
      "shadow2", R"(, "data": {"synthetic": {"seed": 0}}, "init_checkpoint": ")" + dir_ +
                     R"(/shadow")")), 30);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  std::string error = jobs->error();
  for (size_t at; (at = error.find(dir_ + "/shadow")) != std::string::npos;) {
    error.erase(at, dir_.size() + 7);
  }
  for (const std::string& secret : {std::string("3619251681095544690"), std::string("root"),
                                    std::string("99999"), absl::StrCat(shadow.size())}) {
    EXPECT_EQ(error.find(secret), std::string::npos)
        << "the error spells '" << secret << "' of the file: " << jobs->error();
  }
}

// Issue #27 item 10: names that read as options or directories, and paths with a newline, a
// bidirectional override or invalid UTF-8, are refused at submit naming the field.
TEST_F(BadInput, OddNamesAndPaths_RefusedAtSubmit) {
  const std::string synthetic = R"(, "data": {"synthetic": {"seed": 0}})";
  for (const std::string name : {"-rf", ".", ".."}) {
    CommandResult submit = cluster_->Trainctl(
        "submit " + WriteSpec("odd_name", absl::StrCat(R"({"name": ")", name, R"(",
          "world_size": 1, "device": "cpu", "model": {"input_dim": 4, "output_dim": 2},
          "micro_batch_size": 2, "accumulation_steps": 1, "steps": 1,
          "optimizer": {"lr": 0.1})", synthetic, "}")));
    EXPECT_EQ(submit.exit_code, 1) << name << ": " << submit.output;
    EXPECT_NE(submit.output.find("INVALID_ARGUMENT: name must start with a letter or a digit"),
              std::string::npos)
        << submit.output;
  }
  struct Case {
    std::string json_path;  // As written in the JSON.
    std::string reason;
  };
  for (const Case& c : std::vector<Case>{
           {dir_ + "/\u00fc\nx\u202e.safetensors", "U+000A (a control character)"},
           {dir_ + "/x\u202e.safetensors", "U+202E (a bidirectional formatting character)"},
           {dir_ + "/x\u2066.safetensors", "U+2066"}}) {
    CommandResult submit = cluster_->Trainctl(
        "submit " + Spec("odd-path", synthetic + R"(, "output_checkpoint": ")" + c.json_path +
                                         R"(")"));
    EXPECT_EQ(submit.exit_code, 1) << submit.output;
    EXPECT_NE(submit.output.find("INVALID_ARGUMENT: output_checkpoint must not contain " +
                                 c.reason),
              std::string::npos)
        << submit.output;
  }
  struct stat unused;
  EXPECT_NE(stat((dir_ + "/\xc3\xbc\nx\xe2\x80\xae.safetensors").c_str(), &unused), 0)
      << "the file the issue's tester made must not be created";
  ExpectNextJobSucceeds();
}

// Sends raw bytes to a method, as a client with a broken or hostile encoder would.
grpc::Status CallWithBytes(const std::shared_ptr<grpc::Channel>& channel,
                           const std::string& method, const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(status); });
  return done.get_future().get();
}

TEST_F(BadInput, CorruptProtobufBytes_InvalidArgumentNamingTheMessage) {
  const std::string garbage = "\xff\xff\xff\xff\x0f\x08\x96";
  grpc::Status submit = CallWithBytes(cluster_->Channel(cluster_->SecurityFor("alice")),
                                      "/mptrain.v1.Coordinator/SubmitJob", garbage);
  EXPECT_EQ(submit.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << submit.error_message();
  EXPECT_NE(submit.error_message().find("mptrain.v1.SubmitJobRequest"), std::string::npos)
      << submit.error_message();
  grpc::Status poll = CallWithBytes(cluster_->Channel(cluster_->SecurityFor(LocalCluster::kSpareWorker)),
                                    "/mptrain.v1.WorkerControl/PollAssignments", garbage);
  EXPECT_EQ(poll.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << poll.error_message();
  EXPECT_NE(poll.error_message().find("mptrain.v1.PollAssignmentsRequest"), std::string::npos);
  ExpectNextJobSucceeds();
}

// Fields this build does not know are dropped from what workers and ranks send (a registration
// padded with 1 MB of them does not make every ListWorkers answer carry it), while a job spec's
// are refused (the user asked for something this coordinator would ignore).
TEST_F(BadInput, UnknownFields_DroppedFromReports_RefusedInSpecs) {
  v1::RegisterWorkerRequest padded;
  padded.set_host("127.0.0.1");
  padded.set_name(LocalCluster::kSpareWorker);  // the name its credentials register
  padded.set_device(v1::CPU);
  padded.set_slots(1);
  padded.set_incarnation(7);
  v1::DeviceInfo* device = padded.add_devices();
  device->set_name("cpu");
  device->GetReflection()->MutableUnknownFields(device)->AddLengthDelimited(
      99, std::string(1 << 20, 'x'));
  grpc::Status registered = CallWithBytes(cluster_->Channel(cluster_->SecurityFor(LocalCluster::kSpareWorker)),
                                          "/mptrain.v1.WorkerControl/RegisterWorker",
                                          padded.SerializeAsString());
  ASSERT_TRUE(registered.ok()) << registered.error_message();
  v1::ListWorkersResponse workers;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ASSERT_TRUE(
      cluster_->coordinator()->ListWorkers(&context, v1::ListWorkersRequest(), &workers).ok());
  EXPECT_LT(workers.ByteSizeLong(), 100'000u) << "the padding was kept";

  v1::SubmitJobRequest submit;
  submit.mutable_spec()->set_name("unknown");
  v1::JobSpec* spec = submit.mutable_spec();
  spec->GetReflection()->MutableUnknownFields(spec)->AddVarint(999, 1);
  grpc::Status refused = CallWithBytes(cluster_->Channel(cluster_->SecurityFor("alice")),
                                       "/mptrain.v1.Coordinator/SubmitJob",
                                       submit.SerializeAsString());
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("field number 999"), std::string::npos)
      << refused.error_message();
}

TEST_F(BadInput, FiveThousandQueuedJobs_CoordinatorStaysSmallAndListWorks) {
  // Jobs for a device kind nobody has: they all wait.
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_name("flood");
  request.mutable_spec()->set_world_size(1);
  request.mutable_spec()->set_device(v1::CUDA);
  request.mutable_spec()->mutable_model()->set_input_dim(4);
  request.mutable_spec()->mutable_model()->set_output_dim(2);
  request.mutable_spec()->mutable_data()->mutable_synthetic()->set_seed(0);
  request.mutable_spec()->set_micro_batch_size(2);
  request.mutable_spec()->set_accumulation_steps(1);
  request.mutable_spec()->set_steps(1);
  request.mutable_spec()->mutable_optimizer()->set_lr(0.1);
  const int64_t rss_before = RssKiB(cluster_->coordinator_pid());
  for (int i = 0; i < 5000; ++i) {
    // Names are unique among an owner's live jobs.
    request.mutable_spec()->set_name("flood-" + std::to_string(i));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SubmitJobResponse response;
    ASSERT_TRUE(cluster_->coordinator()->SubmitJob(&context, request, &response).ok()) << i;
  }
  const int64_t rss_after = RssKiB(cluster_->coordinator_pid());
  EXPECT_LT(rss_after - rss_before, 200 * 1024) << "KiB grown for 5,000 queued jobs";
  CommandResult list = cluster_->Trainctl("list");
  EXPECT_EQ(list.exit_code, 0) << list.output.substr(0, 1000);
  std::vector<std::string> lines = absl::StrSplit(list.output, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 5001u) << "a header and 5,000 jobs";
  CommandResult pending = cluster_->Trainctl("--state=pending --limit=10 list");
  EXPECT_EQ(pending.exit_code, 0);
  lines = absl::StrSplit(pending.output, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 11u);
  CommandResult status = cluster_->Trainctl("status job-5000");
  EXPECT_NE(status.output.find("no live cuda worker"), std::string::npos) << status.output;
  std::cout << "coordinator RSS " << rss_before << " KiB -> " << rss_after
            << " KiB after 5,000 jobs\n";
}

}  // namespace
}  // namespace mptrain::testing
