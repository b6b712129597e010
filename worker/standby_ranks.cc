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

StandbyRanks::StandbyRanks(Launch launch, Clock now_ms, bool reuse)
    : launch_(std::move(launch)),
      now_ms_(std::move(now_ms)),
      reuse_(reuse),
      launcher_([this] { LauncherLoop(); }) {}

void StandbyRanks::End(Standby& standby) {
  RankLauncher::Signal(standby.pid, SIGKILL);
  close(standby.control_fd);
  standby.control_fd = -1;
}

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
  std::map<pid_t, Standby> lent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(standbys_);
    lent.swap(lent_);
  }
  for (auto& [slot, standby] : left) close(standby.control_fd);
  for (auto& [pid, standby] : lent) close(standby.control_fd);
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
  standby.generation = generation_;
  standby.slot = slot;
  standbys_[slot] = std::move(standby);
  spdlog::debug("warm rank process for slot {}: pid {}", slot, *pid);
}

std::optional<StandbyRanks::Handed> StandbyRanks::Hand(int slot,
                                                       const std::string& assignment_file,
                                                       const std::string& owner,
                                                       const std::string& job_id) {
  Standby standby;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = standbys_.find(slot);
    if (it == standbys_.end()) return std::nullopt;
    standby = std::move(it->second);
    standbys_.erase(it);
  }
  if (standby.jobs > 0 && standby.owner != owner) {
    // Nothing of one principal's job is left in a process that runs another's: a fresh one.
    spdlog::info("warm rank process {} of slot {} ran a job of another principal: not reused "
                 "for {}; starting the rank in a new process",
                 standby.pid, slot, job_id);
    End(standby);
    return std::nullopt;  // Its log tap ends here, once the killed process has closed it.
  }
  // One line. Without reuse, then end of file: the standby reads until EOF, so a partial write
  // cannot be taken for a whole path. With reuse, the job's own output pipe rides with it, and
  // the socket stays open for the process's "done".
  const std::string line = assignment_file + "\n";
  int job_output[2] = {-1, -1};
  if (reuse_) {
    if (pipe2(job_output, O_CLOEXEC) != 0) {
      spdlog::warn("no pipe for the job of warm rank process {} ({}): starting the rank in a new "
                   "process",
                   standby.pid, std::strerror(errno));
      End(standby);
      return std::nullopt;
    }
  }
  size_t sent = 0;
  while (sent < line.size()) {
    ssize_t n = 0;
    if (sent == 0 && job_output[1] >= 0) {
      alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
      struct iovec io {const_cast<char*>(line.data()), line.size()};
      struct msghdr message {};
      message.msg_iov = &io;
      message.msg_iovlen = 1;
      message.msg_control = control;
      message.msg_controllen = sizeof(control);
      struct cmsghdr* header = CMSG_FIRSTHDR(&message);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(header), &job_output[1], sizeof(int));
      n = sendmsg(standby.control_fd, &message, MSG_NOSIGNAL);
    } else {
      n = send(standby.control_fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    }
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  const int send_error = errno;
  if (job_output[1] >= 0) close(job_output[1]);  // The rank holds it now (or nobody does).
  if (sent < line.size()) {
    // It died (not reaped yet: the daemon reaps and forgets a standby under the same lock as
    // it hands one a job, so the pid is still its own) or will never read: start cold.
    End(standby);
    if (job_output[0] >= 0) close(job_output[0]);
    spdlog::warn("warm rank process {} of slot {} did not take its job ({}): starting the rank "
                 "in a new process",
                 standby.pid, slot, std::strerror(send_error));
    return std::nullopt;
  }
  Handed handed;
  handed.pid = standby.pid;
  handed.warm_for_ms = now_ms_() - standby.started_ms;
  handed.jobs_before = standby.jobs;
  handed.last_job = standby.last_job;
  std::lock_guard<std::mutex> lock(mu_);
  deaths_[slot] = 0;
  if (!reuse_) {
    close(standby.control_fd);
    handed.log = std::move(standby.log);
    return handed;
  }
  handed.log = std::make_shared<RankLogTap>(job_output[0]);
  standby.jobs += 1;
  standby.owner = owner;
  standby.last_job = job_id;
  standby.answer.clear();
  lent_[standby.pid] = std::move(standby);
  return handed;
}

std::vector<pid_t> StandbyRanks::Done() {
  std::vector<pid_t> done;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [pid, standby] : lent_) {
    char buffer[64];
    const ssize_t got = recv(standby.control_fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (got <= 0) continue;  // Nothing yet, or it closed: its exit is reaped as a rank's.
    standby.answer.append(buffer, static_cast<size_t>(got));
    if (standby.answer == "done 0\n") {
      done.push_back(pid);
    } else if (standby.answer.size() >= sizeof("done 0\n") - 1) {
      // Not the protocol: the process is not trusted with another job (its rank ends with it).
      spdlog::warn("warm rank process {} answered {} bytes that are not \"done 0\": ending it",
                   pid, standby.answer.size());
      RankLauncher::Signal(pid, SIGKILL);
      standby.answer.clear();
    }
  }
  return done;
}

void StandbyRanks::Return(pid_t pid) {
  std::shared_ptr<RankLogTap> log;  // Destroyed outside the lock (it joins its reader).
  std::lock_guard<std::mutex> lock(mu_);
  auto it = lent_.find(pid);
  if (it == lent_.end()) return;
  Standby standby = std::move(it->second);
  lent_.erase(it);
  standby.answer.clear();
  if (stopping_ || standby.generation != generation_ || standbys_.count(standby.slot) > 0) {
    End(standby);
    log = std::move(standby.log);
    return;
  }
  standby.started_ms = now_ms_();
  const int slot = standby.slot;
  standbys_[slot] = std::move(standby);
}

bool StandbyRanks::Forget(pid_t pid, int exit_code, int term_signal) {
  std::shared_ptr<RankLogTap> log;  // Destroyed outside the lock (it joins its reader).
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto lent = lent_.find(pid); lent != lent_.end()) {
      // It ended while running a job (its rank's exit, reported by the daemon).
      close(lent->second.control_fd);
      log = std::move(lent->second.log);
      lent_.erase(lent);
      return true;
    }
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
    ++generation_;  // Those running a job now end after it instead of coming back.
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
