#include "worker/rank_process.h"

#include <execinfo.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <cstring>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "comm/stop_token.h"
#include "common/path_rules.h"
#include "common/status_macros.h"
#include "common/tenant_paths.h"
#include "common/logging.h"
#include "grpcpp/grpcpp.h"
#include "proto/mptrain.grpc.pb.h"
#include "trainer/backend_registry.h"
#include "trainer/checkpoint.h"
#include "trainer/train_loop.h"
#include "trainer/data/token_file_list.h"
#include "trainer/training_config_from_spec.h"
#include "io/safetensors.h"
#include "worker/path_policy.h"
#include "worker/rank_client.h"

namespace mptrain {
namespace {

constexpr int64_t kMinRendezvousTimeoutMs = 120'000;
// How long a rank that has reported its result may take to tear its backend down.
constexpr int64_t kTeardownLimitMs = 10'000;

absl::StatusOr<v1::Assignment> ReadAssignment(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  v1::Assignment assignment;
  if (!file || !assignment.ParseFromIstream(&file)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read assignment file ", path));
  }
  return assignment;
}

// The rank's one stop signal: tripped by SIGTERM/SIGINT (the worker stopping this rank) and by
// the coordinator saying the job ended. It aborts the collective (a wait on a peer returns at
// once), and the loop stops between steps. Never destroyed: the signal thread may use it
// while the process exits.
StopToken& g_stop = *new StopToken;

// CUDA and NCCL start threads of their own that may not keep a blocked signal mask, so the
// signals get a real handler that only writes to a pipe; a thread acts on it, and exits the
// process within a few seconds even if something cannot be interrupted.
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int signal) {
  const char byte = static_cast<char>(signal);
  (void)!write(g_signal_pipe[1], &byte, 1);
}

// The thread that trains (RunAssignment's), so that a rank that cannot stop says where it is
// stuck: the signal thread sends it SIGUSR2 before the forced exit, and this handler writes its
// stack to stderr (the worker's log; addresses resolve with `addr2line -e worker`). Best effort:
// backtrace() is not async-signal-safe (it may take the loader's locks), and the exit follows
// 200 ms later whatever happens.
std::atomic<pid_t> g_training_thread{0};

void WriteStack(int) {
  const int saved_errno = errno;
  static const char kHeader[] = "the training thread's stack:\n";
  (void)!write(STDERR_FILENO, kHeader, sizeof(kHeader) - 1);
  void* frames[48];
  const int count = backtrace(frames, 48);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  errno = saved_errno;
}

void StartSignalThread() {
  // Once per process: a warm rank process starts it while it waits for a job, so a stop then
  // is handled as in a job (and the job's start does not start another).
  static std::atomic<bool> started{false};
  if (started.exchange(true)) return;
  if (pipe(g_signal_pipe) != 0) return;
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  // backtrace() loads libgcc on first use (malloc): done here, not in the signal handler.
  void* warm[1];
  backtrace(warm, 1);
  struct sigaction stack_action {};
  stack_action.sa_handler = WriteStack;
  stack_action.sa_flags = SA_RESTART;  // The training thread's calls go on after it.
  sigemptyset(&stack_action.sa_mask);
  sigaction(SIGUSR2, &stack_action, nullptr);
  std::thread([] {
    char byte = 0;
    while (read(g_signal_pipe[0], &byte, 1) < 0 && errno == EINTR) {
    }
    const int signal = byte;
    spdlog::warn("signal {}: aborting", signal);
    g_stop.RequestStop(
        absl::StrCat("signal ", signal, " (", strsignal(signal), "): the worker stopped this rank"));
    // Well before the worker's SIGKILL (WorkerOptions::stop_grace_ms, 3 s), with the stack's
    // 200 ms inside it and room for a loaded host: a stuck rank's stack is what its worker's
    // log must show.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    spdlog::error("did not stop within 2 s of signal {}: exiting", signal);
    if (const pid_t training = g_training_thread.load(); training != 0) {
      syscall(SYS_tgkill, getpid(), training, SIGUSR2);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::_Exit(128 + signal);
  }).detach();
}

// Checks every path of the spec against the worker's roots before anything is opened, and
// replaces each by its resolved form (so a symlink swapped in later is not followed: the
// readers also refuse a symlink as the final component). Only rank 0 writes.
// What this job's files are stamped with ("mptrain_job"): its id and its uid, never reused
// (a coordinator without its store counts job ids from job-0001 again). From a coordinator
// before uids: the id alone.
// Who owns them ("mptrain_owner"): the job's owner.
CheckpointStamp JobStamp(const v1::Assignment& assignment) {
  CheckpointStamp stamp;
  stamp.job = assignment.job_uid().empty()
                  ? assignment.job_id()
                  : absl::StrCat(assignment.job_id(), "/", assignment.job_uid());
  stamp.owner = assignment.owner();
  return stamp;
}

absl::Status ConfinePaths(const RankProcessOptions& options, const v1::Assignment& assignment,
                          v1::JobSpec* spec, std::string* resume_checkpoint) {
  const int rank = assignment.rank();
  absl::StatusOr<PathPolicy> roots = PathPolicy::Create(options.data_roots, options.output_roots);
  if (!roots.ok()) return roots.status();
  // Each principal's job writes only in its own part of the output roots (an admin's anywhere
  // under them): common/tenant_paths.h. An assignment without an owner (a coordinator older
  // than this worker) is confined like a user's, and then fails: the safe side.
  Tenancy tenancy;
  tenancy.principal = assignment.owner();
  tenancy.admin = assignment.owner_is_admin();
  absl::StatusOr<PathPolicy> policy = roots->ForTenancy(tenancy);
  if (!policy.ok()) return policy.status();
  auto confine = [](absl::StatusOr<std::string> resolved, std::string* path) {
    if (!resolved.ok()) return resolved.status();
    *path = *resolved;
    return absl::OkStatus();
  };
  if (spec->data().has_npy()) {
    v1::NpyData* npy = spec->mutable_data()->mutable_npy();
    RETURN_IF_ERROR(confine(policy->CheckRead("data.npy.features_path", npy->features_path()),
                            npy->mutable_features_path()));
    RETURN_IF_ERROR(confine(policy->CheckRead("data.npy.targets_path", npy->targets_path()),
                            npy->mutable_targets_path()));
  }
  if (spec->has_eval_data()) {
    v1::NpyData* eval = spec->mutable_eval_data();
    RETURN_IF_ERROR(confine(policy->CheckRead("eval_data.features_path", eval->features_path()),
                            eval->mutable_features_path()));
    RETURN_IF_ERROR(confine(policy->CheckRead("eval_data.targets_path", eval->targets_path()),
                            eval->mutable_targets_path()));
  }
  // Token files: patterns expanded on this host, every file (and pattern directory) through
  // the policy; the spec then lists the resolved files.
  auto confine_tokens = [&](const std::string& field, v1::TokenData* tokens) -> absl::Status {
    const std::vector<std::string> entries(tokens->files().begin(), tokens->files().end());
    ASSIGN_OR_RETURN(std::vector<std::string> files,
                     ExpandTokenFiles(field, entries,
                                      [&](const std::string& f, const std::string& p) {
                                        return policy->CheckRead(f, p);
                                      }));
    tokens->clear_files();
    for (std::string& file : files) tokens->add_files(std::move(file));
    return absl::OkStatus();
  };
  if (spec->data().has_tokens()) {
    RETURN_IF_ERROR(confine_tokens("data.tokens.files", spec->mutable_data()->mutable_tokens()));
  }
  if (spec->has_eval_tokens()) {
    RETURN_IF_ERROR(confine_tokens("eval_tokens.files", spec->mutable_eval_tokens()));
  }
  if (!spec->init_checkpoint().empty()) {
    RETURN_IF_ERROR(confine(policy->CheckRead("init_checkpoint", spec->init_checkpoint()),
                            spec->mutable_init_checkpoint()));
  }
  // Only rank 0 reads the resume checkpoint (the others receive its state through the
  // collective, trainer/resume.h): on their hosts the file need not exist.
  if (rank == 0 && !resume_checkpoint->empty()) {
    absl::StatusOr<std::string> readable =
        policy->CheckRead("resume checkpoint", *resume_checkpoint, ReadScope::kDataOrOutput);
    if (readable.status().code() == absl::StatusCode::kNotFound) {
      // Gone from the disk: its directory, confined as a checkpoint_dir is, may still hold the
      // job's older checkpoints (the trainer falls back to them, trainer/resume.h), and the
      // trainer's read names the missing file if none is left.
      absl::StatusOr<std::string> in_directory =
          policy->CheckWrite("resume checkpoint", *resume_checkpoint, /*overwrite=*/true);
      if (in_directory.ok()) readable = std::move(in_directory);
    }
    RETURN_IF_ERROR(confine(readable, resume_checkpoint));
  }
  if (rank != 0) return absl::OkStatus();
  if (!spec->output_checkpoint().empty()) {
    ASSIGN_OR_RETURN(const std::string output,
                     policy->CheckWrite("output_checkpoint", spec->output_checkpoint(),
                                        /*overwrite=*/true));
    // Whose file is there decides, not the spec alone: this job's own (an earlier attempt's)
    // may be replaced, its owner's other outputs only with overwrite_output, anyone else's
    // never (the trainer checks again before it writes).
    const FileOwnership ownership = CheckpointOwnership(output, JobStamp(assignment));
    if (!MayReplace(ownership, spec->overwrite_output(), /*resuming=*/false)) {
      const std::string quoted = QuotePathForMessage(spec->output_checkpoint());
      if (!spec->overwrite_output()) {
        return absl::AlreadyExistsError(absl::StrCat(
            "output_checkpoint ", quoted, " already exists; set overwrite_output: true to "
            "replace it"));
      }
      return absl::PermissionDeniedError(absl::StrCat(
          "output_checkpoint ", quoted, " exists and was not written by a job of ",
          assignment.owner(), ": overwrite_output replaces only its owner's checkpoints"));
    }
    spec->set_output_checkpoint(output);
  }
  if (!spec->checkpoint_dir().empty()) {
    RETURN_IF_ERROR(confine(policy->CheckOutputDirectory("checkpoint_dir", spec->checkpoint_dir()),
                            spec->mutable_checkpoint_dir()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Train(const v1::Assignment& assignment,
                                  const RankProcessOptions& options, KeyValueStore* store,
                                  TrainingObserver* observer,
                                  std::chrono::steady_clock::time_point started,
                                  std::unique_ptr<Backend>* backend_holder) {
  v1::JobSpec spec = assignment.spec();
  std::string resume_checkpoint = assignment.resume_checkpoint();
  RETURN_IF_ERROR(ConfinePaths(options, assignment, &spec, &resume_checkpoint));
  // The one conversion of the spec (defaults, validation) into what the trainer reads.
  ASSIGN_OR_RETURN(TrainingConfig config, TrainingConfigFromSpec(spec));
  // ConfinePaths resolved them: a symbolic link met on the way later was put there since.
  config.output_paths_resolved = true;
  // An operator's switch (the worker passes its environment on): every step op by op.
  if (const char* graphs = std::getenv("MPTRAIN_STEP_GRAPHS"); graphs != nullptr &&
                                                                std::string(graphs) == "0") {
    config.record_steps = false;
  }
  auto entry = FindBackend(spec.device());
  if (!entry.ok()) return entry.status();
  BackendOptions backend_options;
  backend_options.rank = assignment.rank();
  backend_options.world_size = assignment.world_size();
  backend_options.device_index = assignment.device_index();
  backend_options.store = store;
  backend_options.host = options.host;
  backend_options.collective_timeout_ms =
      static_cast<int64_t>(std::llround(spec.collective_timeout_s() * 1000.0));
  // Ranks start at different times (placement, process start, device set-up): the rendezvous
  // waits for them at least as long as it always did.
  backend_options.rendezvous_timeout_ms =
      std::max<int64_t>(kMinRendezvousTimeoutMs, backend_options.collective_timeout_ms);
  backend_options.stop_token = &g_stop;
  backend_options.grad_comm_lanes = static_cast<int>(spec.grad_comm_lanes());
  auto backend = (*entry)->create(backend_options);
  if (!backend.ok()) return backend.status();
  spdlog::info("rank {}/{} on {} device {}: {} steps x {} micro-batches of {} (ready {:.0f} ms "
               "after its assignment reached this process)",
               assignment.rank(), assignment.world_size(), (*backend)->Name(),
               assignment.device_index(), config.steps, config.accumulation_steps,
               config.micro_batch_size,
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                         started)
                   .count());
  if (!resume_checkpoint.empty()) spdlog::info("resuming from {}", resume_checkpoint);
  // Kept by the caller until the result is reported: tearing a backend down (NCCL's
  // communicators, device memory) takes a few hundred milliseconds that the job's end need not
  // wait for.
  *backend_holder = std::move(*backend);
  auto result = RunTraining(config, assignment.rank(), backend_holder->get(), observer,
                            resume_checkpoint, JobStamp(assignment));
  if (!result.ok()) return result.status();
  spdlog::info("finished: parameter checksum {}, {} skipped steps, final scale {}, {} steps "
               "replayed from a recorded one",
               result->checksum, result->skipped_steps, result->final_loss_scale,
               result->replayed_steps);
  return result->checksum;
}

// Ends the process with `exit_code` if not destroyed within kTeardownLimitMs.
class TeardownLimit {
 public:
  explicit TeardownLimit(int exit_code)
      : thread_([this, exit_code] {
          std::unique_lock<std::mutex> lock(mu_);
          if (done_cv_.wait_for(lock, std::chrono::milliseconds(kTeardownLimitMs),
                                [this] { return done_; })) {
            return;
          }
          spdlog::error("the backend's teardown did not end within {} ms: exiting",
                        kTeardownLimitMs);
          std::_Exit(exit_code);
        }) {}
  ~TeardownLimit() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;  // Last: starts once the rest is built.
};

// Runs the assignment in `options.assignment_file` through `channel`. `started` is when this
// process began working on it (its start, or a standby's receipt of the path).
int RunAssignment(const RankProcessOptions& options,
                  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel,
                  std::chrono::steady_clock::time_point started) {
  auto assignment = ReadAssignment(options.assignment_file);
  if (!assignment.ok()) {
    spdlog::error("{}", assignment.status().ToString());
    return 1;
  }
  InitLogging(absl::StrCat(assignment->job_id(), "/rank", assignment->rank()));
  RankIdentity identity{assignment->job_id(), assignment->rank(), assignment->attempt(),
                        assignment->rank_secret()};
  if (!channel.ok()) {
    spdlog::error("{}", channel.status().ToString());
    return 1;
  }
  std::shared_ptr<v1::WorkerControl::StubInterface> stub = v1::WorkerControl::NewStub(*channel);
  GrpcKeyValueStore store(stub, identity);
  std::unique_ptr<Backend> backend;  // Uses the store: declared after it, destroyed before.
  absl::StatusOr<std::string> checksum;
  {
    TelemetryReporter reporter(stub, identity, &g_stop);
    StartSignalThread();
    g_training_thread.store(static_cast<pid_t>(syscall(SYS_gettid)));
    checksum = Train(*assignment, options, &store, &reporter, started, &backend);
    reporter.Flush();  // Telemetry lands before the result that ends the job.
  }
  if (!checksum.ok()) spdlog::error("rank failed: {}", checksum.status().ToString());
  absl::Status reported = ReportRankResult(stub.get(), identity, checksum);
  if (!reported.ok()) spdlog::error("could not report the result: {}", reported.ToString());
  const int exit_code = checksum.ok() && reported.ok() ? 0 : 1;
  // After the result the job's end does not wait for the backend's teardown, and nobody would
  // stop a teardown that hangs (the coordinator stops ranks of unfinished jobs only): bounded.
  // Called off once the teardown is done: a process kept for the next job must not be ended
  // by the last job's timer.
  {
    TeardownLimit limit(exit_code);
    const auto teardown = std::chrono::steady_clock::now();
    backend.reset();
    // What a slot's next job waits for when it comes right after this one (the process is its
    // slot's again only then): said, so that a slow teardown is seen.
    spdlog::info("backend released in {:.0f} ms",
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                           teardown)
                     .count());
  }
  g_training_thread.store(0);
  return exit_code;
}

// The messages of the standby protocol (worker/standby_ranks.h) on the control socket: the
// daemon sends "PATH\n" with the job's output pipe attached (SCM_RIGHTS); a process kept for
// the next job answers "done CODE\n" once the job's memory is released.
struct Received {
  std::string path;  // Empty: end of file (the daemon has no job for it).
  int output_fd = -1;  // The job's output pipe (-1: none came; output stays where it is).
};

// Reads one line (at most PATH_MAX bytes) and the descriptor sent with it. Bounded: a longer
// message is refused, never buffered; a second descriptor is closed.
absl::StatusOr<Received> ReceiveAssignment(int fd) {
  Received received;
  std::string text;
  while (text.find('\n') == std::string::npos) {
    char buffer[512];
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    struct iovec io {buffer, sizeof(buffer)};
    struct msghdr message {};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    // The daemon sends a job's path only after the previous job's "done": nothing of the
    // next message can be in this read.
    const ssize_t got = recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return absl::InternalError(absl::StrCat("reading stdin: ", strerror(errno)));
    for (struct cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
         header = CMSG_NXTHDR(&message, header)) {
      if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
      int passed = -1;
      std::memcpy(&passed, CMSG_DATA(header), sizeof(int));
      if (received.output_fd < 0) {
        received.output_fd = passed;
      } else {
        close(passed);
      }
    }
    if (got == 0) break;
    text.append(buffer, static_cast<size_t>(got));
    if (text.size() > PATH_MAX + 1) {
      if (received.output_fd >= 0) close(received.output_fd);
      return absl::InvalidArgumentError(
          absl::StrCat("the assignment path on stdin exceeds ", PATH_MAX, " bytes"));
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.find('\n') != std::string::npos || text.find('\0') != std::string::npos) {
    if (received.output_fd >= 0) close(received.output_fd);
    return absl::InvalidArgumentError("the assignment path on stdin is not one line");
  }
  received.path = std::move(text);
  return received;
}

// stdout and stderr onto `fd` (flushed first: what was written goes where it was meant to).
void RedirectOutput(int fd) {
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(fd, STDOUT_FILENO);
  dup2(fd, STDERR_FILENO);
}

}  // namespace

int RunRankProcess(const RankProcessOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  InitLogging("rank");
  return RunAssignment(options, MakeCoordinatorChannel(options.coordinator, options.security),
                       started);
}

int RunStandbyRankProcess(RankProcessOptions options, v1::DeviceKind device, int device_index,
                          int input_fd, bool reuse) {
  const std::string component = absl::StrCat("warm rank, slot ", device_index);
  InitLogging(component);
  StartSignalThread();
  const auto warming = std::chrono::steady_clock::now();
  auto entry = FindBackend(device);
  if (entry.ok() && (*entry)->warm_up) {
    // A failure here is not fatal: the job's own backend creation will say what is wrong.
    if (absl::Status warmed = (*entry)->warm_up(device_index); !warmed.ok()) {
      spdlog::warn("warming device {} up failed: {}", device_index, warmed.ToString());
    }
  }
  spdlog::info("warm in {:.0f} ms; waiting for a job",
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                         warming)
                   .count());
  // Its own output (the daemon's standby pipe), for between jobs: each job writes to the pipe
  // that came with it, whose end tells the daemon that job's log is complete.
  const int standby_output = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  for (int jobs = 1;; ++jobs) {
    absl::StatusOr<Received> received = ReceiveAssignment(input_fd);
    if (!received.ok()) {
      spdlog::error("{}", received.status().ToString());
      return 1;
    }
    if (received->path.empty()) return 0;  // No job: the daemon closed its end.
    const auto started = std::chrono::steady_clock::now();
    if (received->output_fd >= 0) {
      RedirectOutput(received->output_fd);
      close(received->output_fd);
    }
    options.assignment_file = received->path;
    if (options.on_assignment) options.on_assignment(received->path);
    // The channel is made now, not while waiting: its TLS files are read as a cold rank's would
    // be (a certificate renewed meanwhile is the one used).
    const int exit_code = RunAssignment(
        options, MakeCoordinatorChannel(options.coordinator, options.security), started);
    // The job's pipe closes here (no copy of it is left in this process): its log is complete.
    if (standby_output >= 0) RedirectOutput(standby_output);
    // Kept for the next job only after a clean end: a rank that failed or was stopped may hold
    // what it could not release, and ends as a cold rank would.
    if (!reuse || exit_code != 0 || g_stop.stop_requested() || standby_output < 0 ||
        jobs >= kMaxJobsPerRankProcess) {
      return exit_code;
    }
    // The job's memory goes back to the system (its heap, freed by the backend's teardown),
    // so that the next job, perhaps another's, starts from what a fresh process would hold.
    malloc_trim(0);
    if (options.on_assignment) options.on_assignment("");
    InitLogging(component);
    spdlog::info("job {} of this process done, its memory released; warm for the next", jobs);
    const std::string done = absl::StrCat("done ", exit_code, "\n");
    if (send(input_fd, done.data(), done.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(done.size())) {
      return exit_code;  // The daemon is gone or did not listen: end as a cold rank would.
    }
  }
}

}  // namespace mptrain
