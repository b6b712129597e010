// coordinator_load: a load benchmark for one coordinator. It simulates worker daemons with the
// real protocol (RegisterWorker; a Heartbeat at the interval the coordinator answers; exactly one
// PollAssignments long-poll outstanding per worker, re-issued when it returns) and a few users
// (SubmitJob of a job no worker can take, GetJob, ListJobs, a WatchJob that reads the snapshot
// and cancels, CancelJob), then prints the latency of every RPC kind and what the coordinator
// process used (CPU cores, threads, RSS, sampled once a second from /proc).
//
//   coordinator_load --coordinator 127.0.0.1:PORT --workers 10000 --duration_s 30
//                    [--coordinator_pid PID] [--tls_ca ca.pem ...] [--token_file worker.token
//                    --user_token_file user.token]
//
// Simulated workers cost no thread each. Every worker RPC is asynchronous: the workers are
// split over a few CompletionQueues, each drained by one thread that owns its workers' state
// (so that state needs no lock) and drives their timers from one periodic alarm. The calls share
// a few channels (separate TCP connections; HTTP/2 multiplexes the rest). Users are few and run
// one thread each with blocking calls.
//
// Latencies count calls that start inside the measured window (after --warmup_s), errors
// included; RegisterWorker and DeregisterWorker are set-up and tear-down and are counted
// whenever they happen. PollAssignments is a long-poll: its latency is the hold time
// (about --poll_wait_ms when nothing changes). Exits 1 when an RPC kind fails more than 1% of
// its calls or some workers never registered.

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cli_flags.h"
#include "common/client_channel.h"
#include "common/client_security_flags.h"
#include "common/small_file.h"
#include "grpcpp/alarm.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"
#include "proto/mptrain.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051", "Coordinator address HOST:PORT");
ABSL_FLAG(int32_t, workers, 1000, "Simulated worker daemons");
ABSL_FLAG(int32_t, slots, 1, "CPU slots per simulated worker");
ABSL_FLAG(double, duration_s, 30, "Seconds measured (after registration and warm-up)");
ABSL_FLAG(double, warmup_s, 5, "Seconds of load after registration before measuring");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 0,
          "Heartbeat period; 0 = what RegisterWorker answers (a third of the coordinator's "
          "heartbeat timeout), as the worker daemon does");
ABSL_FLAG(int64_t, poll_wait_ms, 20000, "wait_ms of each PollAssignments (the daemon's 20000)");
ABSL_FLAG(int32_t, users, 4, "Simulated users, each looping Submit/Get/List/Watch/Cancel");
ABSL_FLAG(int64_t, user_pause_ms, 100, "Pause of each user between two loops");
ABSL_FLAG(int32_t, channels, 8, "gRPC channels (separate TCP connections) shared by the workers");
ABSL_FLAG(int32_t, threads, 4, "CompletionQueue threads driving the simulated workers");
ABSL_FLAG(int32_t, register_concurrency, 256, "RegisterWorker calls in flight at most");
ABSL_FLAG(double, register_timeout_s, 300, "Give up waiting for every worker to register");
ABSL_FLAG(bool, deregister, true, "Deregister every simulated worker at the end");
ABSL_FLAG(int64_t, coordinator_pid, 0, "Sample this process's CPU, threads and RSS (0 = off)");
ABSL_FLAG(std::string, user_token_file, "",
          "Bearer token of the users (role user or admin); default: the --token_file token, "
          "which the workers use (role worker)");
ABSL_FLAG(double, max_error_rate, 0.01, "Exit 1 when an RPC kind fails more often than this");

namespace mptrain {
namespace {

namespace v1 = ::mptrain::v1;
using Clock = std::chrono::steady_clock;

constexpr auto kRpcDeadline = std::chrono::seconds(10);  // As the worker daemon and trainctl.
constexpr auto kTick = std::chrono::milliseconds(5);     // Timer resolution of the workers.
constexpr int64_t kRetryMs = 1000;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------------------------
// Latency and error counts per RPC kind.
// ---------------------------------------------------------------------------------------------

enum Rpc {
  kRegisterWorker,
  kHeartbeat,
  kPollAssignments,
  kSubmitJob,
  kGetJob,
  kListJobs,
  kWatchJob,
  kCancelJob,
  kDeregisterWorker,
  kRpcCount
};
constexpr const char* kRpcNames[kRpcCount] = {"RegisterWorker", "Heartbeat", "PollAssignments",
                                              "SubmitJob",      "GetJob",    "ListJobs",
                                              "WatchJob",       "CancelJob", "DeregisterWorker"};

class LatencyTable {
 public:
  // The measured window, in NowNs() time; calls that start inside it are counted.
  void SetWindow(int64_t start_ns, int64_t end_ns) {
    window_end_ns_.store(end_ns);
    window_start_ns_.store(start_ns);
  }
  bool InWindow(int64_t start_ns) const {
    return start_ns >= window_start_ns_.load() && start_ns < window_end_ns_.load();
  }

  // Counted only when the call started inside the window, unless `always`.
  void Record(Rpc rpc, int64_t start_ns, const grpc::Status& status, bool always = false) {
    if (!always && !InWindow(start_ns)) return;
    const float ms = static_cast<float>(NowNs() - start_ns) / 1e6f;
    Entry& entry = entries_[rpc];
    std::lock_guard<std::mutex> lock(entry.mu);
    entry.ms.push_back(ms);
    if (!status.ok()) {
      auto& [count, message] = entry.errors[status.error_code()];
      if (count++ == 0) message = status.error_message();
    }
  }

  // The 99th percentile in ms; -1 when no call was counted.
  double P99(Rpc rpc) {
    Entry& entry = entries_[rpc];
    std::lock_guard<std::mutex> lock(entry.mu);
    if (entry.ms.empty()) return -1;
    std::vector<float> ms = entry.ms;
    std::sort(ms.begin(), ms.end());
    return ms[std::min(ms.size() - 1, static_cast<size_t>(0.99 * ms.size()))];
  }

  // Prints the table; returns false when an RPC kind's error rate exceeds `max_error_rate`.
  bool Print(double max_error_rate) {
    bool ok = true;
    std::printf("%-17s %9s %7s %9s %9s %9s\n", "RPC", "count", "errors", "p50 ms", "p99 ms",
                "max ms");
    std::vector<std::string> details;
    for (int rpc = 0; rpc < kRpcCount; ++rpc) {
      Entry& entry = entries_[rpc];
      std::lock_guard<std::mutex> lock(entry.mu);
      if (entry.ms.empty()) continue;
      std::vector<float>& ms = entry.ms;
      std::sort(ms.begin(), ms.end());
      auto quantile = [&](double q) {
        return ms[std::min(ms.size() - 1, static_cast<size_t>(q * ms.size()))];
      };
      int64_t errors = 0;
      for (const auto& [code, error] : entry.errors) {
        errors += error.first;
        details.push_back(absl::StrFormat("  %s: %d x code %d, e.g. \"%s\"", kRpcNames[rpc],
                                          error.first, code, error.second));
      }
      std::printf("%-17s %9zu %7" PRId64 " %9.2f %9.2f %9.2f\n", kRpcNames[rpc], ms.size(), errors,
                  quantile(0.50), quantile(0.99), ms.back());
      if (errors > max_error_rate * static_cast<double>(ms.size())) ok = false;
    }
    if (!details.empty()) std::printf("errors:\n");
    for (const std::string& line : details) std::printf("%s\n", line.c_str());
    return ok;
  }

 private:
  struct Entry {
    std::mutex mu;
    std::vector<float> ms;
    std::map<int, std::pair<int64_t, std::string>> errors;  // code -> (count, first message)
  };
  std::atomic<int64_t> window_start_ns_{std::numeric_limits<int64_t>::max()};
  std::atomic<int64_t> window_end_ns_{std::numeric_limits<int64_t>::max()};
  Entry entries_[kRpcCount];
};

// ---------------------------------------------------------------------------------------------
// A process's CPU, threads and RSS from /proc, once a second.
// ---------------------------------------------------------------------------------------------

struct ProcSample {
  double cpu_s = 0;  // utime + stime
  int64_t threads = 0;
  int64_t rss_kib = 0;
};

bool ReadProcSample(int64_t pid, ProcSample* sample) {
  std::ifstream stat_file(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return false;
  // After "pid (comm)" come the fields from 3 (state) on; utime and stime are 14 and 15.
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int index = 3; index <= 15 && fields >> field; ++index) {
    if (index == 14) utime = std::stoull(field);
    if (index == 15) stime = std::stoull(field);
  }
  sample->cpu_s = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) sample->threads = std::stoll(line.substr(8));
    if (line.rfind("VmRSS:", 0) == 0) sample->rss_kib = std::stoll(line.substr(6));
  }
  return true;
}

class ProcMonitor {
 public:
  ProcMonitor(std::string label, int64_t pid) : label_(std::move(label)), pid_(pid) {}

  void Sample() {
    ProcSample sample;
    const int64_t now_ns = NowNs();
    if (!ReadProcSample(pid_, &sample)) {
      lost_ = true;
      return;
    }
    if (samples_ > 0) {
      const double cores = (sample.cpu_s - last_.cpu_s) / ((now_ns - last_ns_) / 1e9);
      max_cores_ = std::max(max_cores_, cores);
    } else {
      first_ = sample;
      first_ns_ = now_ns;
    }
    last_ = sample;
    last_ns_ = now_ns;
    ++samples_;
    threads_sum_ += sample.threads;
    rss_sum_ += sample.rss_kib;
    max_threads_ = std::max(max_threads_, sample.threads);
    max_rss_kib_ = std::max(max_rss_kib_, sample.rss_kib);
  }

  bool has_samples() const { return samples_ >= 2; }
  double mean_cores() const {
    return (last_.cpu_s - first_.cpu_s) / ((last_ns_ - first_ns_) / 1e9);
  }
  int64_t max_threads() const { return max_threads_; }

  void Print() const {
    if (samples_ < 2) {
      std::printf("%-28s no samples%s\n", label_.c_str(), lost_ ? " (process gone)" : "");
      return;
    }
    const double mean_cores = (last_.cpu_s - first_.cpu_s) / ((last_ns_ - first_ns_) / 1e9);
    std::printf("%-28s %10.2f %10.2f\n", (label_ + " CPU cores").c_str(), mean_cores, max_cores_);
    std::printf("%-28s %10.0f %10" PRId64 "\n", (label_ + " threads").c_str(),
                static_cast<double>(threads_sum_) / samples_, max_threads_);
    std::printf("%-28s %10.1f %10.1f\n", (label_ + " RSS MiB").c_str(),
                static_cast<double>(rss_sum_) / samples_ / 1024.0, max_rss_kib_ / 1024.0);
    if (lost_) std::printf("  (%s exited during the run)\n", label_.c_str());
  }

 private:
  const std::string label_;
  const int64_t pid_;
  ProcSample first_, last_;
  int64_t first_ns_ = 0, last_ns_ = 0;
  int64_t samples_ = 0, threads_sum_ = 0, rss_sum_ = 0, max_threads_ = 0, max_rss_kib_ = 0;
  double max_cores_ = 0;
  bool lost_ = false;
};

// Busy cores of the whole machine (/proc/stat), to show what else competed with the run.
class MachineMonitor {
 public:
  void Sample() {
    std::ifstream stat("/proc/stat");
    std::string cpu;
    uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    if (!(stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal)) {
      return;
    }
    const double busy_s = static_cast<double>(user + nice + system + irq + softirq + steal) /
                          static_cast<double>(sysconf(_SC_CLK_TCK));
    const int64_t now_ns = NowNs();
    if (samples_++ == 0) {
      first_busy_s_ = busy_s;
      first_ns_ = now_ns;
    } else {
      max_cores_ = std::max(max_cores_, (busy_s - last_busy_s_) / ((now_ns - last_ns_) / 1e9));
    }
    last_busy_s_ = busy_s;
    last_ns_ = now_ns;
  }
  void Print() const {
    if (samples_ < 2) return;
    std::printf("%-28s %10.2f %10.2f   (of %ld)\n", "machine busy cores (all)",
                (last_busy_s_ - first_busy_s_) / ((last_ns_ - first_ns_) / 1e9), max_cores_,
                sysconf(_SC_NPROCESSORS_ONLN));
  }

 private:
  int64_t samples_ = 0, first_ns_ = 0, last_ns_ = 0;
  double first_busy_s_ = 0, last_busy_s_ = 0, max_cores_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Asynchronous unary calls on a CompletionQueue.
// ---------------------------------------------------------------------------------------------

// Everything put on a CompletionQueue: Proceed runs on the queue's thread.
class Tag {
 public:
  virtual ~Tag() = default;
  virtual void Proceed(bool ok) = 0;
};

template <typename Response>
class UnaryCall final : public Tag {
 public:
  using Done = std::function<void(UnaryCall&)>;
  explicit UnaryCall(Done done) : done_(std::move(done)) {}

  // `prepare(context, cq)` is a stub's PrepareAsyncXxx bound to its request.
  template <typename Prepare>
  void Start(grpc::CompletionQueue* cq, Clock::duration deadline, Prepare prepare) {
    context.set_deadline(std::chrono::system_clock::now() + deadline);
    start_ns = NowNs();
    reader_ = prepare(&context, cq);
    reader_->StartCall();
    reader_->Finish(&response, &status, this);
  }
  void Proceed(bool) override {
    done_(*this);
    delete this;
  }

  grpc::ClientContext context;
  Response response;
  grpc::Status status;
  int64_t start_ns = 0;

 private:
  Done done_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> reader_;
};

// ---------------------------------------------------------------------------------------------
// Simulated workers: one thread and one CompletionQueue drive a share of them.
// ---------------------------------------------------------------------------------------------

struct LoadOptions {
  int32_t slots = 1;
  int64_t heartbeat_interval_ms = 0;  // 0: as answered
  int64_t poll_wait_ms = 20000;
  int32_t register_concurrency = 64;  // Per driver.
  bool deregister = true;
};

struct SimWorker {
  std::string name;
  uint64_t incarnation = 0;
  v1::WorkerControl::Stub* stub = nullptr;
  // Set by RegisterWorker; generation grows at every registration so that stale timers and
  // answers of an earlier registration are ignored.
  bool registered = false;
  bool registering = false;
  int64_t generation = 0;
  std::string worker_id;
  std::string secret;
  int64_t heartbeat_interval_ms = 0;
  UnaryCall<v1::PollAssignmentsResponse>* poll = nullptr;  // The outstanding long-poll.
};

class WorkerDriver final : public Tag {
 public:
  WorkerDriver(LoadOptions options, LatencyTable* table, std::atomic<int64_t>* registered_total,
               std::atomic<int64_t>* reregistrations)
      : options_(options),
        table_(table),
        registered_total_(registered_total),
        reregistrations_(reregistrations),
        random_(std::random_device()()) {}

  void AddWorker(std::string name, v1::WorkerControl::Stub* stub) {
    SimWorker worker;
    worker.name = std::move(name);
    worker.incarnation = (static_cast<uint64_t>(random_()) << 32) ^ random_();
    worker.stub = stub;
    workers_.push_back(std::move(worker));
  }

  void Start() {
    for (size_t i = 0; i < workers_.size(); ++i) to_register_.push_back(i);
    ArmTick();
    thread_ = std::thread([this] {
      void* tag = nullptr;
      bool ok = false;
      while (cq_.Next(&tag, &ok)) static_cast<Tag*>(tag)->Proceed(ok);
    });
  }
  void RequestStop() { stopping_.store(true); }
  void Join() { thread_.join(); }

  // The periodic tick: starts registrations, due heartbeats and retries; at stop, cancels the
  // long-polls, deregisters, and shuts the queue down once nothing is in flight.
  void Proceed(bool) override {
    const int64_t now_ns = NowNs();
    if (!stopping_.load()) {
      while (registering_ < options_.register_concurrency && !to_register_.empty()) {
        const size_t index = to_register_.front();
        to_register_.pop_front();
        StartRegister(index);
      }
      while (!timers_.empty() && timers_.top().due_ns <= now_ns) {
        const Timer timer = timers_.top();
        timers_.pop();
        SimWorker& worker = workers_[timer.worker];
        if (timer.kind == Timer::kRegister) {
          to_register_.push_back(timer.worker);
        } else if (worker.registered && worker.generation == timer.generation) {
          if (timer.kind == Timer::kHeartbeat) StartHeartbeat(timer.worker);
          if (timer.kind == Timer::kPoll && worker.poll == nullptr) StartPoll(timer.worker);
        }
      }
      ArmTick();
      return;
    }
    if (!stop_started_) {
      stop_started_ = true;
      timers_ = {};
      to_register_.clear();
      for (size_t i = 0; i < workers_.size(); ++i) {
        if (workers_[i].poll != nullptr) workers_[i].poll->context.TryCancel();
        if (options_.deregister && workers_[i].registered) to_deregister_.push_back(i);
      }
    }
    while (in_flight_ < options_.register_concurrency && !to_deregister_.empty()) {
      StartDeregister(to_deregister_.front());
      to_deregister_.pop_front();
    }
    if (in_flight_ == 0 && to_deregister_.empty()) {
      cq_.Shutdown();
      return;
    }
    ArmTick();
  }

 private:
  struct Timer {
    enum Kind { kRegister, kHeartbeat, kPoll };
    int64_t due_ns;
    size_t worker;
    int64_t generation;
    Kind kind;
    bool operator>(const Timer& other) const { return due_ns > other.due_ns; }
  };

  void ArmTick() { tick_.Set(&cq_, std::chrono::system_clock::now() + kTick, this); }

  void AddTimer(size_t index, Timer::Kind kind, int64_t delay_ms) {
    timers_.push(Timer{NowNs() + delay_ms * 1'000'000, index, workers_[index].generation, kind});
  }

  bool Stopping() const { return stopping_.load(); }

  static bool Forgotten(const grpc::Status& status) {
    return status.error_code() == grpc::StatusCode::NOT_FOUND ||
           status.error_code() == grpc::StatusCode::PERMISSION_DENIED;
  }

  // The coordinator forgot the worker (lost, or a stale incarnation): register again, as the
  // daemon does.
  void Reregister(size_t index) {
    SimWorker& worker = workers_[index];
    if (!worker.registered) return;
    worker.registered = false;
    ++worker.generation;
    registered_total_->fetch_sub(1);
    reregistrations_->fetch_add(1);
    to_register_.push_back(index);
  }

  void StartRegister(size_t index) {
    SimWorker& worker = workers_[index];
    if (worker.registered || worker.registering) return;
    worker.registering = true;
    v1::RegisterWorkerRequest request;
    request.set_host("127.0.0.1");
    request.set_device(v1::CPU);
    request.set_slots(options_.slots);
    request.set_incarnation(worker.incarnation);
    request.set_name(worker.name);
    request.add_data_roots("/tmp");
    request.add_output_roots("/tmp");
    request.set_memory_bytes(int64_t{16} << 30);
    ++registering_;
    ++in_flight_;
    auto* call = new UnaryCall<v1::RegisterWorkerResponse>([this, index](auto& done) {
      --registering_;
      --in_flight_;
      table_->Record(kRegisterWorker, done.start_ns, done.status, /*always=*/true);
      SimWorker& worker = workers_[index];
      worker.registering = false;
      if (Stopping()) return;
      if (!done.status.ok()) {
        AddTimer(index, Timer::kRegister, kRetryMs);
        return;
      }
      worker.registered = true;
      ++worker.generation;
      worker.worker_id = done.response.worker_id();
      worker.secret = done.response.worker_secret();
      worker.heartbeat_interval_ms = options_.heartbeat_interval_ms > 0
                                         ? options_.heartbeat_interval_ms
                                         : done.response.heartbeat_interval_ms();
      registered_total_->fetch_add(1);
      // Daemons start at different times: spread the first heartbeat over one interval.
      AddTimer(index, Timer::kHeartbeat,
               std::uniform_int_distribution<int64_t>(0, worker.heartbeat_interval_ms)(random_));
      if (worker.poll == nullptr) StartPoll(index);
    });
    call->Start(&cq_, kRpcDeadline, [&](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
      return worker.stub->PrepareAsyncRegisterWorker(context, request, cq);
    });
  }

  void StartHeartbeat(size_t index) {
    SimWorker& worker = workers_[index];
    v1::HeartbeatRequest request;
    request.set_worker_id(worker.worker_id);
    request.set_incarnation(worker.incarnation);
    request.set_worker_secret(worker.secret);
    const int64_t generation = worker.generation;
    ++in_flight_;
    auto* call = new UnaryCall<v1::HeartbeatResponse>([this, index, generation](auto& done) {
      --in_flight_;
      table_->Record(kHeartbeat, done.start_ns, done.status);
      SimWorker& worker = workers_[index];
      if (Stopping() || worker.generation != generation) return;
      if (Forgotten(done.status)) {
        Reregister(index);
        return;
      }
      // As the daemon: the next heartbeat one interval after this one's answer.
      AddTimer(index, Timer::kHeartbeat, worker.heartbeat_interval_ms);
    });
    call->Start(&cq_, kRpcDeadline, [&](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
      return worker.stub->PrepareAsyncHeartbeat(context, request, cq);
    });
  }

  void StartPoll(size_t index) {
    SimWorker& worker = workers_[index];
    v1::PollAssignmentsRequest request;
    request.set_worker_id(worker.worker_id);
    request.set_incarnation(worker.incarnation);
    request.set_wait_ms(options_.poll_wait_ms);
    request.set_worker_secret(worker.secret);
    const int64_t generation = worker.generation;
    ++in_flight_;
    auto* call = new UnaryCall<v1::PollAssignmentsResponse>([this, index, generation](auto& done) {
      --in_flight_;
      SimWorker& worker = workers_[index];
      worker.poll = nullptr;
      // Our own cancellation at the end is not an error of the coordinator.
      if (Stopping() && done.status.error_code() == grpc::StatusCode::CANCELLED) return;
      table_->Record(kPollAssignments, done.start_ns, done.status);
      if (Stopping() || !worker.registered) return;
      if (worker.generation != generation) {
        StartPoll(index);  // Answer of an earlier registration: poll for the current one.
      } else if (Forgotten(done.status)) {
        Reregister(index);
      } else if (!done.status.ok()) {
        AddTimer(index, Timer::kPoll, kRetryMs);
      } else {
        StartPoll(index);  // Jobs are CUDA-only: there is never anything to start.
      }
    });
    worker.poll = call;
    call->Start(&cq_, kRpcDeadline + std::chrono::milliseconds(options_.poll_wait_ms),
                [&](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
                  return worker.stub->PrepareAsyncPollAssignments(context, request, cq);
                });
  }

  void StartDeregister(size_t index) {
    SimWorker& worker = workers_[index];
    v1::DeregisterWorkerRequest request;
    request.set_worker_id(worker.worker_id);
    request.set_incarnation(worker.incarnation);
    request.set_worker_secret(worker.secret);
    request.set_reason("coordinator_load finished");
    worker.registered = false;
    ++in_flight_;
    auto* call = new UnaryCall<v1::DeregisterWorkerResponse>([this](auto& done) {
      --in_flight_;
      table_->Record(kDeregisterWorker, done.start_ns, done.status, /*always=*/true);
    });
    call->Start(&cq_, kRpcDeadline, [&](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
      return worker.stub->PrepareAsyncDeregisterWorker(context, request, cq);
    });
  }

  const LoadOptions options_;
  LatencyTable* const table_;
  std::atomic<int64_t>* const registered_total_;
  std::atomic<int64_t>* const reregistrations_;
  std::atomic<bool> stopping_{false};

  // Touched only by the queue's thread (and before Start).
  std::mt19937 random_;
  std::vector<SimWorker> workers_;
  std::deque<size_t> to_register_;
  std::deque<size_t> to_deregister_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  int registering_ = 0;
  int64_t in_flight_ = 0;
  bool stop_started_ = false;

  grpc::CompletionQueue cq_;
  grpc::Alarm tick_;
  std::thread thread_;
};

// ---------------------------------------------------------------------------------------------
// Simulated users: blocking calls, one thread each.
// ---------------------------------------------------------------------------------------------

// A job no CPU worker can take: it stays PENDING and never starts a process.
v1::SubmitJobRequest UnplaceableJob(int user, int64_t number) {
  v1::SubmitJobRequest request;
  v1::JobSpec* spec = request.mutable_spec();
  spec->set_name(absl::StrCat("load-u", user, "-", number));
  spec->set_world_size(1);
  spec->set_device(v1::CUDA);
  spec->mutable_model()->set_input_dim(4);
  spec->mutable_model()->set_output_dim(1);
  spec->mutable_model()->set_activation(v1::RELU);
  spec->set_loss(v1::MSE);
  spec->mutable_data()->mutable_synthetic()->set_seed(number);
  spec->set_micro_batch_size(1);
  spec->set_accumulation_steps(1);
  spec->set_steps(1);
  spec->set_precision(v1::FP32);
  spec->mutable_optimizer()->set_lr(0.01);
  return request;
}

void UserLoop(int user, std::shared_ptr<grpc::Channel> channel, int64_t pause_ms, int64_t end_ns,
              LatencyTable* table) {
  std::unique_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub(channel);
  auto timed = [&](Rpc rpc, auto call) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
    const int64_t start_ns = NowNs();
    grpc::Status status = call(&context);
    table->Record(rpc, start_ns, status);
    return status;
  };
  for (int64_t number = 0; NowNs() < end_ns; ++number) {
    const v1::SubmitJobRequest submit = UnplaceableJob(user, number);
    v1::SubmitJobResponse submitted;
    grpc::Status status = timed(kSubmitJob, [&](grpc::ClientContext* context) {
      return stub->SubmitJob(context, submit, &submitted);
    });
    if (status.ok()) {
      v1::GetJobRequest get;
      get.set_job_id(submitted.job_id());
      v1::GetJobResponse job;
      timed(kGetJob,
            [&](grpc::ClientContext* context) { return stub->GetJob(context, get, &job); });
    }
    v1::ListJobsRequest list;
    list.set_page_size(100);
    v1::ListJobsResponse page;
    timed(kListJobs,
          [&](grpc::ClientContext* context) { return stub->ListJobs(context, list, &page); });
    if (status.ok()) {
      // The snapshot's latency, then the watch is cancelled (CANCELLED is then expected).
      v1::WatchJobRequest watch;
      watch.set_job_id(submitted.job_id());
      timed(kWatchJob, [&](grpc::ClientContext* context) {
        std::unique_ptr<grpc::ClientReader<v1::WatchJobEvent>> reader =
            stub->WatchJob(context, watch);
        v1::WatchJobEvent event;
        if (reader->Read(&event)) {
          context->TryCancel();
          reader->Finish();
          return event.has_snapshot()
                     ? grpc::Status::OK
                     : grpc::Status(grpc::StatusCode::INTERNAL, "first event is no snapshot");
        }
        return reader->Finish();
      });
      // Cancelled jobs leave the queue, so it stays short however long the run.
      v1::CancelJobRequest cancel;
      cancel.set_job_id(submitted.job_id());
      v1::CancelJobResponse cancelled;
      timed(kCancelJob, [&](grpc::ClientContext* context) {
        return stub->CancelJob(context, cancel, &cancelled);
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
}

// ---------------------------------------------------------------------------------------------

// The workers' channels. MakeCoordinatorChannel takes no channel arguments, and gRPC gives
// channels with equal arguments and credentials one shared TCP connection (every plaintext
// channel to the same address, measured: 8 channels, 1 connection). So these channels are built
// here the same way (TLS from the same PEM files, the same bearer header) plus an argument with
// the channel's index, which makes each its own connection. The users' channel, and the check
// of the flags, go through MakeCoordinatorChannel itself.
class BearerToken final : public grpc::experimental::Interceptor {
 public:
  explicit BearerToken(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerToken(&header_);
  }

 private:
  const std::string header_;
};

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeLoadChannel(const std::string& address,
                                                               const ClientSecurity& security,
                                                               int index) {
  grpc::ChannelArguments arguments;
  arguments.SetInt("mptrain.load_channel", index);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!security.tls_ca.empty()) {
    grpc::SslCredentialsOptions options;
    absl::StatusOr<std::string> ca = ReadPemFile("--tls_ca", security.tls_ca);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    if (!security.tls_cert.empty()) {
      absl::StatusOr<std::string> cert = ReadPemFile("--tls_cert", security.tls_cert);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadPemFile("--tls_key", security.tls_key);
      if (!key.ok()) return key.status();
      options.pem_cert_chain = *cert;
      options.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(options);
    if (!security.tls_server_name.empty()) {
      arguments.SetSslTargetNameOverride(security.tls_server_name);
    }
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  if (!security.token.empty()) {
    factories.push_back(std::make_unique<BearerTokenFactory>(security.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, arguments,
                                                                 std::move(factories));
}

void RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

int Run() {
  const int32_t worker_count = absl::GetFlag(FLAGS_workers);
  const int32_t thread_count = std::max(1, absl::GetFlag(FLAGS_threads));
  const int32_t channel_count = std::max(1, absl::GetFlag(FLAGS_channels));
  const int32_t user_count = std::max(0, absl::GetFlag(FLAGS_users));
  const std::string address = absl::GetFlag(FLAGS_coordinator);
  if (worker_count < 1 || absl::GetFlag(FLAGS_slots) < 1 || absl::GetFlag(FLAGS_duration_s) <= 0) {
    std::fprintf(stderr, "coordinator_load: --workers, --slots and --duration_s must be > 0\n");
    return 2;
  }
  RaiseFileLimit();

  absl::StatusOr<ClientSecurity> worker_security = ClientSecurityFromFlags();
  if (!worker_security.ok()) {
    std::fprintf(stderr, "coordinator_load: %s\n",
                 std::string(worker_security.status().message()).c_str());
    return 2;
  }
  ClientSecurity user_security = *worker_security;
  if (!absl::GetFlag(FLAGS_user_token_file).empty()) {
    absl::StatusOr<std::string> token = LoadClientToken(absl::GetFlag(FLAGS_user_token_file));
    if (!token.ok()) {
      std::fprintf(stderr, "coordinator_load: --user_token_file: %s\n",
                   std::string(token.status().message()).c_str());
      return 2;
    }
    user_security.token = *token;
  }
  // MakeCoordinatorChannel checks the flags (files, cert without key) with its own messages.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> user_channel =
      MakeCoordinatorChannel(address, user_security);
  if (!user_channel.ok()) {
    std::fprintf(stderr, "coordinator_load: %s\n",
                 std::string(user_channel.status().message()).c_str());
    return 2;
  }
  std::vector<std::shared_ptr<grpc::Channel>> worker_channels;
  for (int i = 0; i < channel_count; ++i) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        MakeLoadChannel(address, *worker_security, i);
    if (!channel.ok()) {
      std::fprintf(stderr, "coordinator_load: %s\n",
                   std::string(channel.status().message()).c_str());
      return 2;
    }
    worker_channels.push_back(*channel);
  }
  std::vector<std::unique_ptr<v1::WorkerControl::Stub>> stubs;
  for (auto& channel : worker_channels) stubs.push_back(v1::WorkerControl::NewStub(channel));

  LatencyTable table;
  std::atomic<int64_t> registered{0};
  std::atomic<int64_t> reregistrations{0};
  LoadOptions options;
  options.slots = absl::GetFlag(FLAGS_slots);
  options.heartbeat_interval_ms = absl::GetFlag(FLAGS_heartbeat_interval_ms);
  options.poll_wait_ms = absl::GetFlag(FLAGS_poll_wait_ms);
  options.register_concurrency =
      std::max(1, absl::GetFlag(FLAGS_register_concurrency) / thread_count);
  options.deregister = absl::GetFlag(FLAGS_deregister);
  std::vector<std::unique_ptr<WorkerDriver>> drivers;
  for (int i = 0; i < thread_count; ++i) {
    drivers.push_back(
        std::make_unique<WorkerDriver>(options, &table, &registered, &reregistrations));
  }
  const std::string prefix = absl::StrCat("load-", getpid(), "-");
  for (int i = 0; i < worker_count; ++i) {
    drivers[i % thread_count]->AddWorker(absl::StrCat(prefix, i), stubs[i % stubs.size()].get());
  }

  std::printf(
      "coordinator_load: %d workers (%d slot(s) each), %d users, %d channels, "
      "%d threads, against %s\n",
      worker_count, options.slots, user_count, channel_count, thread_count, address.c_str());
  std::fflush(stdout);
  const int64_t register_start_ns = NowNs();
  for (auto& driver : drivers) driver->Start();
  const int64_t register_deadline_ns =
      register_start_ns + static_cast<int64_t>(absl::GetFlag(FLAGS_register_timeout_s) * 1e9);
  for (int64_t next_report_ns = register_start_ns + 10'000'000'000;
       registered.load() < worker_count && NowNs() < register_deadline_ns;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (NowNs() >= next_report_ns) {
      std::printf("  registering: %" PRId64 " of %d after %.0f s (%" PRId64
                  " forgotten and registering again)\n",
                  registered.load(), worker_count, (NowNs() - register_start_ns) / 1e9,
                  reregistrations.load());
      std::fflush(stdout);
      next_report_ns += 10'000'000'000;
    }
  }
  const int64_t registered_at_start = registered.load();
  std::printf("registered %" PRId64 " of %d workers in %.1f s\n", registered_at_start, worker_count,
              (NowNs() - register_start_ns) / 1e9);
  std::fflush(stdout);

  const int64_t window_start_ns =
      NowNs() + static_cast<int64_t>(absl::GetFlag(FLAGS_warmup_s) * 1e9);
  const int64_t window_end_ns =
      window_start_ns + static_cast<int64_t>(absl::GetFlag(FLAGS_duration_s) * 1e9);
  table.SetWindow(window_start_ns, window_end_ns);

  std::vector<std::thread> users;
  for (int u = 0; u < user_count; ++u) {
    users.emplace_back(UserLoop, u, *user_channel, absl::GetFlag(FLAGS_user_pause_ms),
                       window_end_ns, &table);
  }

  // Once a second through the window: the coordinator's and this process's use.
  const int64_t coordinator_pid = absl::GetFlag(FLAGS_coordinator_pid);
  ProcMonitor coordinator("coordinator", coordinator_pid);
  ProcMonitor self("coordinator_load", getpid());
  MachineMonitor machine;
  int64_t min_registered = registered_at_start;
  for (int64_t sample_ns = window_start_ns; sample_ns <= window_end_ns;
       sample_ns += 1'000'000'000) {
    std::this_thread::sleep_for(
        std::chrono::nanoseconds(std::max<int64_t>(0, sample_ns - NowNs())));
    if (coordinator_pid > 0) coordinator.Sample();
    self.Sample();
    machine.Sample();
    min_registered = std::min(min_registered, registered.load());
  }
  const int64_t registered_at_end = registered.load();

  for (std::thread& user : users) user.join();
  for (auto& driver : drivers) driver->RequestStop();
  for (auto& driver : drivers) driver->Join();

  std::printf("\nworkers registered: %" PRId64 " at the start, %" PRId64 " at least, %" PRId64
              " at the end of the window; %" PRId64 " registrations repeated (worker forgotten)\n",
              registered_at_start, min_registered, registered_at_end, reregistrations.load());
  std::printf("window: %.0f s after %.0f s of warm-up; heartbeat %s, poll wait %" PRId64 " ms\n\n",
              absl::GetFlag(FLAGS_duration_s), absl::GetFlag(FLAGS_warmup_s),
              options.heartbeat_interval_ms > 0
                  ? absl::StrCat("every ", options.heartbeat_interval_ms, " ms").c_str()
                  : "at the interval RegisterWorker answered",
              options.poll_wait_ms);
  const bool errors_ok = table.Print(absl::GetFlag(FLAGS_max_error_rate));
  std::printf("\n%-28s %10s %10s\n", "process", "mean", "max");
  if (coordinator_pid > 0) coordinator.Print();
  self.Print();
  machine.Print();

  // The goals for one coordinator (informational: the exit status follows errors only).
  std::printf("\ngoals (>= 10,000 workers on one coordinator):\n");
  auto goal = [](const std::string& what, bool known, bool met, const std::string& measured) {
    std::printf("  %-40s %-8s %s\n", what.c_str(),
                !known ? "unknown"
                : met  ? "met"
                       : "MISSED",
                measured.c_str());
  };
  goal("workers >= 10000", true, worker_count >= 10000, absl::StrCat(worker_count));
  const bool sampled = coordinator_pid > 0 && coordinator.has_samples();
  goal("coordinator CPU < 1 core (mean)", sampled, sampled && coordinator.mean_cores() < 1,
       sampled ? absl::StrFormat("%.2f", coordinator.mean_cores()) : "(no --coordinator_pid)");
  goal("coordinator threads < 64 (max)", sampled, sampled && coordinator.max_threads() < 64,
       sampled ? absl::StrCat(coordinator.max_threads()) : "(no --coordinator_pid)");
  for (auto [rpc, limit_ms] :
       {std::pair{kHeartbeat, 10.0}, std::pair{kSubmitJob, 20.0}, std::pair{kGetJob, 20.0}}) {
    const double p99 = table.P99(rpc);
    goal(absl::StrFormat("%s p99 < %.0f ms", kRpcNames[rpc], limit_ms), p99 >= 0,
         p99 >= 0 && p99 < limit_ms, p99 >= 0 ? absl::StrFormat("%.2f ms", p99) : "(no calls)");
  }
  if (!errors_ok) {
    std::printf("FAIL: an RPC kind's error rate is above %.1f%%\n",
                100 * absl::GetFlag(FLAGS_max_error_rate));
  }
  if (registered_at_start < worker_count) {
    std::printf("FAIL: only %" PRId64 " of %d workers registered\n", registered_at_start,
                worker_count);
  }
  return errors_ok && registered_at_start == worker_count ? 0 : 1;
}

}  // namespace
}  // namespace mptrain

int main(int argc, char** argv) {
  mptrain::ParseFlags(argc, argv,
                      "coordinator_load --coordinator HOST:PORT [--workers N] [--duration_s S] "
                      "[--coordinator_pid PID]");
  return mptrain::Run();
}
