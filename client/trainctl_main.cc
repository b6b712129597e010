// trainctl: the command-line client of the coordinator.
//
//   trainctl [--coordinator HOST:PORT] [--context NAME] [-o|--output table|json]
//            [--tls_ca ca.pem] [--token_file FILE] COMMAND   (kUsage below says all)
//     submit FILE [--wait] [--request_id ID]   queue a job (prints its id on the last line)
//     status ID                                 the job's state, placement, progress, telemetry
//     watch ID                                  live telemetry until the job ends
//     list [--state S] [--sort K] [--limit N]    jobs, newest first
//     cancel ID...                              cancel pending or running jobs
//     workers                                   registered workers
//     export ID [--format csv|jsonl]            the job's telemetry history
//     logs ID [--rank R] [--attempt A] [--follow]  the last part of a rank's output
//     config ...                                named contexts (client/client_config.h)
//     help [COMMAND]

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <map>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "client/client_config.h"
#include "client/commands.h"
#include "client/format.h"
#include "common/cli_flags.h"
#include "common/client_channel.h"
#include "common/client_security_flags.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, coordinator, "",
          "Coordinator address HOST:PORT (default: $MPTRAIN_COORDINATOR, else the context's, "
          "else 127.0.0.1:50051)");
ABSL_FLAG(std::string, context, "",
          "The config file's context to use (default: $MPTRAIN_CONTEXT, else its "
          "current-context)");
ABSL_FLAG(std::string, output, "table", "table or json (-o)");
ABSL_FLAG(bool, wait, false, "submit: follow the job and exit 0 only if it SUCCEEDED");
ABSL_FLAG(std::string, request_id, "", "submit: makes a retried submit idempotent");
ABSL_FLAG(int64_t, timeout_ms, 10'000, "Deadline of each RPC (watch has none)");
ABSL_FLAG(std::string, state, "", "list: only jobs in this state (e.g. running)");
ABSL_FLAG(std::string, sort, "newest", "list: newest, oldest, name, state or owner");
ABSL_FLAG(std::string, format, "",
          "export: csv or jsonl (default: csv, jsonl with --output json)");
ABSL_FLAG(int32_t, rank, 0, "logs: which rank");
ABSL_FLAG(int32_t, attempt, 0, "logs: which attempt (0 = the newest)");
ABSL_FLAG(bool, follow, false, "logs: keep printing what the rank writes until the job ends");
ABSL_FLAG(std::string, selector, "",
          "list, cancel: only jobs with these labels, KEY=VALUE[,KEY=VALUE...] (-l)");
ABSL_FLAG(int64_t, limit, 0, "list: at most this many jobs, after sorting (0 = all)");

ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_server_name);
ABSL_DECLARE_FLAG(std::string, token_file);

namespace {

constexpr char kUsage[] =
    "trainctl [--coordinator HOST:PORT] [--context NAME] [-o|--output table|json]\n"
    "          [--tls_ca FILE [--tls_cert FILE --tls_key FILE] [--tls_server_name NAME]]\n"
    "          [--token_file FILE] COMMAND\n"
    "  submit FILE [--wait] [--request_id ID]\n"
    "  status ID\n"
    "  watch ID\n"
    "  list [--state STATE] [-l KEY=VALUE,...] [--sort newest|oldest|name|state|owner]\n"
    "       [--limit N]\n"
    "  cancel ID... | cancel -l KEY=VALUE,...\n"
    "  workers\n"
    "  export ID [--format csv|jsonl]\n"
    "  logs ID [--rank R] [--attempt A] [--follow]\n"
    "  config get-contexts | current-context | use-context NAME |\n"
    "         set-context NAME [--coordinator A] [--tls_ca F] ... | delete-context NAME\n"
    "  help [COMMAND]\n"
    "Environment: MPTRAIN_COORDINATOR, MPTRAIN_CONTEXT, MPTRAIN_TLS_CA, MPTRAIN_TLS_CERT,\n"
    "MPTRAIN_TLS_KEY, MPTRAIN_TLS_SERVER_NAME, MPTRAIN_TOKEN_FILE, MPTRAIN_TOKEN (the token\n"
    "itself), MPTRAIN_CONFIG (the config file; default ~/.config/mptrain/config). A flag wins\n"
    "over the environment, the environment over the context.";

// `trainctl help VERB` and `trainctl VERB --help`.
const std::map<std::string, std::string>& VerbHelp() {
  static const auto* help = new std::map<std::string, std::string>{
      {"submit",
       "trainctl submit FILE [--wait] [--request_id ID]\n"
       "  Queues the job FILE (JSON) describes and prints its id on the last line. If no live\n"
       "  worker could start it now, says why on stderr.\n"
       "  --wait        follow the job (as watch, from its first step); exit 0 only if it\n"
       "                SUCCEEDED\n"
       "  --request_id  makes a retried submit idempotent (default: a random one)\n"},
      {"status",
       "trainctl status ID\n"
       "  The job's state, times, placement, progress and latest telemetry.\n"
       "  JSON: the Job message, every field present.\n"},
      {"watch",
       "trainctl watch ID\n"
       "  Live telemetry until the job ends (a progress line on a terminal); exit 0 only if it\n"
       "  SUCCEEDED. JSON: one WatchJobEvent a line.\n"},
      {"list",
       "trainctl list [--state STATE] [-l KEY=VALUE,...] [--sort newest|oldest|name|state|owner]\n"
       "              [--limit N]\n"
       "  Jobs (with -l: those with every label given), newest first by default, with owner, age, run time and the reason a job waits\n"
       "  or failed. JSON: {\"jobs\": [Job, ...], \"next_page_token\": \"\"}.\n"},
      {"cancel",
       "trainctl cancel ID...\n"
       "trainctl cancel -l KEY=VALUE,...\n"
       "  Cancels each job (with -l: every pending or running one with those labels); exit 1\n"
       "  if any was refused.\n"
       "  JSON: {\"jobs\": [{\"job_id\", \"state\", \"error\"}, ...]}.\n"},
      {"workers",
       "trainctl workers\n"
       "  Registered workers, live and lost, with their latest usage: MEM AVAIL is the host\n"
       "  memory their ranks could take now of what they could have at most, GPU USE each\n"
       "  device's memory used of its total and its utilization (n/a: not read, e.g. no NVML).\n"
       "  JSON: {\"workers\": [Worker, ...]} (Worker.usage, Worker.usage_unix_ms).\n"},
      {"export",
       "trainctl export ID [--format csv|jsonl]\n"
       "  The job's whole telemetry history: CSV with a header of every TelemetryRecord field\n"
       "  (NaN as nan), or one TelemetryRecord JSON object a line (NaN as \"NaN\"; the default\n"
       "  with --output json).\n"},
      {"logs",
       "trainctl logs ID [--rank R] [--attempt A] [--follow]\n"
       "  The last part of a rank's output. JSON: one GetRankLogResponse a line.\n"},
      {"config",
       "trainctl config get-contexts          the contexts, the current one marked *\n"
       "trainctl config current-context       the current context's name\n"
       "trainctl config use-context NAME      make NAME current\n"
       "trainctl config set-context NAME [--coordinator HOST:PORT] [--tls_ca F] [--tls_cert F]\n"
       "         [--tls_key F] [--tls_server_name N] [--token_file F]\n"
       "                                      make or change NAME (the flags given only)\n"
       "trainctl config delete-context NAME\n"
       "  The file: $MPTRAIN_CONFIG, else ~/.config/mptrain/config (written with mode 0600;\n"
       "  refused if others may read it).\n"},
  };
  return *help;
}

int Usage(const std::string& problem) {
  std::cerr << "trainctl: " << problem
            << " (trainctl --help tells the usage; trainctl help COMMAND, a command's)\n";
  return 2;
}

std::string FromEnvironment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// A flag if given, else the environment variable, else the context's value.
std::string Setting(const std::string& flag, const char* variable, const std::string& context) {
  if (!flag.empty()) return flag;
  std::string from_environment = FromEnvironment(variable);
  return from_environment.empty() ? context : from_environment;
}

int ConfigCommand(const std::vector<std::string>& args) {
  const std::string path = mptrain::ClientConfigPath();
  if (path.empty()) return Usage("config: set MPTRAIN_CONFIG or HOME");
  absl::StatusOr<mptrain::ClientConfig> config = mptrain::LoadClientConfig(path);
  if (!config.ok()) {
    std::cerr << "trainctl: " << config.status().message() << "\n";
    return 1;
  }
  const std::string verb = args.size() > 2 ? args[2] : "";
  if (verb == "get-contexts" && args.size() == 3) {
    std::vector<std::vector<std::string>> rows = {{"CURRENT", "NAME", "COORDINATOR"}};
    for (const mptrain::NamedContext& context : config->contexts) {
      rows.push_back({context.name == config->current_context ? "*" : "", context.name,
                      context.coordinator.empty() ? "-" : context.coordinator});
    }
    std::cout << (config->contexts.empty() ? "No contexts in " + path + ".\n"
                                           : mptrain::FormatTable(rows));
    return 0;
  }
  if (verb == "current-context" && args.size() == 3) {
    if (config->current_context.empty()) {
      std::cerr << "trainctl: " << path << " has no current-context\n";
      return 1;
    }
    std::cout << config->current_context << "\n";
    return 0;
  }
  if ((verb == "use-context" || verb == "delete-context" || verb == "set-context") &&
      args.size() == 4) {
    const std::string& name = args[3];
    mptrain::NamedContext* context = config->Find(name);
    if (verb == "use-context") {
      if (context == nullptr) {
        std::cerr << "trainctl: " << path << " has no context named " << name
                  << " (trainctl config get-contexts lists them)\n";
        return 1;
      }
      config->current_context = name;
    } else if (verb == "delete-context") {
      if (context == nullptr) {
        std::cerr << "trainctl: " << path << " has no context named " << name << "\n";
        return 1;
      }
      config->contexts.erase(config->contexts.begin() + (context - config->contexts.data()));
      if (config->current_context == name) config->current_context.clear();
    } else {
      if (context == nullptr) {
        config->contexts.push_back(mptrain::NamedContext{name});
        context = &config->contexts.back();
      }
      auto set = [](std::string* field, const std::string& value) {
        if (!value.empty()) *field = value;
      };
      set(&context->coordinator, absl::GetFlag(FLAGS_coordinator));
      set(&context->tls_ca, absl::GetFlag(FLAGS_tls_ca));
      set(&context->tls_cert, absl::GetFlag(FLAGS_tls_cert));
      set(&context->tls_key, absl::GetFlag(FLAGS_tls_key));
      set(&context->tls_server_name, absl::GetFlag(FLAGS_tls_server_name));
      set(&context->token_file, absl::GetFlag(FLAGS_token_file));
      if (config->current_context.empty()) config->current_context = name;
    }
    absl::Status saved = mptrain::SaveClientConfig(path, *config);
    if (!saved.ok()) return Usage(std::string(saved.message()));
    std::cout << verb << " " << name << ": done (" << path << ")\n";
    return 0;
  }
  return Usage("config takes get-contexts, current-context, use-context NAME, set-context NAME "
               "or delete-context NAME");
}

}  // namespace

int main(int argc, char** argv) {
  mptrain::CommandLineOptions options;
  options.usage = kUsage;
  options.short_flags = {{"o", "output"}, {"l", "selector"}};
  options.verb_help = [](const std::vector<std::string>& positional) -> std::string {
    if (positional.size() < 2) return "";
    auto verb = VerbHelp().find(positional[1]);
    return verb == VerbHelp().end() ? "" : verb->second;
  };
  std::vector<std::string> args = mptrain::ParseFlags(argc, argv, options);
  if (args.size() < 2) return Usage("missing command");
  const std::string command = args[1];
  if (command == "help") {
    if (args.size() == 2) {
      std::cout << "usage: " << kUsage << "\n\nflags:\n" << mptrain::FlagListing();
      return 0;
    }
    auto verb = VerbHelp().find(args[2]);
    if (args.size() != 3 || verb == VerbHelp().end()) {
      return Usage("help takes one command: submit, status, watch, list, cancel, workers, "
                   "export, logs or config");
    }
    std::cout << verb->second;
    return 0;
  }
  if (command == "config") return ConfigCommand(args);
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "table" && output != "json") return Usage("--output must be table or json");

  // Where to connect and how: a flag, else the environment, else the config file's context.
  mptrain::NamedContext context_settings;
  const std::string wanted_context =
      Setting(absl::GetFlag(FLAGS_context), "MPTRAIN_CONTEXT", "");
  const std::string config_path = mptrain::ClientConfigPath();
  if (!config_path.empty()) {
    absl::StatusOr<mptrain::ClientConfig> config = mptrain::LoadClientConfig(config_path);
    if (!config.ok()) {
      std::cerr << "trainctl: " << config.status().message() << "\n";
      return 1;
    }
    const std::string name = wanted_context.empty() ? config->current_context : wanted_context;
    if (!name.empty()) {
      const mptrain::NamedContext* found = config->Find(name);
      if (found == nullptr) {
        std::cerr << "trainctl: " << config_path << " has no context named " << name << "\n";
        return 1;
      }
      context_settings = *found;
    }
  } else if (!wanted_context.empty()) {
    return Usage("--context needs a config file (set MPTRAIN_CONFIG or HOME)");
  }
  absl::SetFlag(&FLAGS_tls_ca, Setting(absl::GetFlag(FLAGS_tls_ca), "MPTRAIN_TLS_CA",
                                       context_settings.tls_ca));
  absl::SetFlag(&FLAGS_tls_cert, Setting(absl::GetFlag(FLAGS_tls_cert), "MPTRAIN_TLS_CERT",
                                         context_settings.tls_cert));
  absl::SetFlag(&FLAGS_tls_key, Setting(absl::GetFlag(FLAGS_tls_key), "MPTRAIN_TLS_KEY",
                                        context_settings.tls_key));
  absl::SetFlag(&FLAGS_tls_server_name,
                Setting(absl::GetFlag(FLAGS_tls_server_name), "MPTRAIN_TLS_SERVER_NAME",
                        context_settings.tls_server_name));
  // MPTRAIN_TOKEN (the token itself) is read by ClientSecurityFromFlags when no file is named:
  // a token file from the context counts only where MPTRAIN_TOKEN is unset.
  std::string token_file = absl::GetFlag(FLAGS_token_file);
  if (token_file.empty()) token_file = FromEnvironment("MPTRAIN_TOKEN_FILE");
  if (token_file.empty() && FromEnvironment("MPTRAIN_TOKEN").empty()) {
    token_file = context_settings.token_file;
  }
  absl::SetFlag(&FLAGS_token_file, token_file);
  std::string coordinator = Setting(absl::GetFlag(FLAGS_coordinator), "MPTRAIN_COORDINATOR",
                                    context_settings.coordinator);
  if (coordinator.empty()) coordinator = "127.0.0.1:50051";

  absl::StatusOr<mptrain::ClientSecurity> security = mptrain::ClientSecurityFromFlags();
  if (!security.ok()) return Usage(std::string(security.status().message()));
  auto channel = mptrain::MakeCoordinatorChannel(coordinator, *security);
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
  std::map<std::string, std::string> selector;
  std::string selector_error;
  if (!mptrain::ParseLabelSelector(absl::GetFlag(FLAGS_selector), &selector, &selector_error)) {
    return Usage("-l/--selector: " + selector_error);
  }
  if (command == "cancel") {
    if (!selector.empty()) {
      if (args.size() != 2) return Usage("cancel takes job IDs or -l KEY=VALUE, not both");
      return mptrain::CancelSelectedCommand(context, selector);
    }
    if (args.size() < 3) return Usage("cancel takes one or more job IDs (or -l KEY=VALUE)");
    return mptrain::CancelCommand(context, {args.begin() + 2, args.end()});
  }
  if (command == "status" || command == "watch") {
    if (args.size() != 3) return Usage(command + " takes one job ID");
    if (command == "status") return mptrain::StatusCommand(context, args[2]);
    return mptrain::WatchCommand(context, args[2]);
  }
  if (command == "list" && args.size() == 2) {
    mptrain::ListOptions list;
    const std::string wanted = absl::AsciiStrToUpper(absl::GetFlag(FLAGS_state));
    if (!wanted.empty() && !mptrain::v1::JobState_Parse(wanted, &list.state)) {
      return Usage("--state must be pending, running, succeeded, failed or cancelled");
    }
    if (!mptrain::ParseJobSort(absl::GetFlag(FLAGS_sort), &list.sort)) {
      return Usage("--sort must be newest, oldest, name, state or owner");
    }
    list.limit = absl::GetFlag(FLAGS_limit);
    list.labels = selector;
    if (list.limit < 0) return Usage("--limit must be >= 0");
    return mptrain::ListCommand(context, list);
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
    std::string format = absl::GetFlag(FLAGS_format);
    if (format.empty()) format = output == "json" ? "jsonl" : "csv";
    if (format != "csv" && format != "jsonl") return Usage("--format must be csv or jsonl");
    return mptrain::ExportCommand(
        context, args[2],
        format == "csv" ? mptrain::ExportFormat::kCsv : mptrain::ExportFormat::kJsonl);
  }
  return Usage("unknown command or arguments: " + command);
}
