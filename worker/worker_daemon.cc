#include "worker/worker_daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/rpc_limits.h"
#include "common/secrets.h"
#include "spdlog/spdlog.h"
#include "worker/rank_launcher.h"
#include "worker/register_backoff.h"
#include "worker/start_check.h"

namespace mptrain {
namespace {

// Long: a poll is answered as soon as this worker's assignments change (the coordinator wakes
// exactly the polls a change concerns), so the wait only bounds how often an idle worker asks.
constexpr int64_t kPollWaitMs = 20'000;
constexpr auto kRpcDeadline = std::chrono::seconds(10);
constexpr size_t kMaxUnreportedExits = 10'000;
constexpr int64_t kFenceCheckMs = 100;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t RandomIncarnation() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device() ^ static_cast<uint64_t>(getpid());
}

// Owner-only, created fresh: the file carries the rank's secret.
absl::Status WriteAssignmentFile(const std::string& path, const v1::Assignment& assignment) {
  std::string bytes;
  if (!assignment.SerializeToString(&bytes)) {
    return absl::InternalError("cannot serialize the assignment");
  }
  std::remove(path.c_str());  // A leftover of a crashed daemon with the same work dir.
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", strerror(errno)));
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      close(fd);
      std::remove(path.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", strerror(error)));
    }
    written += static_cast<size_t>(n);
  }
  close(fd);
  return absl::OkStatus();
}

std::string Key(const v1::Assignment& assignment) {
  return absl::StrCat(assignment.job_id(), "/", assignment.rank(), "/", assignment.attempt());
}

void SleepUnless(const std::atomic<bool>* stop, int64_t ms) {
  for (int64_t slept = 0; slept < ms && !stop->load(); slept += 50) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

WorkerDaemon::WorkerDaemon(WorkerOptions options,
                           std::shared_ptr<v1::WorkerControl::StubInterface> stub)
    : options_(std::move(options)),
      link_(std::move(stub), options_.fresh_stub),
      incarnation_(RandomIncarnation()),
      registration_nonce_(RandomSecret()),
      fence_(options_.fence_after_ms, NowMs()) {
  if (options_.warm_ranks) {
    standbys_ = std::make_unique<StandbyRanks>(
        [this](int slot, int input_fd, int output_fd) {
          return LaunchStandby(slot, input_fd, output_fd);
        },
        NowMs, options_.reuse_ranks);
  }
}

WorkerDaemon::~WorkerDaemon() { StopAll(); }

std::string WorkerDaemon::CurrentHost() const {
  std::lock_guard<std::mutex> lock(address_mu_);
  return options_.host;
}

void WorkerDaemon::Readdress() {
  if (!options_.choose_host || !options_.rank_env_for) return;
  absl::StatusOr<std::string> host = options_.choose_host();
  if (!host.ok() || *host == CurrentHost()) return;  // Unreachable now: keep the last one.
  absl::StatusOr<std::vector<std::string>> rank_env = options_.rank_env_for(*host);
  if (!rank_env.ok()) {
    spdlog::warn("cannot advertise {} ({}); keeping {}", *host, rank_env.status().ToString(),
                 CurrentHost());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(address_mu_);
    spdlog::warn("this machine's address changed: advertising {} instead of {}", *host,
                 options_.host);
    options_.host = *host;
    options_.rank_env = std::move(*rank_env);
  }
  registration_nonce_ = RandomSecret();  // Not a retry of the registration under the old one.
  if (standbys_ != nullptr) {  // Started with the old address: replaced.
    standbys_->Renew();
    std::vector<int> idle;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int slot = 0; slot < options_.slots; ++slot) {
        bool busy = false;
        for (const auto& [key, running] : running_) {
          busy = busy || running.assignment.device_index() == slot;
        }
        if (!busy) idle.push_back(slot);
      }
    }
    for (int slot : idle) standbys_->Ensure(slot);
  }
}

absl::Status WorkerDaemon::Register(const std::atomic<bool>* stop) {
  Readdress();
  v1::RegisterWorkerRequest request;
  {
    std::lock_guard<std::mutex> lock(address_mu_);
    request.set_host(options_.host);
  }
  request.set_device(options_.device);
  request.set_slots(options_.slots);
  *request.mutable_devices() = {options_.devices.begin(), options_.devices.end()};
  request.set_incarnation(incarnation_);
  request.set_name(options_.name);
  *request.mutable_data_roots() = {options_.data_roots.begin(), options_.data_roots.end()};
  *request.mutable_output_roots() = {options_.output_roots.begin(), options_.output_roots.end()};
  request.set_memory_bytes(options_.memory_bytes);
  request.set_machine_id(options_.machine_id);
  request.set_registration_nonce(registration_nonce_);
  RegisterBackoff backoff;
  std::mt19937_64 random(std::random_device{}());
  while (!stop->load()) {
    v1::RegisterWorkerResponse response;
    CoordinatorLink::Call call(&link_, std::chrono::system_clock::now() + kRpcDeadline);
    grpc::Status status = call->RegisterWorker(call.context(), request, &response);
    if (call.SendAgain(status)) continue;  // A newer connection works: at once, on it.
    if (status.ok()) {
      fence_.UseCoordinatorTimeout(response.heartbeat_timeout_ms());
      Contact();
      std::lock_guard<std::mutex> lock(mu_);
      worker_id_ = response.worker_id();
      worker_secret_ = response.worker_secret();
      heartbeat_interval_ms_ = response.heartbeat_interval_ms();
      usage_->interval_ms.store(std::max<int64_t>(100, heartbeat_interval_ms_));
      must_register_.store(false);
      spdlog::info(
          "registered as {} (incarnation {:x}), {} {} slot(s), heartbeat every {} ms, {}",
          worker_id_, incarnation_, options_.slots, v1::DeviceKind_Name(options_.device),
          heartbeat_interval_ms_,
          fence_.enabled() ? absl::StrCat("ranks stopped after ", fence_.fence_after_ms(),
                                          " ms without the coordinator")
                           : std::string("self-fencing off"));
      return absl::OkStatus();
    }
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      // Retrying cannot fix a bad flag or a wrong token.
      return FromGrpcStatus(status);
    }
    int64_t wait_ms = 0;
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      // The coordinator is full: wait at least as long as it asks, longer after each refusal.
      int64_t retry_after_ms = 0;
      const auto& trailers = call.context()->GetServerTrailingMetadata();
      if (auto it = trailers.find(kRetryAfterMetadataKey); it != trailers.end()) {
        if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()),
                              &retry_after_ms)) {
          retry_after_ms = 0;
        }
      }
      wait_ms = backoff.AfterRefusal(retry_after_ms,
                                     std::uniform_real_distribution<double>(0, 1)(random));
    } else {
      wait_ms = backoff.AfterFailure();
    }
    spdlog::warn("cannot register with {}: {}; retrying in {} ms", options_.coordinator,
                 status.error_message(), wait_ms);
    SleepUnless(stop, wait_ms);
  }
  return absl::CancelledError("stopped before registering");
}

void WorkerDaemon::Deregister(const std::string& reason) {
  v1::DeregisterWorkerRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.set_worker_id(worker_id_);
    request.set_worker_secret(worker_secret_);
  }
  request.set_incarnation(incarnation_);
  request.set_reason(reason);
  v1::DeregisterWorkerResponse response;
  const grpc::Status status = link_.Send(
      std::chrono::seconds(3), [&](CoordinatorLink::Stub* stub, grpc::ClientContext* context) {
        return stub->DeregisterWorker(context, request, &response);
      });
  if (!status.ok()) spdlog::warn("could not deregister: {}", status.error_message());
}

void WorkerDaemon::SendHeartbeat(const CoordinatorLink::Endpoint& endpoint,
                                 v1::HeartbeatRequest request) {
  // Sent without waiting for the answer: a slow one (a loaded machine) still counts when it
  // comes, within the timeout, and a stuck one does not hold back the next, an interval later.
  struct Call {
    int64_t sent_ms = 0;
    grpc::ClientContext context;
    v1::HeartbeatRequest request;
    v1::HeartbeatResponse response;
  };
  auto call = std::make_shared<Call>();
  call->request = std::move(request);
  call->sent_ms = NowMs();
  const int64_t timeout_ms = fence_.enabled() ? fence_.fence_after_ms() : 10'000;
  call->context.set_deadline(std::chrono::system_clock::now() +
                             std::chrono::milliseconds(timeout_ms));
  {
    std::lock_guard<std::mutex> lock(heartbeats_mu_);
    heartbeats_in_flight_.insert(&call->context);
  }
  endpoint.stub->async()->Heartbeat(
      &call->context, &call->request, &call->response,
      [this, call, endpoint](grpc::Status status) {
        // This connection works (even a refusal is an answer): if it is a newer one, every
        // call uses it from now on.
        if (CoordinatorLink::IsAnswer(status)) link_.Answered(endpoint);
        OnHeartbeatAnswer(call->request, call->sent_ms, status);
        std::lock_guard<std::mutex> lock(heartbeats_mu_);
        heartbeats_in_flight_.erase(&call->context);
        heartbeats_done_.notify_all();
      });
}

void WorkerDaemon::OnHeartbeatAnswer(const v1::HeartbeatRequest& request, int64_t sent_ms,
                                     const grpc::Status& status) {
  if (status.ok()) {
    // As of when it was sent: a late answer must not push the fence past the moment the
    // coordinator may have declared this worker lost.
    Contact(sent_ms);
    return;
  }
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT && request.has_usage()) {
    // The usage broke a bound the coordinator keeps (a reader's bug, or another version's
    // bounds): the heartbeat still counted, the usage was not kept.
    Contact(sent_ms);
    std::lock_guard<std::mutex> lock(heartbeats_mu_);
    if (!usage_refusal_logged_) {
      usage_refusal_logged_ = true;
      spdlog::warn("the coordinator refuses this worker's usage readings: {}",
                   status.error_message());
    }
    return;
  }
  if (status.error_code() == grpc::StatusCode::NOT_FOUND ||
      status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    std::lock_guard<std::mutex> lock(mu_);
    // A late answer for the registration before the current one (the worker registered again
    // meanwhile) changes nothing. (It made the loop stop heartbeating until the next poll
    // ended, and the coordinator declared a healthy worker lost.) Decided under the lock that
    // Register's answer is recorded under, so that none lands in between.
    if (request.worker_id() != worker_id_) return;
    spdlog::warn("coordinator no longer knows this worker ({}); registering again",
                 status.error_message());
    must_register_.store(true);
    if (poll_context_ != nullptr) poll_context_->TryCancel();  // Register now, not after it.
    return;
  }
  spdlog::warn("heartbeat failed: {}", status.error_message());
}

void WorkerDaemon::HeartbeatLoop(const std::atomic<bool>* stop) {
  CoordinatorLink::Endpoint endpoint = link_.Current();
  auto last_fresh = std::chrono::steady_clock::now();
  uint64_t in_use = endpoint.generation;  // The connection in use, as last seen here.
  auto replaced = std::chrono::steady_clock::time_point{};
  while (!stop->load() && !quit_.load()) {
    const auto started = std::chrono::steady_clock::now();
    int64_t interval_ms;
    v1::HeartbeatRequest request;
    {
      std::lock_guard<std::mutex> lock(mu_);
      interval_ms = heartbeat_interval_ms_;
      // Often enough that a healthy link never looks silent for the fence timeout.
      if (fence_.enabled()) {
        interval_ms = std::min(interval_ms, std::max<int64_t>(100, fence_.fence_after_ms() / 3));
      }
      request.set_worker_id(worker_id_);
      request.set_worker_secret(worker_secret_);
    }
    request.set_incarnation(incarnation_);
    AttachUsage(&request);
    if (!must_register_.load()) {
      // No answer for two intervals: the connection may be one whose retransmissions have
      // backed off for about as long as a network blip lasted; the next heartbeats go on a
      // candidate connection (a new one at most once an interval), which gets through as soon
      // as the link is back and then replaces it for every call (coordinator_link.h).
      const bool silent = fence_.SilentMs(NowMs()) > 2 * interval_ms;
      // A connection that has just replaced the one in use answered: the fence, counting an
      // answer as of its sending, may still look silent for a while; no new candidate then
      // (it would replace this one again and cancel the calls just moved to it).
      if (const uint64_t current = link_.Current().generation; current != in_use) {
        in_use = current;
        replaced = started;
      }
      const bool just_replaced = started - replaced < std::chrono::milliseconds(2 * interval_ms);
      if (silent && !just_replaced &&
          started - last_fresh >= std::chrono::milliseconds(interval_ms)) {
        last_fresh = started;
        // (A call in flight on the replaced stub keeps its channel: its context holds it.)
        endpoint = link_.Candidate();
      } else if (!silent || just_replaced) {
        endpoint = link_.Current();
      }
      SendHeartbeat(endpoint, std::move(request));
    }
    // On a fixed cadence: the next one an interval after this one started, not after its answer.
    const int64_t spent_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::steady_clock::now() - started)
                                 .count();
    SleepUnless(stop, std::max<int64_t>(0, interval_ms - spent_ms));
  }
  // Heartbeats still in flight answer into this object: ended and waited for.
  {
    std::unique_lock<std::mutex> lock(heartbeats_mu_);
    for (grpc::ClientContext* context : heartbeats_in_flight_) context->TryCancel();
    heartbeats_done_.wait(lock, [this] { return heartbeats_in_flight_.empty(); });
  }
  // Stopping: the main loop may be inside a long-poll; end it now.
  std::lock_guard<std::mutex> lock(mu_);
  if (poll_context_ != nullptr) poll_context_->TryCancel();
}

void WorkerDaemon::UsageLoop(std::shared_ptr<UsageSlot> slot,
                             std::function<v1::WorkerUsage()> read_usage) {
  std::unique_lock<std::mutex> lock(slot->mu);
  while (!slot->stop) {
    lock.unlock();
    const int64_t started = NowMs();
    v1::WorkerUsage usage = read_usage();
    const int64_t read_ms = NowMs();
    lock.lock();
    slot->usage = std::move(usage);
    slot->read_ms = read_ms;
    const int64_t wait_ms = std::max<int64_t>(0, started + slot->interval_ms.load() - read_ms);
    slot->changed.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return slot->stop; });
  }
  slot->ended = true;
  slot->changed.notify_all();
}

void WorkerDaemon::StopUsage() {
  std::unique_lock<std::mutex> lock(usage_->mu);
  usage_->stop = true;
  usage_->changed.notify_all();
  if (!options_.read_usage) return;
  if (!usage_->changed.wait_for(lock, std::chrono::seconds(2), [&] { return usage_->ended; })) {
    spdlog::warn("a usage reading has not returned for 2 s (a driver call that hangs?); not "
                 "waiting for it");
  }
}

void WorkerDaemon::AttachUsage(v1::HeartbeatRequest* request) {
  std::lock_guard<std::mutex> lock(usage_->mu);
  const int64_t age_ms = NowMs() - usage_->read_ms;
  if (!usage_->usage || age_ms > kMaxUsageAgeMs) return;
  *request->mutable_usage() = *usage_->usage;
  request->set_usage_age_ms(std::max<int64_t>(0, age_ms));
}

void WorkerDaemon::ReaperLoop(const std::atomic<bool>* stop) {
  while (!stop->load() && !quit_.load()) {
    ReapOnce();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void WorkerDaemon::ReapOnce() {
  std::vector<std::pair<RunningRank, ExitedChild>> finished;
  {
    // Reaped, matched and forgotten under one lock with StartRank's handing a job to a
    // standby: a pid seen here is never one that StartRank is about to use or has just used.
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<ExitedChild> exited = RankLauncher::Reap();
    for (const ExitedChild& child : exited) {
      auto it = running_.begin();
      while (it != running_.end() && it->second.pid != child.pid) ++it;
      if (it != running_.end()) {
        finished.emplace_back(it->second, child);
        running_.erase(it);
      }
      // A rank may be a warm process the pool lent it: forgotten there too.
      if (standbys_ != nullptr) standbys_->Forget(child.pid, child.exit_code, child.term_signal);
    }
    // Warm processes whose rank ended cleanly without the process ending: the rank has exited
    // (code 0) and the process is its slot's standby again, before the coordinator hears that
    // the slot is free, so that the slot's next job finds it warm.
    if (standbys_ != nullptr) {
      for (pid_t pid : standbys_->Done()) {
        auto it = running_.begin();
        while (it != running_.end() && it->second.pid != pid) ++it;
        if (it == running_.end()) continue;
        ExitedChild child;
        child.pid = pid;
        finished.emplace_back(it->second, child);
        running_.erase(it);
        standbys_->Return(pid);
      }
    }
    // The slot's next warm process starts now that this rank's memory (device memory included)
    // is released, and before the coordinator hears that the slot is free (ReportExit below),
    // so that the slot's next job finds it there; never beside a rank running on that slot.
    if (standbys_ != nullptr) {
      for (const auto& [rank, child] : finished) {
        const int slot = rank.assignment.device_index();
        bool busy = false;
        for (const auto& [key, running] : running_) {
          busy = busy || running.assignment.device_index() == slot;
        }
        if (!busy) standbys_->Ensure(slot);
      }
    }
    EscalateStopsLocked();
  }
  for (const auto& [rank, child] : finished) {
    ReportExit(rank, child.exit_code, child.term_signal);
    // The rank read it at start; it holds the rank's secret, so it does not outlive the rank.
    std::remove(AssignmentFile(rank.assignment).c_str());
  }
}

void WorkerDaemon::EscalateStopsLocked() {
  for (auto& [key, rank] : running_) {
    if (rank.stop_sent_ms > 0 && NowMs() - rank.stop_sent_ms > options_.stop_grace_ms) {
      spdlog::warn("rank {} (pid {}) ignored SIGTERM; sending SIGKILL", key, rank.pid);
      RankLauncher::Signal(rank.pid, SIGKILL);
      rank.stop_sent_ms = NowMs() + 3'600'000;  // Once.
    }
  }
}

void WorkerDaemon::Contact(int64_t as_of_ms) {
  const int64_t silent_ms = fence_.OnContact(as_of_ms >= 0 ? as_of_ms : NowMs());
  if (silent_ms > 0) {
    spdlog::info("the coordinator answers again after {:.1f} s of silence (ranks were fenced); "
                 "it is told of their exits and its answers say what runs here",
                 silent_ms / 1000.0);
  }
}

void WorkerDaemon::FenceLoop(const std::atomic<bool>* stop) {
  while (!stop->load() && !quit_.load()) {
    if (fence_.ShouldFence(NowMs())) {
      std::lock_guard<std::mutex> lock(mu_);
      int stopping = 0;
      // Told to the coordinator with the exit once it answers again: the job's cause (with a
      // one-way loss the coordinator never declares this worker lost, and the fenced rank's
      // exit looked like a crash).
      const std::string reason = absl::StrFormat(
          "its worker self-fenced: no answer from the coordinator for %.1f s",
          fence_.SilentMs(NowMs()) / 1000.0);
      for (auto& [key, rank] : running_) {
        if (rank.stop_sent_ms > 0) continue;
        RankLauncher::Signal(rank.pid, SIGTERM);
        rank.stop_sent_ms = NowMs();
        rank.stop_reason = reason;
        ++stopping;
      }
      spdlog::log(
          stopping > 0 ? spdlog::level::warn : spdlog::level::info,
          "no answer from the coordinator {} for {:.1f} s (the heartbeat timeout after which it "
          "declares this worker lost and fails its jobs): self-fencing, stopping {} rank(s) "
          "(SIGTERM, SIGKILL after {} ms); still trying to reach it",
          options_.coordinator, fence_.SilentMs(NowMs()) / 1000.0, stopping,
          options_.stop_grace_ms);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      EscalateStopsLocked();
    }
    SleepUnless(stop, kFenceCheckMs);
  }
}

std::string WorkerDaemon::AssignmentFile(const v1::Assignment& assignment) const {
  return absl::StrCat(options_.work_dir, "/", assignment.job_id(), "-rank", assignment.rank(),
                      "-attempt", assignment.attempt(), ".assignment");
}

void WorkerDaemon::ReportExit(const RunningRank& rank, int exit_code, int term_signal) {
  const v1::Assignment& assignment = rank.assignment;
  if (rank.log) {
    // Its last lines first: once the exit is reported, its log counts as complete.
    rank.log->WaitClosed(2'000);
    ShipLog(assignment, rank.log.get());
  }
  if (term_signal != 0) {
    spdlog::log(rank.stop_sent_ms > 0 ? spdlog::level::info : spdlog::level::warn,
                "rank {} of {} (pid {}) ended by signal {}", assignment.rank(),
                assignment.job_id(), rank.pid, term_signal);
  } else {
    spdlog::log(exit_code == 0 ? spdlog::level::info : spdlog::level::warn,
                "rank {} of {} (pid {}) exited with code {}", assignment.rank(),
                assignment.job_id(), rank.pid, exit_code);
  }
  Exit exit{assignment, exit_code, term_signal, rank.stop_reason};
  if (!SendExit(exit)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (unreported_exits_.size() < kMaxUnreportedExits) unreported_exits_.push_back(exit);
    // The main loop reports it before its next poll: end the one in flight (it may wait 20 s
    // for assignments while the coordinator waits for this exit to name a job's failure).
    exits_waiting_ = true;
    if (poll_context_ != nullptr) poll_context_->TryCancel();
  }
}

void WorkerDaemon::ReportPendingExits() {
  std::vector<Exit> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(unreported_exits_);
    exits_waiting_ = false;  // (Those put back below, unreachable, wait for the next round.)
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    if (!SendExit(pending[i])) {
      // Still unreachable: keep this one and the rest for the next try.
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t j = i; j < pending.size() && unreported_exits_.size() < kMaxUnreportedExits;
           ++j) {
        unreported_exits_.push_back(pending[j]);
      }
      return;
    }
  }
}

bool WorkerDaemon::SendExit(const Exit& exit) {
  const v1::Assignment& assignment = exit.assignment;
  const int exit_code = exit.exit_code;
  const int term_signal = exit.term_signal;
  v1::ReportRankExitRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.set_worker_id(worker_id_);
    request.set_worker_secret(worker_secret_);
  }
  request.set_job_id(assignment.job_id());
  request.set_rank(assignment.rank());
  request.set_attempt(assignment.attempt());
  request.set_exit_code(exit_code);
  request.set_term_signal(term_signal);
  request.set_rank_secret(assignment.rank_secret());
  request.set_stop_reason(exit.stop_reason);
  v1::ReportRankExitResponse response;
  const grpc::Status status =
      link_.Send(kRpcDeadline, [&](CoordinatorLink::Stub* stub, grpc::ClientContext* context) {
        return stub->ReportRankExit(context, request, &response);
      });
  if (!status.ok()) spdlog::warn("could not report the exit: {}", status.error_message());
  if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED &&
      ++exit.denied < kMaxDeniedExitReports) {
    // A restarted coordinator does not know this registration: register again, then report
    // it (with the rank's secret) — the coordinator may be waiting for this very rank.
    must_register_.store(true);
    return false;
  }
  // Not answered (unreachable, or still superseded after every try): kept and reported again.
  return CoordinatorLink::IsAnswer(status);
}

std::vector<std::string> WorkerDaemon::RankArgv() const {
  std::lock_guard<std::mutex> lock(address_mu_);
  std::vector<std::string> argv = {options_.rank_executable,
                                   "--coordinator=" + options_.coordinator,
                                   "--host=" + options_.host};
  for (const std::string& flag : TlsFlagsFor(options_.security)) argv.push_back(flag);
  for (const std::string& root : options_.data_roots) argv.push_back("--data_root=" + root);
  for (const std::string& root : options_.output_roots) argv.push_back("--output_root=" + root);
  return argv;
}

std::vector<std::string> WorkerDaemon::RankEnv() const {
  // CPU ranks share the cores of this machine: give each its share for BLAS threads.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::string> env = {
      absl::StrCat("OPENBLAS_NUM_THREADS=", std::max(1, cores / std::max(1, options_.slots)))};
  {
    std::lock_guard<std::mutex> lock(address_mu_);
    env.insert(env.end(), options_.rank_env.begin(), options_.rank_env.end());
  }
  // NCCL connects every peer while the communicator forms (which a rank may give up on), not
  // inside a later collective (which it could not): backends/cuda/nccl_collective.h. Set here,
  // before the rank process has threads, rather than by setenv there; a user's value is kept.
  if (getenv("NCCL_RUNTIME_CONNECT") == nullptr) env.push_back("NCCL_RUNTIME_CONNECT=0");
  // The environment, unlike a command line, is readable only by the rank's own user.
  if (!options_.security.token.empty()) env.push_back("MPTRAIN_TOKEN=" + options_.security.token);
  return env;
}

absl::StatusOr<pid_t> WorkerDaemon::LaunchStandby(int slot, int input_fd, int output_fd) const {
  std::vector<std::string> argv = RankArgv();
  argv.push_back(absl::StrCat("--standby_slot=", slot));
  argv.push_back(options_.device == v1::CUDA ? "--device=cuda" : "--device=cpu");
  if (options_.reuse_ranks) argv.push_back("--standby_reuse");
  return RankLauncher::Launch(argv, RankEnv(), output_fd, input_fd);
}

bool WorkerDaemon::StartRank(const v1::Assignment& assignment) {
  const std::string key = Key(assignment);
  // The job id names files in the work directory, and each rank holds a slot: what the
  // coordinator asks is checked against what this daemon has and runs.
  absl::Status allowed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<const v1::Assignment*> running;
    for (const auto& [unused, rank] : running_) running.push_back(&rank.assignment);
    allowed = CheckStart(assignment, options_.slots, running);
  }
  if (absl::IsAlreadyExists(allowed)) {
    spdlog::warn("ignoring a repeated start: {}", std::string(allowed.message()));
    return true;
  }
  if (absl::IsUnavailable(allowed)) {
    // Not listed as running, so the coordinator hands it again with its next answer.
    spdlog::debug("rank {} of {} waits: {}", assignment.rank(), assignment.job_id(),
                  std::string(allowed.message()));
    return false;
  }
  if (!allowed.ok()) {
    spdlog::error("refusing an assignment: {}", std::string(allowed.message()));
    RunningRank refused{assignment, 0, 0};
    ReportExit(refused, 126, 0);
    return true;
  }
  const std::string file = AssignmentFile(assignment);
  if (absl::Status written = WriteAssignmentFile(file, assignment); !written.ok()) {
    spdlog::error("{}", written.ToString());
    RunningRank failed{assignment, 0, 0};
    ReportExit(failed, 126, 0);
    return true;
  }
  if (standbys_ != nullptr) {
    // Under the lock ReapOnce holds: the rank is in running_ before its exit can be reaped.
    std::lock_guard<std::mutex> lock(mu_);
    if (std::optional<StandbyRanks::Handed> handed = standbys_->Hand(
            assignment.device_index(), file, assignment.owner(), assignment.job_id())) {
      spdlog::info("rank {}/{} of {} (attempt {}) on device {}: handed to the warm rank process "
                   "{} (warm for {} ms{})",
                   assignment.rank(), assignment.world_size(), assignment.job_id(),
                   assignment.attempt(), assignment.device_index(), handed->pid,
                   handed->warm_for_ms,
                   handed->jobs_before == 0
                       ? std::string()
                       : absl::StrCat("; reused: it ran ", handed->jobs_before,
                                      " job(s) before, the last ", handed->last_job));
      running_[key] = RunningRank{assignment, handed->pid, 0, std::move(handed->log)};
      return true;
    }
  }
  std::vector<std::string> argv = RankArgv();
  argv.push_back("--run_rank=" + file);
  // Its stdout and stderr through one pipe: copied to this daemon's log and shipped to the
  // coordinator (trainctl logs).
  int pipe_fds[2] = {-1, -1};
  std::shared_ptr<RankLogTap> log;
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    spdlog::warn("no pipe for rank {}'s output ({}): it goes to this daemon's log only", key,
                 std::strerror(errno));
    pipe_fds[0] = pipe_fds[1] = -1;
  }
  auto pid = RankLauncher::Launch(argv, RankEnv(), pipe_fds[1]);
  if (pipe_fds[1] >= 0) close(pipe_fds[1]);
  if (pipe_fds[0] >= 0) {
    if (pid.ok()) {
      log = std::make_shared<RankLogTap>(pipe_fds[0]);
    } else {
      close(pipe_fds[0]);
    }
  }
  if (!pid.ok()) {
    std::remove(file.c_str());
    spdlog::error("cannot start rank {} of {}: {}", assignment.rank(), assignment.job_id(),
                  pid.status().ToString());
    RunningRank failed{assignment, 0, 0};
    ReportExit(failed, 126, 0);
    return true;
  }
  spdlog::info("started rank {}/{} of {} (attempt {}) on device {} as pid {}",
               assignment.rank(), assignment.world_size(), assignment.job_id(),
               assignment.attempt(), assignment.device_index(), *pid);
  std::lock_guard<std::mutex> lock(mu_);
  running_[key] = RunningRank{assignment, *pid, 0, std::move(log)};
  return true;
}

void WorkerDaemon::CheckAddress() {
  if (!options_.choose_host || !options_.is_local_address || must_register_.load()) return;
  const std::string current = CurrentHost();
  // Only once the advertised address is no longer this machine's: another route towards the
  // coordinator (a VPN, IPv6 appearing) leaves it valid, and leaving would fail every job here.
  if (options_.is_local_address(current)) return;
  absl::StatusOr<std::string> host = options_.choose_host();
  if (!host.ok() || *host == current) return;
  if (options_.rank_env_for && !options_.rank_env_for(*host).ok()) return;  // Not usable either.
  spdlog::warn("this machine's address changed ({} is not its own any more, {} is): leaving, "
               "then registering again",
               current, *host);
  address_changed_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  if (poll_context_ != nullptr) poll_context_->TryCancel();
}

void WorkerDaemon::LogLoop(const std::atomic<bool>* stop) {
  auto address_checked = std::chrono::steady_clock::now();
  while (!stop->load() && !quit_.load()) {
    // Every few seconds, here rather than on the heartbeat thread (a lookup of the
    // coordinator's name may take seconds): has this machine been renumbered?
    if (std::chrono::steady_clock::now() - address_checked >= std::chrono::seconds(5)) {
      address_checked = std::chrono::steady_clock::now();
      CheckAddress();
    }
    std::vector<std::pair<v1::Assignment, std::shared_ptr<RankLogTap>>> taps;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [key, rank] : running_) {
        if (rank.log) taps.emplace_back(rank.assignment, rank.log);
      }
    }
    for (const auto& [assignment, log] : taps) ShipLog(assignment, log.get());
    SleepUnless(stop, 1'000);
  }
}

void WorkerDaemon::ShipLog(const v1::Assignment& assignment, RankLogTap* log) {
  constexpr size_t kChunkBytes = 64 << 10;
  for (int chunks = 0; chunks < 8; ++chunks) {  // At most 512 KiB a round.
    RankLogTap::Chunk chunk = log->Take(kChunkBytes);
    if (chunk.data.empty()) return;
    v1::ReportRankLogRequest request;
    {
      std::lock_guard<std::mutex> lock(mu_);
      request.set_worker_id(worker_id_);
      request.set_worker_secret(worker_secret_);
    }
    request.set_job_id(assignment.job_id());
    request.set_rank(assignment.rank());
    request.set_attempt(assignment.attempt());
    request.set_offset(chunk.offset);
    request.set_data(std::move(chunk.data));
    // The chunk is taken from the tap: sent again on a newer connection rather than lost (the
    // last lines of a rank, shipped just before its exit, are the ones its user needs).
    v1::ReportRankLogResponse response;
    const grpc::Status status =
        link_.Send(kRpcDeadline, [&](CoordinatorLink::Stub* stub, grpc::ClientContext* context) {
          return stub->ReportRankLog(context, request, &response);
        });
    if (!status.ok()) {
      spdlog::debug("could not send rank {}'s output: {}", assignment.rank(),
                    status.error_message());
      return;
    }
  }
}

void WorkerDaemon::RequestStop(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = running_.find(key);
  if (it == running_.end() || it->second.stop_sent_ms > 0) return;
  spdlog::info("stopping rank {} (pid {}): its job ended", key, it->second.pid);
  RankLauncher::Signal(it->second.pid, SIGTERM);
  it->second.stop_sent_ms = NowMs();
}

void WorkerDaemon::StopAll() {
  if (standbys_ != nullptr) standbys_->KillAll();  // No job to lose; reaped below.
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, rank] : running_) {
      RankLauncher::Signal(rank.pid, SIGTERM);
      if (rank.stop_sent_ms == 0) rank.stop_sent_ms = NowMs();
    }
  }
  const int64_t deadline = NowMs() + options_.stop_grace_ms + 2'000;
  while (NowMs() < deadline) {
    ReapOnce();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (running_.empty() && (standbys_ == nullptr || standbys_->Count() == 0)) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, rank] : running_) RankLauncher::Signal(rank.pid, SIGKILL);
}

absl::Status WorkerDaemon::PollOnce() {
  v1::PollAssignmentsRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.set_worker_id(worker_id_);
    for (const auto& [key, rank] : running_) {
      v1::Assignment* running = request.add_running();
      running->set_job_id(rank.assignment.job_id());
      running->set_rank(rank.assignment.rank());
      running->set_attempt(rank.assignment.attempt());
      running->set_device_index(rank.assignment.device_index());
      running->set_rank_secret(rank.assignment.rank_secret());
    }
  }
  request.set_incarnation(incarnation_);
  request.set_wait_ms(kPollWaitMs);
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.set_worker_secret(worker_secret_);
  }
  v1::PollAssignmentsResponse response;
  CoordinatorLink::Call call(&link_, std::chrono::system_clock::now() + kRpcDeadline +
                                         std::chrono::milliseconds(kPollWaitMs));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (exits_waiting_) return absl::OkStatus();  // Queued since the loop reported: first.
    poll_context_ = call.context();
  }
  grpc::Status status = call->PollAssignments(call.context(), request, &response);
  bool exits_waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    poll_context_ = nullptr;
    exits_waiting = exits_waiting_;
  }
  // Ended on purpose: a newer connection works, or an exit waits to be reported. Again, now.
  if (call.SendAgain(status) ||
      (status.error_code() == grpc::StatusCode::CANCELLED && exits_waiting)) {
    return absl::OkStatus();
  }
  if (!status.ok()) return FromGrpcStatus(status);
  Contact();
  for (const v1::Assignment& stop : response.stop()) RequestStop(Key(stop));
  bool waiting = false;
  for (const v1::Assignment& start : response.start()) waiting |= !StartRank(start);
  // A start waiting for its slot comes back in the next answer at once: poll again only after
  // a moment, rather than in a loop while the slot's previous rank exits.
  if (waiting) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  return absl::OkStatus();
}

absl::Status WorkerDaemon::Run(const std::atomic<bool>* stop) {
  if (absl::Status status = Register(stop); !status.ok()) return status;
  if (standbys_ != nullptr) {
    for (int slot = 0; slot < options_.slots; ++slot) standbys_->Ensure(slot);
  }
  absl::Status failure;
  std::thread heartbeat([&] { HeartbeatLoop(stop); });
  std::thread reaper([&] { ReaperLoop(stop); });
  std::thread fence([&] { FenceLoop(stop); });
  std::thread logs([&] { LogLoop(stop); });
  if (options_.read_usage) std::thread(UsageLoop, usage_, options_.read_usage).detach();
  while (!stop->load()) {
    if (address_changed_.exchange(false)) {
      Deregister("this machine's address changed");
      must_register_.store(true);
    }
    if (must_register_.load()) {
      // The ranks keep running: a restarted coordinator re-adopts the ones it still wants
      // (the next poll lists them, with their secrets as proof), and the poll's stop list ends
      // the others. Only a full fence timeout without the coordinator stops them (FenceLoop).
      if (absl::Status registered = Register(stop); !registered.ok()) {
        // Stopped, or refused for good (a bad flag, a token the coordinator no longer takes):
        // the other loops end too (they waited for `stop` alone, and the daemon hung here).
        if (registered.code() != absl::StatusCode::kCancelled) failure = registered;
        quit_.store(true);
        break;
      }
    }
    // Exits the coordinator could not be told of while it was away, before the poll that lists
    // what runs here.
    ReportPendingExits();
    absl::Status status = PollOnce();
    if (status.code() == absl::StatusCode::kNotFound ||
        status.code() == absl::StatusCode::kPermissionDenied) {
      must_register_.store(true);
    } else if (!status.ok() && !must_register_.load()) {  // (Else ended to register now.)
      spdlog::warn("polling for assignments failed: {}", status.ToString());
      SleepUnless(stop, 500);
    }
  }
  heartbeat.join();
  reaper.join();
  fence.join();
  logs.join();
  StopUsage();
  spdlog::info("stopping: {} rank(s) running", running_.size());
  // Deregister first: the coordinator fails the jobs naming this worker as the cause, and
  // places nothing new here while the ranks stop.
  Deregister(failure.ok() ? "the daemon was asked to stop"
                          : "the daemon could not register again: " + failure.ToString());
  StopAll();
  return failure;
}

}  // namespace mptrain
