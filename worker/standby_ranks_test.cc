#include "worker/standby_ranks.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/ci_skip.h"
#include "worker/rank_launcher.h"

namespace mptrain {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Stands in for `worker --standby_slot=N`: says it is warm, reads its job's path from stdin
// until end of file, says what it got and exits (`script` changes what it does). Every pid it
// starts goes into `launched`, so that a test waits for its own children only.
StandbyRanks::Launch ShellStandby(std::string script, std::vector<pid_t>* launched) {
  return [script, launched](int slot, int input_fd, int output_fd) {
    absl::StatusOr<pid_t> pid = RankLauncher::Launch(
        {"/bin/sh", "-c", script, "standby", absl::StrCat(slot)}, {}, output_fd, input_fd);
    if (pid.ok()) launched->push_back(*pid);
    return pid;
  };
}

// Reaps what a test started (the pool kills its waiting standbys when destroyed).
class StandbyRanksTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (pid_t pid : launched_) waitpid(pid, nullptr, 0);
  }
  std::vector<pid_t> launched_;
};

const char kReadsItsJob[] = "echo warm slot $1; path=$(cat); echo \"slot $1 runs $path\"";

int WaitExit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string AllOutput(RankLogTap* log) {
  log->WaitClosed(5'000);
  return log->Take(1 << 20).data;
}

TEST_F(StandbyRanksTest, HandsTheAssignmentPathToTheSlotsStandby_WhichRunsItAndExits) {
    StandbyRanks standbys(ShellStandby(kReadsItsJob, &launched_), NowMs);
  standbys.Ensure(0);
  standbys.Ensure(1);
  standbys.Ensure(0);  // Already has one.
  EXPECT_EQ(static_cast<int>(launched_.size()), 2);
  EXPECT_EQ(standbys.Count(), 2);
  std::optional<StandbyRanks::Handed> handed = standbys.Hand(1, "/work/job-7-rank-1.pb");
  ASSERT_TRUE(handed.has_value());
  EXPECT_GT(handed->pid, 0);
  EXPECT_GE(handed->warm_for_ms, 0);
  EXPECT_EQ(WaitExit(handed->pid), 0);
  // Its output from the start, warm-up included, is the rank's log.
  EXPECT_EQ(AllOutput(handed->log.get()), "warm slot 1\nslot 1 runs /work/job-7-rank-1.pb\n");
  EXPECT_EQ(standbys.Count(), 1);  // Slot 0's is still waiting.
  EXPECT_FALSE(standbys.Hand(1, "/work/other.pb").has_value()) << "slot 1 has no standby now";
  standbys.Ensure(1);
  EXPECT_EQ(static_cast<int>(launched_.size()), 3);
}

// PR_SET_PDEATHSIG fires when the thread that forked a child ends: a standby asked for by a
// thread that has ended since (the daemon's reaper, joined at shutdown before the ranks are
// stopped) must live on, and so must the job it is then handed.
TEST_F(StandbyRanksTest, AStandbyOutlivesTheThreadThatAskedForIt) {
  StandbyRanks standbys(ShellStandby(kReadsItsJob, &launched_), NowMs);
  std::thread asker([&] { standbys.Ensure(0); });
  asker.join();
  // A parent-death signal would have been sent as the thread exited, before join returned: a
  // standby it killed fails Hand (EPIPE) or, dying meanwhile, exits by the signal (WaitExit).
  std::optional<StandbyRanks::Handed> handed = standbys.Hand(0, "/work/job-1-rank-0.pb");
  ASSERT_TRUE(handed.has_value()) << "the standby died with the thread that asked for it";
  EXPECT_EQ(WaitExit(handed->pid), 0);
  EXPECT_EQ(AllOutput(handed->log.get()), "warm slot 0\nslot 0 runs /work/job-1-rank-0.pb\n");
}

TEST_F(StandbyRanksTest, AStandbyThatDied_IsForgotten_AndHandingToItFailsWithoutSigpipe) {
    StandbyRanks standbys(ShellStandby("exit 3", &launched_), NowMs);
  standbys.Ensure(0);
  ASSERT_EQ(standbys.Count(), 1);
  // Not reaped yet: the daemon has not seen it die. Handing fails (EPIPE, not a SIGPIPE that
  // would end this process) and the caller starts the rank cold. Waits for its exit without
  // reaping it (WNOWAIT): the pool has not seen it die.
  ASSERT_EQ(launched_.size(), 1u);
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, launched_[0], &info, WEXITED | WNOWAIT), 0);
  ASSERT_EQ(info.si_status, 3);
  EXPECT_FALSE(standbys.Hand(0, std::string(1 << 20, 'x')).has_value());
  EXPECT_EQ(standbys.Count(), 0);
  EXPECT_FALSE(standbys.Forget(12345678, 0, 0)) << "not a standby's pid";
}

TEST_F(StandbyRanksTest, ASlotWhoseStandbysKeepDying_GetsNoMore) {
    StandbyRanks standbys(ShellStandby("exit 3", &launched_), NowMs);
  for (int round = 0; round < StandbyRanks::kMaxStandbyDeaths + 2; ++round) {
    standbys.Ensure(0);
    if (standbys.Count() == 0) break;
    // Each dies before any job; the daemon reaps it and tells the pool.
    const pid_t pid = launched_.back();
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(standbys.Forget(pid, WEXITSTATUS(status), 0));
  }
  EXPECT_EQ(static_cast<int>(launched_.size()), StandbyRanks::kMaxStandbyDeaths);
  standbys.Ensure(0);
  EXPECT_EQ(static_cast<int>(launched_.size()), StandbyRanks::kMaxStandbyDeaths);
  // Another slot is not affected.
  standbys.Ensure(1);
  EXPECT_EQ(static_cast<int>(launched_.size()), StandbyRanks::kMaxStandbyDeaths + 1);
}

TEST_F(StandbyRanksTest, KillAll_EndsTheWaitingOnes_AndNoMoreStart) {
    StandbyRanks standbys(ShellStandby(kReadsItsJob, &launched_), NowMs);
  standbys.Ensure(0);
  standbys.Ensure(1);
  standbys.KillAll();
  ASSERT_EQ(launched_.size(), 2u);
  for (pid_t pid : launched_) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status));
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
    EXPECT_TRUE(standbys.Forget(pid, 0, SIGKILL));
  }
  standbys.Ensure(0);
  EXPECT_EQ(static_cast<int>(launched_.size()), 2);
}

TEST_F(StandbyRanksTest, ALaunchThatFails_CountsAsADeath) {
  int launches = 0;
  StandbyRanks standbys(
      [&](int, int, int) -> absl::StatusOr<pid_t> {
        ++launches;
        return absl::InternalError("fork failed: out of memory");
      },
      NowMs);
  for (int i = 0; i < StandbyRanks::kMaxStandbyDeaths + 2; ++i) standbys.Ensure(0);
  EXPECT_EQ(launches, StandbyRanks::kMaxStandbyDeaths);
  EXPECT_EQ(standbys.Count(), 0);
}

// Renewed (the advertised address changed): the waiting standbys are killed, no job is handed
// to them meanwhile, their deaths do not count against their slots, and Ensure starts new ones.
TEST_F(StandbyRanksTest, Renew_KillsTheWaitingOnes_WithoutCountingTheirDeaths) {
  StandbyRanks standbys(ShellStandby(kReadsItsJob, &launched_), NowMs);
  standbys.Ensure(0);
  standbys.Ensure(1);
  ASSERT_EQ(launched_.size(), 2u);
  for (int round = 0; round < StandbyRanks::kMaxStandbyDeaths + 1; ++round) {
    const std::vector<pid_t> old(launched_.end() - 2, launched_.end());
    standbys.Renew();
    EXPECT_EQ(standbys.Count(), 0);
    EXPECT_FALSE(standbys.Hand(0, "/work/job.pb").has_value()) << "handed to a renewed one";
    for (pid_t pid : old) {
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
      EXPECT_FALSE(standbys.Forget(pid, 0, SIGKILL)) << "a renewed standby is no longer known";
    }
    standbys.Ensure(0);
    standbys.Ensure(1);
    ASSERT_EQ(launched_.size(), 2u * (round + 2)) << "renewals counted as deaths";
  }
  std::optional<StandbyRanks::Handed> handed = standbys.Hand(0, "/work/job-2-rank-0.pb");
  ASSERT_TRUE(handed.has_value());
  EXPECT_EQ(WaitExit(handed->pid), 0);
}

// Stands in for `worker --standby_slot=N --standby_reuse`, in Python (the shell cannot take a
// descriptor from a socket): says it is warm, then for each job reads "PATH\n" with the job's
// output pipe attached, writes to that pipe, closes it, and answers "done 0\n".
StandbyRanks::Launch ReusableStandby(std::vector<pid_t>* launched) {
  static const char kScript[] = R"(
import os, socket, sys
control = socket.socket(fileno=0)
print("warm slot", sys.argv[1], flush=True)
while True:
    data, fds, _, _ = socket.recv_fds(control, 4096, 1)
    if not data:
        sys.exit(0)
    os.write(fds[0], b"slot " + sys.argv[1].encode() + b" runs " + data)
    os.close(fds[0])
    print("between jobs", flush=True)
    control.sendall(b"done 0\n")
)";
  return [launched](int slot, int input_fd, int output_fd) {
    absl::StatusOr<pid_t> pid = RankLauncher::Launch(
        {"/usr/bin/python3", "-c", kScript, absl::StrCat(slot)}, {}, output_fd, input_fd);
    if (pid.ok()) launched->push_back(*pid);
    return pid;
  };
}

// Done arrives a while after the hand: polled as the daemon's reaper polls it.
std::vector<pid_t> WaitDone(StandbyRanks* standbys) {
  for (int i = 0; i < 500; ++i) {
    std::vector<pid_t> done = standbys->Done();
    if (!done.empty()) return done;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return {};
}

// A process whose job ended cleanly is its slot's standby again and takes the next job of the
// same principal: each job's log is its own; another principal's job is not given it.
TEST_F(StandbyRanksTest, Reuse_ADoneProcessTakesTheSlotsNextJobOfItsPrincipalOnly) {
  if (access("/usr/bin/python3", X_OK) != 0) {
    SKIP_OR_FAIL_UNDER_CI("needs /usr/bin/python3 (scripts/setup.sh installs it)");
  }
  StandbyRanks standbys(ReusableStandby(&launched_), NowMs, /*reuse=*/true);
  standbys.Ensure(0);
  ASSERT_EQ(launched_.size(), 1u);
  const pid_t pid = launched_[0];
  std::optional<StandbyRanks::Handed> first =
      standbys.Hand(0, "/work/job-1.pb", "alice", "job-0001");
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->pid, pid);
  EXPECT_EQ(first->jobs_before, 0);
  EXPECT_EQ(standbys.Count(), 0);
  EXPECT_EQ(WaitDone(&standbys), std::vector<pid_t>{pid});
  // Its job's lines only: the warm-up and between-job lines are the daemon's log's.
  EXPECT_EQ(AllOutput(first->log.get()), "slot 0 runs /work/job-1.pb\n");
  standbys.Return(pid);
  EXPECT_EQ(standbys.Count(), 1);

  std::optional<StandbyRanks::Handed> second =
      standbys.Hand(0, "/work/job-2.pb", "alice", "job-0002");
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->pid, pid) << "not the process that ran job-0001";
  EXPECT_EQ(second->jobs_before, 1);
  EXPECT_EQ(second->last_job, "job-0001");
  EXPECT_EQ(WaitDone(&standbys), std::vector<pid_t>{pid});
  EXPECT_EQ(AllOutput(second->log.get()), "slot 0 runs /work/job-2.pb\n");
  standbys.Return(pid);

  // Bob's job: alice's process is ended, not handed it; the caller starts the rank cold.
  EXPECT_FALSE(standbys.Hand(0, "/work/job-3.pb", "bob", "job-0003").has_value());
  EXPECT_EQ(standbys.Count(), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  launched_.clear();  // Reaped.
}

// A process that ran a job comes back only to a slot without a standby and only if it was
// started since the last Renew (the advertised address it was started with still holds).
TEST_F(StandbyRanksTest, Reuse_AProcessStartedBeforeRenew_EndsInsteadOfComingBack) {
  if (access("/usr/bin/python3", X_OK) != 0) {
    SKIP_OR_FAIL_UNDER_CI("needs /usr/bin/python3 (scripts/setup.sh installs it)");
  }
  StandbyRanks standbys(ReusableStandby(&launched_), NowMs, /*reuse=*/true);
  standbys.Ensure(0);
  std::optional<StandbyRanks::Handed> handed =
      standbys.Hand(0, "/work/job-1.pb", "alice", "job-0001");
  ASSERT_TRUE(handed.has_value());
  standbys.Renew();
  EXPECT_EQ(WaitDone(&standbys), std::vector<pid_t>{handed->pid});
  standbys.Return(handed->pid);
  EXPECT_EQ(standbys.Count(), 0);
  EXPECT_EQ(WaitExit(handed->pid), 128 + SIGKILL);
  launched_.clear();
}

}  // namespace
}  // namespace mptrain
