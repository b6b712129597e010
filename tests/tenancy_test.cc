// Two tenants of one secured cluster (mutual TLS and tokens; alice and bob are users, admin an
// admin): each writes only in its own part of the workers' output root, reads nothing in the
// other's, and a checkpoint put in place of another job's never poisons that job's restart
// (issue #27 item 1: alice's overwrite_output once replaced bob's checkpoint and bob's restart
// went on from her parameters).

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/local_cluster.h"

namespace mptrain::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

class Tenancy : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = TestTempDir() + "/tenancy";
    RunCommand("rm -rf " + root_ + " && mkdir -p " + root_);
    LocalCluster::Options options;
    options.roots = root_;
    cluster_ = std::make_unique<LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start().ok());
  }

  // trainctl as `principal` (the cluster's own is alice).
  CommandResult As(const std::string& principal, const std::string& arguments) {
    return cluster_->Trainctl(absl::StrCat("--token_file=", cluster_->pki(), "/", principal,
                                           ".token ", arguments));
  }

  // `width` sets how long a step takes: the restart test must find its job still running.
  std::string Spec(const std::string& name, const std::string& extra, int steps = 4,
                   int seed = 0, int width = 16) {
    return WriteSpec(name, absl::StrCat(R"({
      "name": ")", name, R"(", "world_size": 2, "device": "cpu",
      "model": {"input_dim": )", width, R"(, "hidden_dims": [)", width, R"(], "output_dim": 4},
      "data": {"synthetic": {"seed": )", seed, R"(}}, "micro_batch_size": 16,
      "accumulation_steps": 2, "steps": )", steps, R"(, "seed": )", seed, R"(,
      "optimizer": {"lr": 0.01, "momentum": 0.9}, "telemetry_every": 10)", extra, "}"));
  }

  // Submits as `principal` and waits for the end; returns the job.
  v1::Job RunAs(const std::string& principal, const std::string& spec) {
    CommandResult submitted = As(principal, "submit " + spec);
    EXPECT_EQ(submitted.exit_code, 0) << submitted.output;
    auto job = cluster_->WaitForEnd(LastLine(submitted.output), 120);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  // The text of the job's notes (RankNote events: warnings, samples), one a line, read as the
  // viewer.
  std::string Notes(const std::string& job_id) {
    auto viewer = v1::Coordinator::NewStub(cluster_->Channel(cluster_->SecurityFor("viewer")));
    std::string notes;
    v1::GetJobEventsRequest request;
    request.set_job_id(job_id);
    for (int page = 0; page < 100; ++page) {
      v1::GetJobEventsResponse response;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      grpc::Status status = viewer->GetJobEvents(&context, request, &response);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok() || response.events().empty()) break;
      for (const v1::WatchJobEvent& event : response.events()) {
        if (event.has_note()) absl::StrAppend(&notes, event.note().text(), "\n");
        request.set_after_sequence(event.sequence());
      }
      if (response.finished()) break;
    }
    return notes;
  }

  std::string root_;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(Tenancy, TwoUsers_WriteOnlyInTheirOwnParts_AndReadNothingOfTheOthers) {
  const std::string bobs = root_ + "/bob/model.safetensors";
  RunCommand("mkdir -p " + root_ + "/bob " + root_ + "/alice");
  v1::Job bob = RunAs("bob", Spec("bobs", R"(, "output_checkpoint": ")" + bobs + R"(")"));
  ASSERT_EQ(bob.state(), v1::SUCCEEDED) << bob.error();
  const std::string bobs_bytes = ReadAll(bobs);
  ASSERT_FALSE(bobs_bytes.empty());
  EXPECT_NE(bobs_bytes.find(R"("mptrain_owner":"bob")"), std::string::npos)
      << "the output is stamped with its owner";

  // alice cannot name a path in bob's part (or the shared level) for writing: refused at
  // submit, whatever overwrite_output says.
  for (const std::string& extra :
       {R"(, "overwrite_output": true, "output_checkpoint": ")" + bobs + R"(")",
        R"(, "checkpoint_every": 1, "checkpoint_dir": ")" + root_ + R"(/bob/stolen")",
        R"(, "output_checkpoint": ")" + root_ + R"(/top.safetensors")"}) {
    CommandResult refused = As("alice", "submit " + Spec("alice-writes", extra));
    EXPECT_NE(refused.exit_code, 0) << refused.output;
    EXPECT_NE(refused.output.find("PERMISSION_DENIED"), std::string::npos) << refused.output;
    EXPECT_NE(refused.output.find("outside alice's part"), std::string::npos) << refused.output;
  }
  EXPECT_FALSE(Exists(root_ + "/bob/stolen")) << "nothing created in bob's part";
  // Nor read bob's output (a data root overlapping an output root): the worker refuses it.
  v1::Job reads = RunAs("alice", Spec("alice-reads", R"(, "init_checkpoint": ")" + bobs + R"(")"));
  EXPECT_EQ(reads.state(), v1::FAILED);
  EXPECT_NE(reads.error().find("init_checkpoint"), std::string::npos) << reads.error();
  EXPECT_NE(reads.error().find("outside alice's part"), std::string::npos) << reads.error();
  EXPECT_EQ(ReadAll(bobs), bobs_bytes) << "bob's output is untouched";

  // alice's own part works, and overwrite_output replaces her own output only.
  const std::string alices = root_ + "/alice/model.safetensors";
  for (int run = 0; run < 2; ++run) {
    v1::Job alice = RunAs("alice", Spec("alices", R"(, "overwrite_output": true,
        "output_checkpoint": ")" + alices + R"(")", 4, run));
    EXPECT_EQ(alice.state(), v1::SUCCEEDED) << alice.error();
  }
  EXPECT_NE(ReadAll(alices).find(R"("mptrain_owner":"alice")"), std::string::npos);
  // An admin's job writes anywhere under the roots.
  v1::Job admin = RunAs("admin", Spec("admins", R"(, "output_checkpoint": ")" + root_ +
                                                    R"(/shared.safetensors")"));
  EXPECT_EQ(admin.state(), v1::SUCCEEDED) << admin.error();
}

// The issue's attack, as a file put in place of bob's recorded checkpoint (what alice's
// overwrite_output did before): bob's restart ignores it (a warning in its events), resumes
// from its own older checkpoint, never replaces the file, and ends bit-identical to an
// uninterrupted run.
TEST_F(Tenancy, AnotherJobsCheckpointInPlaceOfTheRecordedOne_NeverPoisonsTheRestart) {
  const std::string part = root_ + "/bob";
  auto spec = [&](const std::string& name, int seed, int restarts) {
    return Spec(name, absl::StrCat(R"(, "checkpoint_every": 40, "keep_checkpoints": -1,
        "max_restarts": )", restarts, R"(, "checkpoint_dir": ")", part, "/", name, R"(")"), 3000,
                seed, /*width=*/128);
  };
  RunCommand("mkdir -p " + root_ + "/alice/a " + part + "/whole " + part + "/poisoned");
  v1::Job alices = RunAs("alice", Spec("a", R"(, "checkpoint_every": 40, "keep_checkpoints": -1,
      "checkpoint_dir": ")" + root_ + R"(/alice/a")", 3000, /*seed=*/7, /*width=*/128));
  ASSERT_EQ(alices.state(), v1::SUCCEEDED) << alices.error();
  v1::Job whole = RunAs("bob", spec("whole", 3, 0));
  ASSERT_EQ(whole.state(), v1::SUCCEEDED) << whole.error();

  CommandResult submitted = As("bob", "submit " + spec("poisoned", 3, 1));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const std::string job_id = LastLine(submitted.output);
  auto progressed = cluster_->WaitForJob(
      job_id,
      [](const v1::Job& job) {
        return job.state() != v1::PENDING &&
               (job.state() != v1::RUNNING || job.latest_checkpoint_step() >= 80);
      },
      60);
  ASSERT_TRUE(progressed.ok()) << progressed.status();
  ASSERT_EQ(progressed->state(), v1::RUNNING) << "the job must still run";
  // Frozen, so that no newer checkpoint is recorded while the recorded one is replaced.
  std::vector<pid_t> pids = cluster_->RankProcesses(job_id);
  ASSERT_EQ(pids.size(), 2u);
  for (pid_t pid : pids) kill(pid, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto frozen = cluster_->WaitForJob(job_id, [](const v1::Job&) { return true; }, 5);
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  const int64_t recorded = frozen->latest_checkpoint_step();
  const std::string name = absl::StrFormat("step-%08d.safetensors", recorded);
  const std::string target = part + "/poisoned/" + name;
  ASSERT_TRUE(Exists(target)) << target;
  const std::string alices_file = ReadAll(root_ + "/alice/a/" + name);
  ASSERT_FALSE(alices_file.empty());
  std::ofstream(target, std::ios::binary | std::ios::trunc) << alices_file;
  for (pid_t pid : pids) kill(pid, SIGKILL);

  auto job = cluster_->WaitForEnd(job_id, 120);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->error();
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_EQ(job->progress(0).parameter_checksum(), whole.progress(0).parameter_checksum())
      << "bob's restart went on from its own parameters, not alice's";
  const std::string events = Notes(job_id);
  EXPECT_NE(events.find(target + " is not a checkpoint of this job"), std::string::npos)
      << events;
  EXPECT_NE(events.find(absl::StrCat("checkpoint of step ", recorded, " not written")),
            std::string::npos)
      << events;
  EXPECT_EQ(ReadAll(target), alices_file) << "the foreign file is never replaced";
}

}  // namespace
}  // namespace mptrain::testing
