// Faults on real processes: killed, stopped and cancelled ranks, killed worker daemons, and
// restarts from checkpoints. After each, no rank process of the job may be left and the
// workers must take the next job.

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/local_cluster.h"

namespace mptrain::testing {
namespace {

using Clock = std::chrono::steady_clock;

// A CPU job that runs far longer than any test: it ends only by a fault or a cancel.
std::string LongJobSpec(int world_size, const std::string& extra = "") {
  return WriteSpec(absl::StrCat("long", world_size), absl::StrCat(R"({
    "name": "long", "world_size": )", world_size, R"(, "device": "cpu",
    "model": {"input_dim": 64, "hidden_dims": [64], "output_dim": 8},
    "data": {"synthetic": {"seed": 1}},
    "micro_batch_size": 32, "accumulation_steps": 2, "steps": 100000000,
    "optimizer": {"lr": 0.001}, "telemetry_every": 100)", extra, "}"));
}

// Waits until every rank reported at least `step` (or the job left RUNNING).
absl::StatusOr<v1::Job> WaitForStep(LocalCluster& cluster, const std::string& job_id,
                                    int64_t step, int64_t checkpoint_step = 0) {
  return cluster.WaitForJob(
      job_id,
      [step, checkpoint_step](const v1::Job& job) {
        // PENDING: queued, or waiting for the previous job's ranks to leave their slots.
        if (job.state() == v1::PENDING) return false;
        if (job.state() != v1::RUNNING) return true;
        for (const auto& progress : job.progress()) {
          if (progress.step() < step) return false;
        }
        return job.latest_checkpoint_step() >= checkpoint_step;
      },
      60);
}

// Waits up to `timeout_s` for every rank process of the job to be gone.
bool NoRankProcessesWithin(const LocalCluster& cluster, const std::string& job_id,
                           double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  while (Clock::now() < deadline) {
    if (cluster.RankProcesses(job_id).empty()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cluster.RankProcesses(job_id).empty();
}

void ExpectWorkersTakeTheNextJob(LocalCluster& cluster) {
  CommandResult next =
      cluster.Trainctl("submit " + RunfilePath("examples/seed_cpu.json") + " --wait");
  EXPECT_EQ(next.exit_code, 0) << "the workers must accept new jobs:\n" << next.output;
}

class KillRank : public ::testing::TestWithParam<int> {};

TEST_P(KillRank, FailsNamingRankAndSignal_AndLeavesNoProcess) {
  const int world_size = GetParam();
  LocalCluster::Options options;
  options.heartbeat_timeout_s = 3;
  options.slots_per_worker = world_size / 2;
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  const std::string job_id = cluster.Submit( LongJobSpec(world_size));
  // Rank 0 is the victim: it is the rank that writes a line per telemetry step (every 100
  // steps here), so its log shows how far it got. Killed once it has written a few.
  auto running = cluster.WaitForJob(
      job_id,
      [](const v1::Job& job) {
        return job.state() != v1::PENDING &&
               (job.state() != v1::RUNNING || job.latest_telemetry().step() >= 300);
      },
      60);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING);
  const int64_t reported_step = running->latest_telemetry().step();
  const int victim = 0;
  std::vector<pid_t> pids = cluster.RankProcesses(job_id, victim);
  ASSERT_EQ(pids.size(), 1u);
  const auto killed_at = Clock::now();
  kill(pids[0], SIGKILL);
  auto job = cluster.WaitForEnd(job_id, options.heartbeat_timeout_s + 5);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_EQ(job->error().find(absl::StrCat("rank ", victim, " on worker")), 0u) << job->error();
  EXPECT_NE(job->error().find("signal 9"), std::string::npos) << job->error();
  EXPECT_TRUE(NoRankProcessesWithin(cluster, job_id, 5));
  RecordProperty("seconds_to_failed",
                 std::to_string(std::chrono::duration<double>(Clock::now() - killed_at).count()));
  // Its output, shipped by its worker, with no shell on that worker: the status points there.
  CommandResult status = cluster.Trainctl("status " + job_id);
  EXPECT_NE(status.output.find(absl::StrCat("logs:       trainctl logs ", job_id, " --rank ",
                                            victim)),
            std::string::npos)
      << status.output;
  // `trainctl logs` shows the killed rank's last lines: its start, and its step lines up to
  // (at least) the step the coordinator had from it when it was killed.
  CommandResult logs = cluster.Trainctl(absl::StrCat("logs ", job_id, " --rank ", victim));
  EXPECT_EQ(logs.exit_code, 0) << logs.output;
  const std::string prefix = absl::StrCat("[", job_id, "/rank", victim, "] ");
  EXPECT_NE(logs.output.find(absl::StrCat(prefix, "rank ", victim, "/", world_size,
                                          " on cpu device")),
            std::string::npos)
      << logs.output;
  EXPECT_NE(logs.output.find(absl::StrFormat("%sstep %6d loss ", prefix, reported_step)),
            std::string::npos)
      << "no line of step " << reported_step << " in:\n" << logs.output;
  int64_t last_logged_step = -1;
  const size_t last = logs.output.rfind(prefix + "step ");
  if (last != std::string::npos) {
    last_logged_step = std::strtoll(logs.output.c_str() + last + prefix.size() + 5, nullptr, 10);
  }
  EXPECT_GE(last_logged_step, reported_step) << "the log must run up to the kill:\n"
                                              << logs.output;
  RecordProperty("last_logged_step", std::to_string(last_logged_step));
  // The other ranks ended too (their job failed): their logs are complete, so --follow returns.
  const int survivor = world_size - 1;
  CommandResult followed =
      cluster.Trainctl(absl::StrCat("logs ", job_id, " --rank ", survivor, " --follow"));
  EXPECT_EQ(followed.exit_code, 0) << followed.output;
  EXPECT_NE(followed.output.find(absl::StrCat("[", job_id, "/rank", survivor, "] rank ", survivor,
                                              "/", world_size)),
            std::string::npos)
      << followed.output;
  ExpectWorkersTakeTheNextJob(cluster);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, KillRank, ::testing::Values(2, 4));

class KillWorkerDaemon : public ::testing::TestWithParam<int> {};

TEST_P(KillWorkerDaemon, FailsWithinHeartbeatTimeout_AndLeavesNoProcess) {
  const int world_size = GetParam();
  LocalCluster::Options options;
  options.heartbeat_timeout_s = 2;
  options.workers = 3;  // One spare: the survivors must take the next job.
  options.slots_per_worker = world_size / 2;
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  const std::string job_id = cluster.Submit( LongJobSpec(world_size));
  auto running = WaitForStep(cluster, job_id, 1);
  ASSERT_TRUE(running.ok());
  const std::string lost_worker = running->placement(world_size - 1).worker_id();
  const int index = lost_worker[1] - '0';  // Workers are named w0, w1, ...
  const auto killed_at = Clock::now();
  kill(cluster.worker_pid(index), SIGKILL);
  auto job = cluster.WaitForEnd(job_id, options.heartbeat_timeout_s + 5);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_LT(Clock::now() - killed_at, std::chrono::seconds(int(options.heartbeat_timeout_s) + 5));
  // Its ranks die with the daemon; the error names them, from whichever report came first:
  // the lost worker, or the rank exit seen by the coordinator's peers.
  EXPECT_NE(job->error().find(lost_worker), std::string::npos) << job->error();
  EXPECT_TRUE(NoRankProcessesWithin(cluster, job_id, 5)) << "no orphan rank processes";
  ExpectWorkersTakeTheNextJob(cluster);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, KillWorkerDaemon, ::testing::Values(2, 4));

TEST(Faults, StoppedRank_IsDetectedByProgressTimeout_AndTheOthersAbort) {
  LocalCluster cluster({});
  ASSERT_TRUE(cluster.Start().ok());
  const std::string job_id =
      cluster.Submit( LongJobSpec(2, R"(, "progress_timeout_s": 3)"));
  ASSERT_TRUE(WaitForStep(cluster, job_id, 1).ok());
  std::vector<pid_t> pids = cluster.RankProcesses(job_id, 1);
  ASSERT_EQ(pids.size(), 1u);
  kill(pids[0], SIGSTOP);
  auto job = cluster.WaitForEnd(job_id, 3 + 5);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_EQ(job->error().find("rank 1 on worker"), 0u) << job->error();
  EXPECT_NE(job->error().find("stopped responding"), std::string::npos) << job->error();
  // The stopped rank takes SIGKILL after the grace period; the other rank stops at once.
  EXPECT_TRUE(NoRankProcessesWithin(cluster, job_id, 8));
  ExpectWorkersTakeTheNextJob(cluster);
}

TEST(Faults, StoppedRank_CollectiveTimeout_FailsTheJobNamingThePair) {
  LocalCluster::Options options;
  options.heartbeat_timeout_s = 3;
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  // The progress timeout is far away: only the collective timeout can catch the stopped rank.
  const std::string job_id = cluster.Submit(
      LongJobSpec(2, R"(, "progress_timeout_s": 300, "collective_timeout_s": 2)"));
  ASSERT_TRUE(WaitForStep(cluster, job_id, 1).ok());
  std::vector<pid_t> pids = cluster.RankProcesses(job_id, 1);
  ASSERT_EQ(pids.size(), 1u);
  const auto stopped_at = Clock::now();
  kill(pids[0], SIGSTOP);
  // Rank 0 gives up after 2 s; the coordinator waits up to the heartbeat timeout for a root
  // cause before failing the job with rank 0's error.
  auto job = cluster.WaitForEnd(job_id, 2 + options.heartbeat_timeout_s + 5);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_LT(Clock::now() - stopped_at,
            std::chrono::seconds(2 + int(options.heartbeat_timeout_s) + 5));
  EXPECT_NE(job->error().find("collective allreduce timed out after 2 s: rank 0 on "),
            std::string::npos)
      << job->error();
  EXPECT_NE(job->error().find("(127.0.0.1) waited for rank 1 on "), std::string::npos)
      << job->error();
  RecordProperty("job_error", job->error());
  EXPECT_TRUE(NoRankProcessesWithin(cluster, job_id, 8));
  ExpectWorkersTakeTheNextJob(cluster);
}

TEST(Faults, WorkerCutOffFromTheCoordinator_FencesItsRanksOnlyAfterTheFullTimeout) {
  LocalCluster::Options options;
  // The coordinator tells its workers this timeout at registration: they fence after it (and
  // heartbeat every 1.3 s).
  options.heartbeat_timeout_s = 4;
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  const std::string job_id = cluster.Submit(LongJobSpec(2));
  ASSERT_TRUE(WaitForStep(cluster, job_id, 1).ok());
  const std::vector<pid_t> ranks = cluster.RankProcesses(job_id);
  ASSERT_EQ(ranks.size(), 2u);

  // A short silence (a quick coordinator restart): the ranks keep running and the job goes on.
  kill(cluster.coordinator_pid(), SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(1'000));
  kill(cluster.coordinator_pid(), SIGCONT);
  auto before = cluster.WaitForJob(job_id, [](const v1::Job&) { return true; }, 10);
  ASSERT_TRUE(before.ok()) << before.status();
  auto advanced = WaitForStep(cluster, job_id, before->progress(0).step() + 1);
  ASSERT_TRUE(advanced.ok()) << advanced.status();
  EXPECT_EQ(advanced->state(), v1::RUNNING);
  EXPECT_EQ(cluster.RankProcesses(job_id), ranks) << "a short silence must not stop ranks";

  // A long one: the workers stop their ranks once the fence timeout has passed, not before.
  const auto cut_at = Clock::now();
  kill(cluster.coordinator_pid(), SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(1'500));
  EXPECT_EQ(cluster.RankProcesses(job_id).size(), 2u) << "fenced before the timeout";
  // 4 s of silence, then SIGTERM (the ranks' abort ends their wait for the coordinator, or the
  // SIGKILL 3 s later does).
  EXPECT_TRUE(NoRankProcessesWithin(cluster, job_id, 4 + 3 + 3));
  RecordProperty("seconds_to_fenced",
                 std::to_string(std::chrono::duration<double>(Clock::now() - cut_at).count()));
  kill(cluster.coordinator_pid(), SIGCONT);
  // Back in contact, the workers report the exits: the job ends, and they take the next one.
  auto job = cluster.WaitForEnd(job_id, 30);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::FAILED) << job->error();
  ExpectWorkersTakeTheNextJob(cluster);
}

TEST(Faults, CancelMidJob_StopsAllRanksWithinFiveSeconds) {
  LocalCluster cluster({});
  ASSERT_TRUE(cluster.Start().ok());
  const std::string job_id = cluster.Submit( LongJobSpec(2));
  ASSERT_TRUE(WaitForStep(cluster, job_id, 1).ok());
  const auto start = Clock::now();
  CommandResult cancelled = cluster.Trainctl("cancel " + job_id);
  EXPECT_EQ(cancelled.exit_code, 0) << cancelled.output;
  EXPECT_NE(cancelled.output.find("CANCELLED"), std::string::npos);
  EXPECT_TRUE(NoRankProcessesWithin(cluster, job_id, 5));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(cluster.Trainctl("cancel " + job_id).exit_code, 1) << "already ended";
  ExpectWorkersTakeTheNextJob(cluster);
}

// The training part of the restarted job: SGD with momentum and MSE, or (issue 13) AdamW with
// a warm-up + cosine schedule and cross-entropy, whose moments and step count must come back
// from the checkpoint.
class RestartFromCheckpoint : public ::testing::TestWithParam<const char*> {};

TEST_P(RestartFromCheckpoint, EndsBitIdenticalToAnUninterruptedRun) {
  LocalCluster cluster({});
  ASSERT_TRUE(cluster.Start().ok());
  const std::string dir = OutputPartOf("alice");  // Where alice's jobs may write.
  auto spec = [&](const std::string& name) {
    return WriteSpec(name, absl::StrCat(R"({
      "name": ")", name, R"(", "world_size": 2, "device": "cpu",
      "model": {"input_dim": 256, "hidden_dims": [256, 256], "output_dim": 16},
      "data": {"synthetic": {"seed": 4}}, "micro_batch_size": 64, "accumulation_steps": 2,
      "steps": 300, )", GetParam(), R"(,
      "loss_scaler": {"growth_interval": 40}, "telemetry_every": 10,
      "checkpoint_every": 100, "checkpoint_dir": ")", dir, "/", name, R"(",
      "max_restarts": 1, "output_checkpoint": ")", dir, "/", name, R"(.safetensors"})"));
  };
  RunCommand("rm -rf " + dir + "/whole* " + dir + "/restarted* && mkdir -p " + dir + "/whole " +
             dir + "/restarted");  // A rerun finds the last run's outputs otherwise.

  CommandResult whole = cluster.Trainctl("submit " + spec("whole") + " --wait");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;

  const std::string job_id = cluster.Submit(spec("restarted"));
  auto progressed = WaitForStep(cluster, job_id, 130, /*checkpoint_step=*/100);
  ASSERT_TRUE(progressed.ok()) << progressed.status();
  ASSERT_EQ(progressed->state(), v1::RUNNING) << "the job must still run when the rank is killed";
  std::vector<pid_t> pids = cluster.RankProcesses(job_id, 1);
  ASSERT_EQ(pids.size(), 1u);
  kill(pids[0], SIGKILL);
  auto job = cluster.WaitForEnd(job_id, 60);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->error();
  EXPECT_EQ(job->restarts(), 1);
  ASSERT_EQ(job->failures_size(), 1);
  EXPECT_NE(job->failures(0).find("rank 1"), std::string::npos) << job->failures(0);
  EXPECT_GE(job->latest_checkpoint_step(), 100);

  // The files differ in their metadata (the job id); the parameters must be bit-identical.
  auto reference = cluster.WaitForEnd(LastLine(whole.output), 10);
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_EQ(job->progress(0).parameter_checksum(), reference->progress(0).parameter_checksum())
      << "final parameters must be bit-identical";
  CommandResult status = cluster.Trainctl("status " + job_id);
  EXPECT_NE(status.output.find("restarts:   1"), std::string::npos) << status.output;
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, RestartFromCheckpoint,
    ::testing::Values(R"("optimizer": {"lr": 0.01, "momentum": 0.9, "weight_decay": 0.001})",
                      R"("optimizer": {"kind": "adamw", "lr": 0.001, "weight_decay": 0.01},
                         "lr_schedule": {"kind": "warmup_cosine", "warmup_steps": 20,
                                         "min_lr": 0.0001},
                         "loss": "cross_entropy", "label_smoothing": 0.1)"));

// The checkpoint the coordinator recorded is gone from rank 0's disk when the job restarts:
// rank 0 resumes from the job's newest older checkpoint instead, and the job still ends
// bit-identical to an uninterrupted run (its restart is not spent on a missing file).
TEST(Faults, RecordedCheckpointDeleted_RestartResumesFromAnOlderOne_BitIdentical) {
  LocalCluster cluster({});
  ASSERT_TRUE(cluster.Start().ok());
  const std::string dir = OutputPartOf("alice");  // Where alice's jobs may write.
  auto spec = [&](const std::string& name) {
    return WriteSpec(name, absl::StrCat(R"({
      "name": ")", name, R"(", "world_size": 2, "device": "cpu",
      "model": {"input_dim": 64, "hidden_dims": [64], "output_dim": 8},
      "data": {"synthetic": {"seed": 6}}, "micro_batch_size": 16, "accumulation_steps": 2,
      "steps": 800, "optimizer": {"lr": 0.01, "momentum": 0.9}, "telemetry_every": 10,
      "checkpoint_every": 40, "keep_checkpoints": -1, "max_restarts": 1,
      "checkpoint_dir": ")", dir, "/", name, R"("})"));
  };
  RunCommand("rm -rf " + dir + "/fallback* && mkdir -p " + dir + "/fallback_whole " + dir +
             "/fallback_restarted");
  CommandResult whole = cluster.Trainctl("submit " + spec("fallback_whole") + " --wait");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;

  const std::string job_id = cluster.Submit(spec("fallback_restarted"));
  auto progressed = WaitForStep(cluster, job_id, 90, /*checkpoint_step=*/80);
  ASSERT_TRUE(progressed.ok()) << progressed.status();
  ASSERT_EQ(progressed->state(), v1::RUNNING) << "the job must still run";
  // Frozen, so that no newer checkpoint is recorded while the recorded one is removed.
  std::vector<pid_t> pids = cluster.RankProcesses(job_id);
  ASSERT_EQ(pids.size(), 2u);
  for (pid_t pid : pids) kill(pid, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto frozen = WaitForStep(cluster, job_id, 0);
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  const int64_t recorded = frozen->latest_checkpoint_step();
  ASSERT_GE(recorded, 80);
  const std::string recorded_file = absl::StrFormat("%s/fallback_restarted/step-%08d.safetensors",
                                                    dir, recorded);
  ASSERT_EQ(std::remove(recorded_file.c_str()), 0) << recorded_file;
  for (pid_t pid : pids) kill(pid, SIGKILL);
  auto job = cluster.WaitForEnd(job_id, 120);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->error();
  EXPECT_EQ(job->restarts(), 1);
  auto reference = cluster.WaitForEnd(LastLine(whole.output), 10);
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_EQ(job->progress(0).parameter_checksum(), reference->progress(0).parameter_checksum())
      << "final parameters must be bit-identical";
}

TEST(Faults, WorkerDaemonSigterm_StopsItsRanksDeregistersAndExitsCleanly) {
  LocalCluster::Options options;
  options.workers = 3;  // One spare: the others take the next job.
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  const std::string job_id = cluster.Submit(LongJobSpec(2));
  auto running = WaitForStep(cluster, job_id, 1);
  ASSERT_TRUE(running.ok());
  const std::string leaving = running->placement(1).worker_id();
  const int index = leaving[1] - '0';
  kill(cluster.worker_pid(index), SIGTERM);
  EXPECT_EQ(cluster.WaitForWorkerExit(index, 10), 0) << "the daemon exits cleanly";
  auto job = cluster.WaitForEnd(job_id, 5);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_NE(job->error().find(leaving + " (127.0.0.1) left: the daemon was asked to stop"),
            std::string::npos)
      << job->error();
  EXPECT_NE(job->error().find("rank 1"), std::string::npos) << job->error();
  EXPECT_TRUE(NoRankProcessesWithin(cluster, job_id, 5));
  CommandResult workers = cluster.Trainctl("--output=json workers");
  EXPECT_NE(workers.output.find("\"LOST\""), std::string::npos) << workers.output;
  ExpectWorkersTakeTheNextJob(cluster);
}

}  // namespace
}  // namespace mptrain::testing
