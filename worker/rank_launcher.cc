#include "worker/rank_launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace mptrain {

absl::StatusOr<pid_t> RankLauncher::Launch(const std::vector<std::string>& argv,
                                           const std::vector<std::string>& extra_env,
                                           int output_fd, int input_fd) {
  // Build everything the child needs before fork: only async-signal-safe calls after it.
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (char** entry = environ; *entry != nullptr; ++entry) env_storage.push_back(*entry);
  for (const std::string& entry : extra_env) env_storage.push_back(entry);
  std::vector<char*> env;
  for (std::string& entry : env_storage) env.push_back(entry.data());
  env.push_back(nullptr);
  const pid_t parent = getpid();

  // The daemon catches SIGTERM and SIGINT (its handler tells it to stop): held back across the
  // fork, so that one meant for the child before its exec is not taken by the daemon's
  // handler, but kills the child once it is back to the default.
  sigset_t stop_signals, previous;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &previous);
  pid_t pid = fork();
  if (pid != 0) pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) return absl::InternalError(absl::StrCat("fork failed: ", std::strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // The daemon died before prctl took effect.
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    sigaction(SIGTERM, &default_action, nullptr);
    sigaction(SIGINT, &default_action, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (output_fd >= 0) {
      dup2(output_fd, STDOUT_FILENO);
      dup2(output_fd, STDERR_FILENO);
    }
    if (input_fd >= 0) dup2(input_fd, STDIN_FILENO);
    execve(args[0], args.data(), env.data());
    _exit(127);
  }
  setpgid(pid, pid);  // Also from the parent, so that Signal() works even before the child runs.
  return pid;
}

void RankLauncher::Signal(pid_t pid, int signal) {
  if (kill(-pid, signal) != 0) kill(pid, signal);
}

std::vector<ExitedChild> RankLauncher::Reap() {
  std::vector<ExitedChild> exited;
  while (true) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    ExitedChild child;
    child.pid = pid;
    if (WIFEXITED(status)) child.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) child.term_signal = WTERMSIG(status);
    exited.push_back(child);
  }
  return exited;
}

}  // namespace mptrain
