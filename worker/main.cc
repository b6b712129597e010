// worker: the daemon that runs ranks of training jobs on this machine.
//
//   worker --coordinator HOST:PORT --device cpu|cuda|auto [--slots N] [--host ADDRESS]
//          --data_root DIR... --output_root DIR... [--tls_ca ca.pem] [--token_file F]
//          [--fence_after_s SECONDS] [--port_range LO-HI]
//
// The same binary is the rank process: the daemon starts `worker --run_rank=FILE` per rank.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cli_flags.h"
#include "common/job_spec.h"
#include "common/client_security_flags.h"
#include "common/logging.h"
#include "grpcpp/grpcpp.h"
#include "trainer/backend_registry.h"
#include "worker/address.h"
#include "worker/device_usage.h"
#include "worker/host_memory.h"
#include "worker/path_policy.h"
#include "worker/process_title.h"
#include "worker/rank_process.h"
#include "worker/worker_daemon.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051", "Coordinator address HOST:PORT");
ABSL_FLAG(std::string, device, "auto", "cpu, cuda, or auto (cuda when GPUs are visible)");
ABSL_FLAG(int, slots, 0,
          "Ranks this worker runs at once. Default: one per GPU for cuda, 2 for cpu");
ABSL_FLAG(std::string, host, "",
          "Address other machines' ranks reach this worker at (default: this machine's address "
          "on the route to the coordinator)");
ABSL_FLAG(std::string, port_range, "",
          "LO-HI: the ports the collectives of this worker's ranks listen on (gloo; NCCL has no "
          "such setting), for a firewall; 1024..65535, at least one per slot. Default: the "
          "kernel's choice");
ABSL_FLAG(std::string, name, "", "Stable worker name (default: host:pid)");
ABSL_FLAG(std::string, work_dir, "",
          "Directory for assignment files (default: a fresh mode-0700 directory under $TMPDIR)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn or error");
ABSL_FLAG(std::string, run_rank, "", "Internal: run one rank from this assignment file");
ABSL_FLAG(int, standby_slot, -1,
          "Internal: a warm rank process for this slot (of --device): set up, then run the "
          "assignment file whose path arrives on stdin");
ABSL_FLAG(bool, standby_reuse, false,
          "Internal: with --standby_slot, keep the process for the slot's next job after a job "
          "that ended cleanly");
ABSL_FLAG(bool, reuse_ranks, true,
          "With --warm_ranks: a warm rank process whose job ended cleanly releases the job's "
          "memory and takes the slot's next job of the same principal, so that jobs back to "
          "back start warm; false: each runs one job, then exits");
ABSL_FLAG(bool, warm_ranks, true,
          "Keep a warm rank process per slot (device context and libraries set up ahead), so "
          "that a job's ranks skip that at start; see --reuse_ranks");
ABSL_FLAG(std::vector<std::string>, data_root, {},
          "Directory ranks may read data and init checkpoints from (repeatable; required; never "
          "a system directory such as /, /etc or /usr)");
ABSL_FLAG(double, fence_after_s, 10,
          "Self-fencing: stop this worker's ranks after this many seconds without an answer "
          "from the coordinator (its heartbeat timeout replaces this when it sends one); 0 = "
          "never. Keep it at least the coordinator's --heartbeat-timeout so that a quick "
          "coordinator restart does not stop ranks");
ABSL_FLAG(int64_t, memory_limit_mib, 0,
          "Advertise at most this much host memory (MiB) for this worker's CPU ranks, e.g. to "
          "keep some for other services; 0 = what the machine offers (MemAvailable, or the "
          "cgroup's memory limit when smaller). It only ever lowers what is advertised");
ABSL_FLAG(std::vector<std::string>, output_root, {},
          "Directory ranks may write checkpoints into (repeatable; required; each user's jobs "
          "write only under <root>/<user>/, admins' anywhere below it)");

namespace {

// The rank environment that pins the collectives: NCCL to the interface that holds `host`
// (unless the user set NCCL_SOCKET_IFNAME), gloo's listening ports to --port_range. gloo binds
// `host` itself (the rank's --host). An address no interface of this machine holds is refused:
// no rank could listen there.
absl::Status PinCollectives(mptrain::WorkerOptions* options) {
  absl::StatusOr<std::string> interface = mptrain::InterfaceForAddress(options->host);
  if (!interface.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--host ", options->host, " cannot be this worker's address: ",
        interface.status().message(),
        ". Ranks listen there for their peers; pass an address of this machine (or leave --host "
        "out)"));
  }
  options->rank_env = mptrain::NcclInterfaceEnvironment(options->host, *interface, environ);
  absl::StatusOr<mptrain::PortRange> ports =
      mptrain::PortRangeForSlots(absl::GetFlag(FLAGS_port_range), options->slots);
  if (!ports.ok()) return ports.status();
  // Only the flag decides the ranks' range: a variable inherited from this daemon would not
  // have been checked.
  unsetenv(mptrain::kGlooPortRangeVariable);
  if (!ports->empty()) {
    options->rank_env.push_back(
        absl::StrCat(mptrain::kGlooPortRangeVariable, "=", ports->ToString()));
  }
  const char* user_ifname = getenv("NCCL_SOCKET_IFNAME");
  spdlog::info("collectives on {} (interface {}; NCCL_SOCKET_IFNAME={}{}), listening ports {}",
               options->host, *interface, user_ifname != nullptr ? user_ifname : "=" + *interface,
               user_ifname != nullptr ? " as set" : "",
               ports->empty() ? "of the kernel's choice" : ports->ToString() + " (gloo)");
  return absl::OkStatus();
}

// Resolves --device and --slots against what this build and machine have.
absl::Status ChooseDevice(mptrain::WorkerOptions* options) {
  const std::string device = absl::GetFlag(FLAGS_device);
  int slots = absl::GetFlag(FLAGS_slots);
  // The coordinator takes at most kMaxWorldSize slots per worker (worker_registry.h there).
  constexpr int kMaxSlots = mptrain::kMaxWorldSize;
  if (slots < 0 || slots > kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--slots must be in [0, ", kMaxSlots, "] (0: one per GPU, or 2 CPU slots), got ", slots));
  }
  if (device != "cpu" && device != "cuda" && device != "auto") {
    return absl::InvalidArgumentError("--device must be cpu, cuda or auto, got " + device);
  }
  if (device == "cuda" || device == "auto") {
    auto entry = mptrain::FindBackend(mptrain::v1::CUDA);
    absl::StatusOr<mptrain::LocalDevices> gpus =
        entry.ok() ? (*entry)->discover() : absl::StatusOr<mptrain::LocalDevices>(entry.status());
    if (gpus.ok() && gpus->count > 0) {
      options->device = mptrain::v1::CUDA;
      options->devices = gpus->devices;
      options->slots = slots > 0 ? std::min(slots, gpus->count) : gpus->count;
      return absl::OkStatus();
    }
    if (device == "cuda") {
      return absl::FailedPreconditionError(
          "--device cuda but no GPU is usable: " +
          (gpus.ok() ? std::string("no CUDA device found") : gpus.status().ToString()));
    }
  }
  options->device = mptrain::v1::CPU;
  options->slots = slots > 0 ? slots : 2;
  return absl::OkStatus();
}

// What this worker advertises of the host's memory, and the machine it shares with the other
// workers there (the coordinator counts that machine's memory once for all of them).
absl::Status ChooseMemory(mptrain::WorkerOptions* options) {
  const int64_t limit_mib = absl::GetFlag(FLAGS_memory_limit_mib);
  if (limit_mib < 0 || limit_mib > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory_limit_mib must be in [0, 2^40] (0 = no limit), got ", limit_mib));
  }
  absl::StatusOr<mptrain::HostMemory> memory = mptrain::ReadHostMemory();
  if (!memory.ok()) {
    // An odd /proc (a kernel before 3.14): the physical memory, as before, rather than no
    // worker at all.
    spdlog::warn("{}; advertising the physical memory instead",
                 std::string(memory.status().message()));
    memory = mptrain::HostMemory{
        static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE), 0};
  }
  options->memory_bytes = memory->usable_bytes();
  if (limit_mib > 0) options->memory_bytes = std::min(options->memory_bytes, limit_mib << 20);
  absl::StatusOr<std::string> machine_id = mptrain::ReadMachineId();
  if (machine_id.ok()) {
    options->machine_id = *machine_id;
  } else {
    // Then this worker counts as a machine of its own: nothing is shared, nothing is refused.
    spdlog::warn("{}; co-located workers will not share one memory budget",
                 std::string(machine_id.status().message()));
  }
  spdlog::info("CPU ranks may use {} MiB (MemAvailable {} MiB, cgroup limit {}{}); machine {}",
               options->memory_bytes >> 20, memory->available_bytes >> 20,
               memory->cgroup_limit_bytes == 0
                   ? std::string("none")
                   : absl::StrCat(memory->cgroup_limit_bytes >> 20, " MiB"),
               limit_mib > 0 ? absl::StrCat(", --memory_limit_mib ", limit_mib) : "",
               options->machine_id.empty() ? "unknown" : options->machine_id);
  return absl::OkStatus();
}

// What every heartbeat carries (HeartbeatRequest.usage): the host memory the ranks could take
// now (the cgroup-aware figures of worker/host_memory.h) and each CUDA device's memory and
// utilization (worker/device_usage.h: NVML, opened at the first reading, on the daemon's usage
// thread: a driver that hangs holds back neither the start nor the heartbeats). Owns what it
// uses (it may run once more after the daemon stopped).
std::function<mptrain::v1::WorkerUsage()> UsageReader(const mptrain::WorkerOptions& options) {
  std::vector<int> devices;
  if (options.device == mptrain::v1::CUDA) {
    for (const mptrain::v1::DeviceInfo& device : options.devices) devices.push_back(device.index());
  }
  auto gpus = std::make_shared<std::unique_ptr<mptrain::DeviceUsage>>();
  return [devices, gpus] {
    if (*gpus == nullptr) {
      std::string why;
      *gpus = mptrain::DeviceUsage::ForCudaDevices(devices, &why);
      if (!why.empty()) spdlog::warn("GPU usage readings unavailable: {}", why);
    }
    mptrain::v1::WorkerUsage usage;
    absl::StatusOr<mptrain::HostMemory> memory = mptrain::ReadHostMemory();
    if (memory.ok()) {
      const int64_t total = memory->total_now_bytes();
      const int64_t available = memory->available_now_bytes();
      usage.set_memory_total_bytes(total);
      usage.set_memory_available_bytes(total > 0 ? std::min(available, total) : available);
    }
    for (mptrain::v1::DeviceUsage& device : (*gpus)->Read()) {
      *usage.add_devices() = std::move(device);
    }
    return usage;
  };
}

}  // namespace

// The --data_root / --output_root directories (every occurrence), resolved. Both are required:
// no implicit root (a daemon started in / by a unit without WorkingDirectory would otherwise let
// every job read and write the whole machine as this worker's user).
absl::StatusOr<mptrain::PathPolicy> RootsFromFlags() {
  std::vector<std::string> data =
      mptrain::RepeatedFlagValues(mptrain::ParsedArguments(), "data_root");
  std::vector<std::string> output =
      mptrain::RepeatedFlagValues(mptrain::ParsedArguments(), "output_root");
  if (data.empty() || output.empty()) {
    return absl::InvalidArgumentError(
        "--data_root and --output_root are required: the directories this worker's ranks may "
        "read (data, init checkpoints) and write (checkpoints, outputs) under, e.g. "
        "--data_root=/srv/mptrain/data --output_root=/srv/mptrain/outputs (no default: the "
        "daemon's current directory could be /)");
  }
  return mptrain::PathPolicy::Create(data, output);
}

namespace {

int g_stop_pipe[2] = {-1, -1};
std::atomic<bool> g_daemon_stop{false};  // Set by the signal thread; outlives RunDaemon.

pid_t g_daemon_pid = 0;

void OnStopSignal(int signal) {
  if (getpid() != g_daemon_pid) return;  // A child between its fork and exec (RankLauncher).
  const int saved_errno = errno;
  const char byte = static_cast<char>(signal);
  [[maybe_unused]] const ssize_t written = write(g_stop_pipe[1], &byte, 1);
  errno = saved_errno;
}

// A rank process, and the daemon, end here without running static destructors: their
// detached threads (the signal threads, a rank's teardown limit) may still wake — a SIGTERM
// arriving as they exit — and found spdlog and the stop token destroyed (rank processes ended
// by signal 11).
[[noreturn]] void EndProcess(int exit_code) {
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  std::_Exit(exit_code);
}

// The daemon's life, once the flags are read; returns its exit code.
int RunDaemon(const absl::StatusOr<mptrain::PathPolicy>& roots,
              const absl::StatusOr<mptrain::ClientSecurity>& security) {
  // SIGTERM and SIGINT stop the daemon through a pipe its handler writes to. (Blocking them
  // for a sigwait thread did not cover threads that libraries start before main — OpenBLAS's
  // pool — so a SIGTERM could land there and kill the daemon outright, leaving its work
  // directory and no deregistration behind.)
  g_daemon_pid = getpid();
  // Non-blocking: a flood of signals must not block the handler once the pipe is full.
  if (pipe2(g_stop_pipe, O_CLOEXEC) != 0 || fcntl(g_stop_pipe[1], F_SETFL, O_NONBLOCK) != 0) {
    std::fprintf(stderr, "worker: pipe: %s\n", std::strerror(errno));
    return 2;
  }
  struct sigaction on_stop {};
  on_stop.sa_handler = OnStopSignal;
  on_stop.sa_flags = SA_RESTART;
  sigemptyset(&on_stop.sa_mask);
  sigaction(SIGTERM, &on_stop, nullptr);
  sigaction(SIGINT, &on_stop, nullptr);

  mptrain::WorkerOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  absl::StatusOr<std::string> host =
      mptrain::ChooseAdvertisedHost(absl::GetFlag(FLAGS_host), options.coordinator);
  if (!host.ok()) {
    mptrain::InitLogging("worker", absl::GetFlag(FLAGS_log_level));
    spdlog::error("{}", std::string(host.status().message()));
    return 2;
  }
  options.host = *host;
  options.name = absl::GetFlag(FLAGS_name).empty()
                     ? absl::StrCat(options.host, ":", getpid())
                     : absl::GetFlag(FLAGS_name);
  mptrain::InitLogging("worker " + options.name, absl::GetFlag(FLAGS_log_level));
  if (absl::Status status = ChooseDevice(&options); !status.ok()) {
    spdlog::error("{}", status.ToString());
    return 2;
  }
  if (absl::Status pinned = PinCollectives(&options); !pinned.ok()) {
    spdlog::error("{}", std::string(pinned.message()));
    return 2;
  }
  if (!roots.ok()) {
    spdlog::error("{}", std::string(roots.status().message()));
    return 2;
  }
  if (!security.ok()) {
    spdlog::error("{}", std::string(security.status().message()));
    return 2;
  }
  const double fence_after_s = absl::GetFlag(FLAGS_fence_after_s);
  if (!std::isfinite(fence_after_s) || fence_after_s < 0 || fence_after_s > 86'400) {
    spdlog::error("--fence_after_s must be in [0, 86400] (0 = never fence), got {}",
                  fence_after_s);
    return 2;
  }
  options.fence_after_ms = static_cast<int64_t>(std::llround(fence_after_s * 1000));
  if (absl::Status status = ChooseMemory(&options); !status.ok()) {
    spdlog::error("{}", std::string(status.message()));
    return 2;
  }
  options.data_roots = roots->data_roots();
  options.output_roots = roots->output_roots();
  options.security = *security;
  spdlog::info("ranks read under [{}] and write under [{}]",
               absl::StrJoin(options.data_roots, ", "), absl::StrJoin(options.output_roots, ", "));
  options.rank_executable = std::filesystem::read_symlink("/proc/self/exe").string();
  options.warm_ranks = absl::GetFlag(FLAGS_warm_ranks);
  options.reuse_ranks = absl::GetFlag(FLAGS_reuse_ranks);
  options.work_dir = absl::GetFlag(FLAGS_work_dir);
  if (options.work_dir.empty()) {
    // A fresh directory only this user can enter (mkdtemp: 0700, never an existing one): the
    // assignment files written there carry rank secrets, and a predictable /tmp name could be
    // taken by another local user first.
    std::string pattern =
        (std::filesystem::temp_directory_path() / "mptrain-worker-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      spdlog::error("cannot create a work dir under {}: {}",
                    std::filesystem::temp_directory_path().string(), std::strerror(errno));
      return 2;
    }
    options.work_dir = pattern;
  } else {
    std::error_code error;
    std::filesystem::create_directories(options.work_dir, error);
    if (error) {
      spdlog::error("cannot create work dir {}: {}", options.work_dir, error.message());
      return 2;
    }
  }

  // The directory this start made goes on every way out (its ranks are gone, and their
  // assignment files with them): one per daemon start would pile up in /tmp.
  const bool made_work_dir = absl::GetFlag(FLAGS_work_dir).empty();
  absl::Cleanup remove_work_dir = [&] {
    if (!made_work_dir) return;
    std::error_code ignored;
    std::filesystem::remove_all(options.work_dir, ignored);
  };

  std::thread signal_waiter([] {
    char signal = 0;
    while (read(g_stop_pipe[0], &signal, 1) < 0 && errno == EINTR) {
    }
    spdlog::info("signal {}: stopping ranks and exiting", static_cast<int>(signal));
    g_daemon_stop.store(true);
  });
  signal_waiter.detach();

  auto channel = mptrain::MakeCoordinatorChannel(options.coordinator, options.security);
  if (!channel.ok()) {
    spdlog::error("{}", std::string(channel.status().message()));
    return 2;
  }
  options.fresh_stub = [address = options.coordinator, security = options.security]()
      -> std::shared_ptr<mptrain::v1::WorkerControl::StubInterface> {
    auto fresh = mptrain::MakeCoordinatorChannel(address, security, /*own_connection=*/true);
    if (!fresh.ok()) return nullptr;
    return mptrain::v1::WorkerControl::NewStub(*fresh);
  };
  if (absl::GetFlag(FLAGS_host).empty()) {
    // Chosen again every few seconds and before each registration: the machine may be
    // renumbered while the daemon runs.
    options.choose_host = [coordinator = options.coordinator] {
      return mptrain::ChooseAdvertisedHost("", coordinator);
    };
    options.is_local_address = [](const std::string& host) {
      return mptrain::InterfaceForAddress(host).ok();
    };
    options.rank_env_for = [base = options](const std::string& host)
        -> absl::StatusOr<std::vector<std::string>> {
      mptrain::WorkerOptions pinned = base;
      pinned.host = host;
      if (absl::Status status = PinCollectives(&pinned); !status.ok()) return status;
      return pinned.rank_env;
    };
  }
  options.read_usage = UsageReader(options);
  mptrain::WorkerDaemon daemon(options, mptrain::v1::WorkerControl::NewStub(*channel));
  absl::Status status = daemon.Run(&g_daemon_stop);
  if (!status.ok() && status.code() != absl::StatusCode::kCancelled) {
    spdlog::error("{}", status.ToString());
    return 1;
  }
  spdlog::info("worker stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  mptrain::ParseFlags(argc, argv,
                      "worker --coordinator HOST:PORT --device cpu|cuda|auto [--slots N]");
  absl::StatusOr<mptrain::PathPolicy> roots = RootsFromFlags();
  absl::StatusOr<mptrain::ClientSecurity> security = mptrain::ClientSecurityFromFlags();
  if (!absl::GetFlag(FLAGS_run_rank).empty() || absl::GetFlag(FLAGS_standby_slot) >= 0) {
    mptrain::RankProcessOptions rank;
    rank.assignment_file = absl::GetFlag(FLAGS_run_rank);
    rank.coordinator = absl::GetFlag(FLAGS_coordinator);
    rank.host = absl::GetFlag(FLAGS_host);
    if (roots.ok()) {
      rank.data_roots = roots->data_roots();
      rank.output_roots = roots->output_roots();
    }
    rank.security = security.ok() ? *security : mptrain::ClientSecurity{};
    if (absl::GetFlag(FLAGS_standby_slot) >= 0) {
      const std::string slot = absl::StrCat("--standby_slot=", absl::GetFlag(FLAGS_standby_slot));
      rank.on_assignment = [argc, argv, slot](const std::string& file) {
        // "" after a job, in a process kept for the next: it shows as a waiting one again
        // (ps / pgrep -f --run_rank find ranks that run).
        if (file.empty()) {
          mptrain::SetProcessTitle(argc, argv, {argv[0], slot});
          return;
        }
        if (!mptrain::SetProcessTitle(argc, argv, {argv[0], "--run_rank=" + file, slot})) {
          spdlog::warn("process title truncated: ps shows part of --run_rank={}", file);
        }
      };
      EndProcess(mptrain::RunStandbyRankProcess(
          rank, absl::GetFlag(FLAGS_device) == "cuda" ? mptrain::v1::CUDA : mptrain::v1::CPU,
          absl::GetFlag(FLAGS_standby_slot), STDIN_FILENO, absl::GetFlag(FLAGS_standby_reuse)));
    }
    EndProcess(mptrain::RunRankProcess(rank));
  }

  // The daemon ends like a rank process: its signal thread may still wake after the daemon
  // returned, and must not find the logger (or the stop flag) destroyed.
  EndProcess(RunDaemon(roots, security));
}
