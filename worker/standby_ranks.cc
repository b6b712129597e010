#include "worker/standby_ranks.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "spdlog/spdlog.h"
#include "worker/rank_launcher.h"

namespace mptrain {

StandbyRanks::StandbyRanks(Launch launch, Clock now_ms)
    : launch_(std::move(launch)), now_ms_(std::move(now_ms)), launcher_([this] { LauncherLoop(); }) {}

StandbyRanks::~StandbyRanks() {
  KillAll();
  {
    std::lock_guard<std::mutex> lock(mu_);
    exiting_ = true;
  }
  changed_.notify_all();
  // The daemon has stopped every rank by now (a handed standby is a rank): the thread that
  // forked them may end.
  launcher_.join();
  std::map<int, Standby> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(standbys_);
  }
  for (auto& [slot, standby] : left) close(standby.control_fd);
  // Their logs' destructors wait for the pipes to close: the processes were killed above.
}

void StandbyRanks::Ensure(int slot) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_ || exiting_) return;
  requests_.push_back(slot);
  const uint64_t ticket = ++requested_;
  changed_.notify_all();
  changed_.wait(lock, [&] { return served_ >= ticket || exiting_; });
}

void StandbyRanks::LauncherLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [&] { return exiting_ || !requests_.empty(); });
    if (exiting_) break;
    const int slot = requests_.front();
    requests_.pop_front();
    StartLocked(slot);
    ++served_;
    changed_.notify_all();
  }
}

void StandbyRanks::StartLocked(int slot) {
  if (stopping_ || standbys_.count(slot) > 0) return;
  if (deaths_[slot] >= kMaxStandbyDeaths) return;  // Said once, when the last one died.
  // The daemon's end of the control socket is close-on-exec (no other child inherits it); the
  // standby's end becomes its stdin. A socket, not a pipe, so that handing a job to a standby
  // that has just died fails with EPIPE (MSG_NOSIGNAL) instead of a SIGPIPE to the daemon.
  int control[2] = {-1, -1};
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, control) != 0) {
    spdlog::warn("no warm rank process for slot {}: socketpair: {}", slot, std::strerror(errno));
    return;
  }
  int output[2] = {-1, -1};
  if (pipe2(output, O_CLOEXEC) != 0) {
    spdlog::warn("no warm rank process for slot {}: pipe: {}", slot, std::strerror(errno));
    close(control[0]);
    close(control[1]);
    return;
  }
  absl::StatusOr<pid_t> pid = launch_(slot, control[1], output[1]);
  close(control[1]);
  close(output[1]);
  if (!pid.ok()) {
    spdlog::warn("no warm rank process for slot {}: {}", slot, pid.status().ToString());
    close(control[0]);
    close(output[0]);
    ++deaths_[slot];
    return;
  }
  Standby standby;
  standby.pid = *pid;
  standby.control_fd = control[0];
  standby.log = std::make_shared<RankLogTap>(output[0]);
  standby.started_ms = now_ms_();
  standbys_[slot] = std::move(standby);
  spdlog::debug("warm rank process for slot {}: pid {}", slot, *pid);
}

std::optional<StandbyRanks::Handed> StandbyRanks::Hand(int slot,
                                                       const std::string& assignment_file) {
  Standby standby;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = standbys_.find(slot);
    if (it == standbys_.end()) return std::nullopt;
    standby = std::move(it->second);
    standbys_.erase(it);
  }
  // One line, then end of file: the standby reads until EOF, so a partial write cannot be
  // taken for a whole path.
  const std::string line = assignment_file + "\n";
  size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = send(standby.control_fd, line.data() + sent, line.size() - sent,
                           MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  const int send_error = errno;
  if (sent < line.size()) {
    // It died (not reaped yet: the daemon reaps and forgets a standby under the same lock as
    // it hands one a job, so the pid is still its own) or will never read: start cold.
    RankLauncher::Signal(standby.pid, SIGKILL);
    close(standby.control_fd);
    spdlog::warn("warm rank process {} of slot {} did not take its job ({}): starting the rank "
                 "in a new process",
                 standby.pid, slot, std::strerror(send_error));
    return std::nullopt;
  }
  close(standby.control_fd);
  Handed handed;
  handed.pid = standby.pid;
  handed.log = std::move(standby.log);
  handed.warm_for_ms = now_ms_() - standby.started_ms;
  std::lock_guard<std::mutex> lock(mu_);
  deaths_[slot] = 0;
  return handed;
}

bool StandbyRanks::Forget(pid_t pid, int exit_code, int term_signal) {
  std::shared_ptr<RankLogTap> log;  // Destroyed outside the lock (it joins its reader).
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = standbys_.begin();
    while (it != standbys_.end() && it->second.pid != pid) ++it;
    if (it == standbys_.end()) return false;
    const int slot = it->first;
    close(it->second.control_fd);
    log = std::move(it->second.log);
    standbys_.erase(it);
    if (stopping_) return true;
    const int deaths = ++deaths_[slot];
    spdlog::warn("warm rank process {} of slot {} exited before any job ({} {}){}", pid, slot,
                 term_signal != 0 ? "signal" : "code", term_signal != 0 ? term_signal : exit_code,
                 deaths >= kMaxStandbyDeaths
                     ? ": no more for this slot, its ranks start in new processes"
                     : "");
  }
  return true;
}

void StandbyRanks::Renew() {
  std::map<int, Standby> renewed;  // Their logs are destroyed outside the lock.
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Out of the map first: no job is handed to one being killed, and their deaths are not
    // counted against their slots (the reaper's Forget does not find them).
    renewed.swap(standbys_);
    for (auto& [slot, standby] : renewed) {
      RankLauncher::Signal(standby.pid, SIGKILL);
      close(standby.control_fd);
    }
  }
}

void StandbyRanks::KillAll() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  for (auto& [slot, standby] : standbys_) RankLauncher::Signal(standby.pid, SIGKILL);
}

int StandbyRanks::Count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(standbys_.size());
}

}  // namespace mptrain
