#pragma once

// A real coordinator and real worker daemons on loopback, started as child processes from the
// built binaries, for integration tests. Everything is killed when the cluster is destroyed.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/client_channel.h"
#include "proto/mptrain.grpc.pb.h"

namespace mptrain::testing {

// Path of a binary of this workspace in the test's runfiles, e.g. "coordinator/coordinator".
std::string RunfilePath(const std::string& relative);

// A writable scratch directory for this test.
std::string TestTempDir();

// `principal`'s part of the default worker roots (TestTempDir()): where the jobs of a user
// (alice is the cluster's trainctl) may write, common/tenant_paths.h. Created when missing.
std::string OutputPartOf(const std::string& principal);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line and captures its output.
CommandResult RunCommand(const std::string& command_line);

// pids of processes whose command line contains `pattern` (pgrep -f).
std::vector<pid_t> FindProcesses(const std::string& pattern);

// Writes a job spec into the test's scratch directory; returns its path.
std::string WriteSpec(const std::string& name, const std::string& json);

// The last non-empty line (trainctl prints the job id there).
std::string LastLine(const std::string& text);

class LocalCluster {
 public:
  // The name of the worker credentials no daemon uses: worker_control()'s, for a test that
  // registers a worker of its own (under this name, the only one they register).
  static constexpr char kSpareWorker[] = "spare";

  struct Options {
    double heartbeat_timeout_s = 10;
    int workers = 2;
    int slots_per_worker = 1;
    // Mutual TLS and tokens everywhere (a fresh CA, certificates and tokens from
    // scripts/make_pki.sh): trainctl and coordinator() act as the user alice, each daemon wI as
    // the worker wI (its own certificate and token), worker_control() as the worker
    // kSpareWorker. Off: plaintext loopback without tokens.
    bool secure = true;
    // Extra flags: the coordinator's, each worker daemon's (its ranks inherit them) and
    // trainctl's.
    std::vector<std::string> coordinator_flags;
    std::vector<std::string> worker_flags;
    std::vector<std::string> trainctl_flags;
    // Worker data and output roots; default: the test's scratch directory.
    std::string roots;
  };
  explicit LocalCluster(Options options);
  ~LocalCluster();

  // Starts the coordinator and the workers; waits until every worker has registered.
  absl::Status Start();
  std::string address() const { return address_; }
  // The directory holding the coordinator's and workers' logs.
  std::string dir() const { return dir_; }
  // Where the CA, certificates and tokens are (secure clusters).
  std::string pki() const { return dir_ + "/pki"; }
  // How a client holding `principal`'s token connects (admin, alice, bob, viewer, a worker's
  // name wI or kSpareWorker; "" = no token), with the cluster's CA and, when secure, the
  // worker's own client certificate or else the users'.
  ClientSecurity SecurityFor(const std::string& principal) const;
  v1::Coordinator::Stub* coordinator() { return coordinator_stub_.get(); }
  v1::WorkerControl::Stub* worker_control() { return worker_stub_.get(); }
  pid_t worker_pid(int index) const { return worker_pids_[index]; }
  pid_t coordinator_pid() const { return coordinator_pid_; }
  // kill -9 of the coordinator (workers and ranks keep running).
  void KillCoordinator();
  // kill -9, then a new coordinator on the same port and state directory.
  absl::Status RestartCoordinator();
  // Waits up to timeout_s for worker `index` to exit; returns its exit code (-1 if it did not
  // exit normally or in time).
  int WaitForWorkerExit(int index, double timeout_s);

  // pids of this cluster's rank processes of `job_id` (of one rank, or all with rank < 0).
  std::vector<pid_t> RankProcesses(const std::string& job_id, int rank = -1) const;

  // Runs trainctl against this cluster with the given arguments (after trainctl_flags).
  CommandResult Trainctl(const std::string& arguments);
  // Opens another channel to the coordinator, e.g. as another principal.
  std::shared_ptr<grpc::Channel> Channel(const ClientSecurity& security) const;
  // `trainctl submit FILE`, expecting success; returns the job id.
  std::string Submit(const std::string& spec_file);
  // Polls GetJob until `predicate` holds or timeout; returns the last job seen.
  absl::StatusOr<v1::Job> WaitForJob(const std::string& job_id,
                                     const std::function<bool(const v1::Job&)>& predicate,
                                     double timeout_s);
  // Waits until the job reaches a terminal state.
  absl::StatusOr<v1::Job> WaitForEnd(const std::string& job_id, double timeout_s);

 private:
  pid_t Spawn(const std::vector<std::string>& argv, const std::string& log_file);
  absl::Status StartCoordinator(int port);  // port 0: any free one

  Options options_;
  std::string dir_;
  std::string address_;
  pid_t coordinator_pid_ = 0;
  std::vector<pid_t> worker_pids_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_stub_;
  std::unique_ptr<v1::WorkerControl::Stub> worker_stub_;
};

}  // namespace mptrain::testing
