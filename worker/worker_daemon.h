#pragma once

// The worker daemon: registers with the coordinator, heartbeats, long-polls for assignments,
// runs one rank process per assigned slot and reports how each one ended.

#include <atomic>
#include <condition_variable>
#include <set>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/client_channel.h"
#include "proto/mptrain.grpc.pb.h"
#include "worker/coordinator_link.h"
#include "worker/rank_log.h"
#include "worker/self_fence.h"
#include "worker/standby_ranks.h"

namespace mptrain {

struct WorkerOptions {
  std::string coordinator;  // HOST:PORT
  v1::DeviceKind device = v1::CPU;
  int slots = 1;
  std::vector<v1::DeviceInfo> devices;
  std::string host = "127.0.0.1";  // Advertised to peers (collectives listen here).
  std::string name;                // Stable name; a restart registers a new incarnation.
  std::string work_dir;            // Assignment files (mode 0600: they hold rank secrets).
  std::string rank_executable;     // Started as `rank_executable --run_rank=FILE ...`.
  // Where ranks may read and write (resolved absolute directories), reported at registration
  // and passed to every rank, which checks each path of its spec against them.
  std::vector<std::string> data_roots;
  std::vector<std::string> output_roots;
  // How ranks reach the coordinator: TLS flags on their command line, the token in their
  // environment.
  ClientSecurity security;
  int64_t stop_grace_ms = 3'000;   // SIGTERM, then SIGKILL after this.
  // Host memory the CPU ranks can count on (worker/host_memory.h), reported so that jobs too
  // big for it are refused; and the machine, whose memory co-located workers share.
  int64_t memory_bytes = 0;
  std::string machine_id;
  // Self-fencing (worker/self_fence.h): with no successful heartbeat, poll or registration for
  // this long, the ranks are stopped. The coordinator's heartbeat timeout replaces it when the
  // registration answer carries one. 0 disables.
  int64_t fence_after_ms = 10'000;
  // Added to every rank's environment, "NAME=VALUE": NCCL's interface (NCCL_SOCKET_IFNAME) and
  // the gloo port range (MPTRAIN_GLOO_PORT_RANGE, from --port_range).
  std::vector<std::string> rank_env;
  // A warm rank process per slot (worker/standby_ranks.h): a job's rank then starts without
  // setting up its process and device. Each still runs one rank and exits.
  bool warm_ranks = true;
  // With warm_ranks: a warm process whose job ended cleanly is kept for the slot's next job of
  // the same principal (worker/standby_ranks.h), instead of a new one that takes seconds to
  // set up a GPU.
  bool reuse_ranks = true;
  // A stub on a connection of its own (null: the daemon's stub is used for ever). While the
  // coordinator is silent, heartbeats try such connections; the first answered one replaces
  // the daemon's for every call (worker/coordinator_link.h). After a network blip the old
  // connection's retransmissions have backed off for about as long as the blip lasted; a fresh
  // one gets through as soon as the link is back, before the coordinator's timeout runs out.
  std::function<std::shared_ptr<v1::WorkerControl::StubInterface>()> fresh_stub;
  // Chooses the advertised host again, every few seconds and before each registration; null
  // when --host fixed it. A machine renumbered while the daemon
  // ran (DHCP, a moved VM) re-registered under its old address, and every rank placed on it
  // failed to bind.
  std::function<absl::StatusOr<std::string>()> choose_host;
  // The ranks' environment for an advertised host (with choose_host).
  std::function<absl::StatusOr<std::vector<std::string>>(const std::string& host)> rank_env_for;
  // Whether an address is still one of this machine's (with choose_host).
  std::function<bool(const std::string& host)> is_local_address;
  // Reads this machine's usage (host memory, the GPUs: worker/device_usage.h), which every
  // heartbeat carries (HeartbeatRequest.usage). Called every heartbeat interval from a thread
  // of its own, never from the heartbeats': a driver call that hangs must not silence them
  // (the latest reading goes while it is younger than kMaxUsageAgeMs), nor hold back the
  // daemon's stop for more than 2 s (then the thread is left to end on its own: a copy of this
  // function may still be running after Run returned, so it must own what it uses). Null: none
  // is sent.
  std::function<v1::WorkerUsage()> read_usage;
};

class WorkerDaemon {
 public:
  WorkerDaemon(WorkerOptions options, std::shared_ptr<v1::WorkerControl::StubInterface> stub);
  ~WorkerDaemon();

  // Serves until *stop becomes true, then stops every rank and returns. Retries while the
  // coordinator is unreachable.
  absl::Status Run(const std::atomic<bool>* stop);

 private:
  struct RunningRank {
    v1::Assignment assignment;
    pid_t pid = 0;
    int64_t stop_sent_ms = 0;  // When SIGTERM was sent (0: not asked to stop).
    std::shared_ptr<RankLogTap> log;  // Its output, for the daemon's log and the coordinator.
    std::string stop_reason;  // Why, when the worker stopped it on its own (a self-fence).
  };

  absl::Status Register(const std::atomic<bool>* stop);
  absl::Status PollOnce();
  // False when the start waits for its slot (the coordinator hands it again).
  bool StartRank(const v1::Assignment& assignment);
  // What every rank process of this daemon runs with: its command line (before the flag that
  // says which rank it is) and its extra environment.
  std::vector<std::string> RankArgv() const;
  std::vector<std::string> RankEnv() const;
  // Before a registration: the address again (WorkerOptions::choose_host); warm ranks started
  // with the old one are replaced.
  void Readdress();
  // The advertised host as it is now (address_mu_).
  std::string CurrentHost() const;
  // options_.host and options_.rank_env change on a re-address; the standby launcher reads
  // them from its own thread.
  mutable std::mutex address_mu_;
  // Starts a warm rank process for `slot` (StandbyRanks::Launch).
  absl::StatusOr<pid_t> LaunchStandby(int slot, int input_fd, int output_fd) const;
  void RequestStop(const std::string& key);
  void StopAll();
  void HeartbeatLoop(const std::atomic<bool>* stop);
  // The usage thread's state, shared with it (it may outlive the daemon: see read_usage).
  struct UsageSlot {
    std::mutex mu;
    std::condition_variable changed;       // `stop` or `ended` set.
    std::optional<v1::WorkerUsage> usage;  // The latest reading.
    int64_t read_ms = 0;                   // When it was read (NowMs).
    std::atomic<int64_t> interval_ms{1'000};
    bool stop = false;
    bool ended = false;  // The thread has ended.
  };
  // Reads the usage (WorkerOptions::read_usage) every interval until the slot says stop.
  static void UsageLoop(std::shared_ptr<UsageSlot> slot,
                        std::function<v1::WorkerUsage()> read_usage);
  // Tells the usage thread to stop and waits for it a moment (not for a reading that hangs).
  void StopUsage();
  // The latest usage into `request`, unless none was read or it is older than
  // kMaxUsageAgeMs.
  void AttachUsage(v1::HeartbeatRequest* request);
  void ReaperLoop(const std::atomic<bool>* stop);
  // Sends each running rank's new output to the coordinator, every second.
  void LogLoop(const std::atomic<bool>* stop);
  // Sends what `rank`'s log holds now (best effort: a chunk the coordinator does not take is
  // dropped; its tail is what matters).
  void ShipLog(const v1::Assignment& assignment, RankLogTap* log);
  void ReapOnce();
  // SIGKILL to ranks that ignored SIGTERM for stop_grace_ms. Holds mu_.
  void EscalateStopsLocked();
  // Self-fencing: watches the time since the coordinator last answered and stops every rank
  // once it reaches the fence timeout (never blocked by an RPC).
  void FenceLoop(const std::atomic<bool>* stop);
  // A successful heartbeat, poll or registration, as of `as_of_ms` (default: now).
  void Contact(int64_t as_of_ms = -1);
  // Without --host: leaves and registers again once the advertised address is no longer this
  // machine's (renumbered), from the log loop every few seconds.
  void CheckAddress();
  // One heartbeat, answered on gRPC's thread (OnHeartbeatAnswer); tracked until then.
  void SendHeartbeat(const CoordinatorLink::Endpoint& endpoint, v1::HeartbeatRequest request);
  void OnHeartbeatAnswer(const v1::HeartbeatRequest& request, int64_t sent_ms,
                         const grpc::Status& status);
  struct Exit {
    v1::Assignment assignment;
    int exit_code = 0;
    int term_signal = 0;
    std::string stop_reason;  // RunningRank::stop_reason.
    // Answers PERMISSION_DENIED so far (this registration unknown to the coordinator: it
    // registers again and retries); kMaxDeniedExitReports of them and it is dropped.
    mutable int denied = 0;
  };
  static constexpr int kMaxDeniedExitReports = 5;
  // Reports a rank's end; one the coordinator could not be told of (unreachable) is kept and
  // reported again before the next poll.
  void ReportExit(const RunningRank& rank, int exit_code, int term_signal);
  bool SendExit(const Exit& exit);  // False when the coordinator was not reached.
  void ReportPendingExits();
  std::string AssignmentFile(const v1::Assignment& assignment) const;
  void Deregister(const std::string& reason);

  WorkerOptions options_;
  CoordinatorLink link_;  // Every call to the coordinator goes on it.
  const uint64_t incarnation_;
  // Private: makes a retried registration idempotent. A new one for a registration under a
  // new address (the coordinator answers a retry with the first answer: the old address).
  std::string registration_nonce_;
  std::mutex mu_;
  std::string worker_id_;
  std::string worker_secret_;
  int64_t heartbeat_interval_ms_ = 1'000;
  std::atomic<bool> must_register_{true};
  // Run ended on its own (a registration refused for good): the other loops end too.
  std::atomic<bool> quit_{false};
  // The heartbeat loop saw this machine's address change: the main loop leaves and registers
  // again under the new one (its old registration's ranks cannot bind there any more).
  std::atomic<bool> address_changed_{false};
  std::map<std::string, RunningRank> running_;  // "job/rank/attempt" -> process
  std::vector<Exit> unreported_exits_;           // Bounded (kMaxUnreportedExits).
  SelfFence fence_;
  std::mutex heartbeats_mu_;
  std::condition_variable heartbeats_done_;
  std::set<grpc::ClientContext*> heartbeats_in_flight_;
  // The long-poll in flight (a stop cancels it: it may otherwise wait 20 s).
  grpc::ClientContext* poll_context_ = nullptr;
  // Exits queued (unreported) since the main loop last reported them: it does so before
  // polling again (a queued exit ends the poll in flight).
  bool exits_waiting_ = false;
  std::unique_ptr<StandbyRanks> standbys_;  // Null without warm_ranks.
  const std::shared_ptr<UsageSlot> usage_ = std::make_shared<UsageSlot>();
  bool usage_refusal_logged_ = false;  // A refused usage is logged once (heartbeats_mu_).
};

}  // namespace mptrain
