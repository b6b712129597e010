// trainctl: the command-line client of the coordinator.
//
//   trainctl [--coordinator HOST:PORT] [--output table|json] [--tls_ca ca.pem]
//            [--token_file FILE] COMMAND
//     submit FILE [--wait] [--request_id ID]   queue a job (prints its id on the last line)
//     status ID                                 the job's state, placement, progress, telemetry
//     watch ID                                  live telemetry until the job ends
//     list [--state S] [--limit N]               jobs, oldest first, fetched a page at a time
//     cancel ID                                 cancel a pending or running job
//     workers                                   registered workers
//     export ID [--format csv|jsonl]            the job's telemetry history
//     logs ID [--rank R] [--attempt A] [--follow]  the last part of a rank's output

#include <unistd.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "client/commands.h"
#include "common/cli_flags.h"
#include "common/client_channel.h"
#include "common/client_security_flags.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051", "Coordinator address HOST:PORT");
ABSL_FLAG(std::string, output, "table", "table or json");
ABSL_FLAG(bool, wait, false, "submit: follow the job and exit 0 only if it SUCCEEDED");
ABSL_FLAG(std::string, request_id, "", "submit: makes a retried submit idempotent");
ABSL_FLAG(int64_t, timeout_ms, 10'000, "Deadline of each RPC (watch has none)");
ABSL_FLAG(std::string, state, "", "list: only jobs in this state (e.g. running)");
ABSL_FLAG(std::string, format, "csv", "export: csv or jsonl");
ABSL_FLAG(int32_t, rank, 0, "logs: which rank");
ABSL_FLAG(int32_t, attempt, 0, "logs: which attempt (0 = the newest)");
ABSL_FLAG(bool, follow, false, "logs: keep printing what the rank writes until the job ends");
ABSL_FLAG(int64_t, limit, 0, "list: at most this many jobs, oldest first (0 = all)");

namespace {

constexpr char kUsage[] =
    "trainctl [--coordinator HOST:PORT] [--output table|json] [--tls_ca FILE [--tls_cert FILE\n"
    "          --tls_key FILE] [--tls_server_name NAME]] [--token_file FILE] COMMAND\n"
    "  (the token may also come from the MPTRAIN_TOKEN environment variable)\n"
    "  submit FILE [--wait] [--request_id ID]\n"
    "  status ID\n"
    "  watch ID\n"
    "  list [--state STATE] [--limit N]\n"
    "  cancel ID\n"
    "  workers\n"
    "  export ID [--format csv|jsonl]\n"
    "  logs ID [--rank R] [--attempt A] [--follow]";

int Usage(const std::string& problem) {
  std::cerr << "trainctl: " << problem << "\nusage: " << kUsage << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args = mptrain::ParseFlags(argc, argv, kUsage);
  if (args.size() < 2) return Usage("missing command");
  const std::string command = args[1];
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "table" && output != "json") return Usage("--output must be table or json");

  absl::StatusOr<mptrain::ClientSecurity> security = mptrain::ClientSecurityFromFlags();
  if (!security.ok()) return Usage(std::string(security.status().message()));
  auto channel = mptrain::MakeCoordinatorChannel(absl::GetFlag(FLAGS_coordinator), *security);
  if (!channel.ok()) return Usage(std::string(channel.status().message()));
  std::unique_ptr<mptrain::v1::Coordinator::Stub> stub =
      mptrain::v1::Coordinator::NewStub(*channel);
  mptrain::CommandContext context;
  context.stub = stub.get();
  context.format = output == "json" ? mptrain::OutputFormat::kJson : mptrain::OutputFormat::kTable;
  context.rpc_timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  context.terminal = isatty(STDOUT_FILENO) == 1;
  if (security->tls_ca.empty()) {
    context.closed_connection_hint =
        "(the coordinator closed the connection: if it serves TLS, pass --tls_ca, and "
        "--tls_cert and --tls_key if it asks for a client certificate)";
  } else if (security->tls_cert.empty()) {
    context.closed_connection_hint =
        "(the coordinator closed the connection: if it requires a client certificate (mutual "
        "TLS), pass --tls_cert and --tls_key)";
  }

  if (command == "submit") {
    if (args.size() != 3) return Usage("submit takes one FILE");
    return mptrain::SubmitCommand(context, args[2], absl::GetFlag(FLAGS_wait),
                                  absl::GetFlag(FLAGS_request_id));
  }
  if (command == "status" || command == "watch" || command == "cancel") {
    if (args.size() != 3) return Usage(command + " takes one job ID");
    if (command == "status") return mptrain::StatusCommand(context, args[2]);
    if (command == "watch") return mptrain::WatchCommand(context, args[2]);
    return mptrain::CancelCommand(context, args[2]);
  }
  if (command == "list" && args.size() == 2) {
    mptrain::v1::JobState state = mptrain::v1::JOB_STATE_UNSPECIFIED;
    const std::string wanted = absl::AsciiStrToUpper(absl::GetFlag(FLAGS_state));
    if (!wanted.empty() && !mptrain::v1::JobState_Parse(wanted, &state)) {
      return Usage("--state must be pending, running, succeeded, failed or cancelled");
    }
    if (absl::GetFlag(FLAGS_limit) < 0) return Usage("--limit must be >= 0");
    return mptrain::ListCommand(context, state, absl::GetFlag(FLAGS_limit));
  }
  if (command == "workers" && args.size() == 2) return mptrain::WorkersCommand(context);
  if (command == "logs" && args.size() == 3) {
    if (absl::GetFlag(FLAGS_rank) < 0 || absl::GetFlag(FLAGS_attempt) < 0) {
      return Usage("--rank and --attempt must be >= 0");
    }
    return mptrain::LogsCommand(context, args[2], absl::GetFlag(FLAGS_rank),
                                absl::GetFlag(FLAGS_attempt), absl::GetFlag(FLAGS_follow));
  }
  if (command == "export" && args.size() == 3) {
    const std::string format = absl::GetFlag(FLAGS_format);
    if (format != "csv" && format != "jsonl") return Usage("--format must be csv or jsonl");
    return mptrain::ExportCommand(
        context, args[2],
        format == "csv" ? mptrain::ExportFormat::kCsv : mptrain::ExportFormat::kJsonl);
  }
  return Usage("unknown command or arguments: " + command);
}
