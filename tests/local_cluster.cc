#include "tests/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace mptrain::testing {

std::string RunfilePath(const std::string& relative) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "mptrain", "/",
                      relative);
}

std::string TestTempDir() {
  const char* dir = getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

std::string OutputPartOf(const std::string& principal) {
  const std::string part = TestTempDir() + "/" + principal;
  ::mkdir(part.c_str(), 0755);
  return part;
}

CommandResult RunCommand(const std::string& command_line) {
  CommandResult result;
  FILE* pipe = popen((command_line + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::vector<pid_t> FindProcesses(const std::string& pattern) {
  // "[x]yz" matches "xyz" but not the shell's own command line, which holds "[x]yz".
  const std::string bracketed = "[" + pattern.substr(0, 1) + "]" + pattern.substr(1);
  CommandResult result = RunCommand("pgrep -f '" + bracketed + "'");
  std::vector<pid_t> pids;
  std::istringstream lines(result.output);
  pid_t pid;
  while (lines >> pid) {
    if (pid != getpid()) pids.push_back(pid);
  }
  return pids;
}

std::string WriteSpec(const std::string& name, const std::string& json) {
  std::string path = TestTempDir() + "/" + name + ".json";
  std::ofstream(path) << json;
  return path;
}

std::string LastLine(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  return lines.empty() ? "" : lines.back();
}

LocalCluster::LocalCluster(Options options) : options_(options) {
  static int counter = 0;
  dir_ = absl::StrCat(TestTempDir(), "/cluster", getpid(), "_", counter++);
  RunCommand("rm -rf " + dir_ + " && mkdir -p " + dir_);  // pids repeat across runs
}

LocalCluster::~LocalCluster() {
  for (pid_t pid : worker_pids_) {
    if (pid > 0) kill(pid, SIGKILL);
  }
  if (coordinator_pid_ > 0) kill(coordinator_pid_, SIGKILL);
  for (pid_t pid : worker_pids_) {
    if (pid > 0) waitpid(pid, nullptr, 0);
  }
  if (coordinator_pid_ > 0) waitpid(coordinator_pid_, nullptr, 0);
}

pid_t LocalCluster::Spawn(const std::vector<std::string>& argv, const std::string& log_file) {
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // Never outlive the test.
    if (getppid() != parent) _exit(127);
    int fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

ClientSecurity LocalCluster::SecurityFor(const std::string& principal) const {
  ClientSecurity security;
  if (!options_.secure) return security;
  security.tls_ca = pki() + "/ca.pem";
  // A worker's own certificate (its CN is its name), or the users' one.
  const std::string certificate =
      std::ifstream(pki() + "/" + principal + ".pem").good() ? principal : "client";
  security.tls_cert = pki() + "/" + certificate + ".pem";
  security.tls_key = pki() + "/" + certificate + ".key";
  if (!principal.empty()) {
    auto token = LoadClientToken(pki() + "/" + principal + ".token");
    EXPECT_TRUE(token.ok()) << token.status();
    if (token.ok()) security.token = *token;
  }
  return security;
}

absl::Status LocalCluster::StartCoordinator(int port) {
  const std::string port_file = dir_ + "/port";
  std::remove(port_file.c_str());
  std::vector<std::string> coordinator_argv = {
      RunfilePath("coordinator/coordinator"), absl::StrCat("--listen=127.0.0.1:", port),
      "--port_file=" + port_file,
      absl::StrCat("--heartbeat_timeout=", options_.heartbeat_timeout_s),
      "--state_dir=" + dir_ + "/state"};
  for (const std::string& flag : options_.coordinator_flags) coordinator_argv.push_back(flag);
  coordinator_pid_ = Spawn(coordinator_argv, dir_ + "/coordinator.log");
  int bound = 0;
  for (int i = 0; i < 400 && bound == 0; ++i) {
    std::ifstream(port_file) >> bound;
    if (bound == 0) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  if (bound == 0) return absl::UnavailableError("the coordinator did not start; see " + dir_);
  address_ = absl::StrCat("127.0.0.1:", bound);
  return absl::OkStatus();
}

void LocalCluster::KillCoordinator() {
  if (coordinator_pid_ <= 0) return;
  kill(coordinator_pid_, SIGKILL);
  waitpid(coordinator_pid_, nullptr, 0);
  coordinator_pid_ = 0;
}

absl::Status LocalCluster::RestartCoordinator() {
  const int port = std::stoi(address_.substr(address_.rfind(':') + 1));
  KillCoordinator();
  return StartCoordinator(port);
}

absl::Status LocalCluster::Start() {
  if (options_.secure) {
    // Each worker its own certificate and token, and one for a worker a test registers itself.
    std::string workers = absl::StrCat(" --worker ", kSpareWorker);
    for (int i = 0; i < options_.workers; ++i) absl::StrAppend(&workers, " --worker w", i);
    CommandResult pki_made =
        RunCommand("bash " + RunfilePath("scripts/make_pki.sh") + workers + " " + pki());
    if (pki_made.exit_code != 0) {
      return absl::InternalError("make_pki.sh failed: " + pki_made.output);
    }
    const std::string p = pki();
    for (const std::string& flag :
         {"--tls_cert=" + p + "/server.pem", "--tls_key=" + p + "/server.key",
          "--tls_client_ca=" + p + "/ca.pem", "--token_file=" + p + "/tokens"}) {
      options_.coordinator_flags.push_back(flag);
    }
    for (const std::string& flag : {"--tls_ca=" + p + "/ca.pem", "--tls_cert=" + p + "/client.pem",
                                    "--tls_key=" + p + "/client.key",
                                    "--token_file=" + p + "/alice.token"}) {
      options_.trainctl_flags.push_back(flag);
    }
  }
  if (absl::Status started = StartCoordinator(0); !started.ok()) return started;
  coordinator_stub_ = v1::Coordinator::NewStub(Channel(SecurityFor("alice")));
  worker_stub_ = v1::WorkerControl::NewStub(Channel(SecurityFor(kSpareWorker)));
  const std::string roots = options_.roots.empty() ? TestTempDir() : options_.roots;
  for (int i = 0; i < options_.workers; ++i) {
    std::vector<std::string> argv = {
        RunfilePath("worker/worker"), "--coordinator=" + address_, "--device=cpu",
        absl::StrCat("--slots=", options_.slots_per_worker), absl::StrCat("--name=w", i),
        absl::StrCat("--work_dir=", dir_, "/w", i), "--data_root=" + roots,
        "--output_root=" + roots};
    if (options_.secure) {
      const std::string own = absl::StrCat(pki(), "/w", i);
      for (const std::string& flag : {"--tls_ca=" + pki() + "/ca.pem", "--tls_cert=" + own + ".pem",
                                      "--tls_key=" + own + ".key", "--token_file=" + own + ".token"}) {
        argv.push_back(flag);
      }
    }
    for (const std::string& flag : options_.worker_flags) argv.push_back(flag);
    worker_pids_.push_back(Spawn(argv, absl::StrCat(dir_, "/worker", i, ".log")));
  }
  for (int attempt = 0; attempt < 1200; ++attempt) {  // 30 s: a loaded CI machine is slow
    v1::ListWorkersResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (coordinator_stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response).ok() &&
        response.workers_size() == options_.workers) {
      return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return absl::UnavailableError("workers did not register; see " + dir_);
}

int LocalCluster::WaitForWorkerExit(int index, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(worker_pids_[index], &status, WNOHANG) == worker_pids_[index]) {
      worker_pids_[index] = -1;  // Reaped: nothing to kill at teardown.
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

std::vector<pid_t> LocalCluster::RankProcesses(const std::string& job_id, int rank) const {
  // Assignment files live in this cluster's worker directories, so concurrent tests (and their
  // identical job ids) do not see each other's ranks.
  return FindProcesses(absl::StrCat("run_rank=", dir_, "/w[0-9]*/", job_id, "-rank",
                                    rank < 0 ? std::string("[0-9]*") : absl::StrCat(rank), "-"));
}

CommandResult LocalCluster::Trainctl(const std::string& arguments) {
  return RunCommand(absl::StrCat(RunfilePath("client/trainctl"), " --coordinator=", address_, " ",
                                 absl::StrJoin(options_.trainctl_flags, " "), " ", arguments));
}

std::shared_ptr<grpc::Channel> LocalCluster::Channel(const ClientSecurity& security) const {
  auto channel = MakeCoordinatorChannel(address_, security);
  EXPECT_TRUE(channel.ok()) << channel.status();
  return channel.ok() ? *channel : grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
}

std::string LocalCluster::Submit(const std::string& spec_file) {
  CommandResult submitted = Trainctl("submit " + spec_file);
  if (submitted.exit_code != 0) {
    ADD_FAILURE() << "submit " << spec_file << " failed:\n" << submitted.output;
  }
  return LastLine(submitted.output);
}

absl::StatusOr<v1::Job> LocalCluster::WaitForJob(
    const std::string& job_id, const std::function<bool(const v1::Job&)>& predicate,
    double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  v1::Job last;
  while (std::chrono::steady_clock::now() < deadline) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::GetJobResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::Status status = coordinator_stub_->GetJob(&context, request, &response);
    if (status.ok()) {
      last = response.job();
      if (predicate(last)) return last;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("job ", job_id, " still ",
                                                  v1::JobState_Name(last.state()), " after ",
                                                  timeout_s, " s"));
}

absl::StatusOr<v1::Job> LocalCluster::WaitForEnd(const std::string& job_id, double timeout_s) {
  return WaitForJob(
      job_id,
      [](const v1::Job& job) {
        return job.state() == v1::SUCCEEDED || job.state() == v1::FAILED ||
               job.state() == v1::CANCELLED;
      },
      timeout_s);
}

}  // namespace mptrain::testing
