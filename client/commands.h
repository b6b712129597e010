#pragma once

// trainctl's commands, each written against the generated StubInterface so that it runs the
// same against a real server or a test double. Each returns the process exit code: 0 on
// success, 1 when the coordinator refused or the job did not succeed, 2 for usage errors.

#include <iostream>
#include <string>

#include "proto/mptrain.grpc.pb.h"

namespace mptrain {

enum class OutputFormat { kTable, kJson };

struct CommandContext {
  v1::Coordinator::StubInterface* stub = nullptr;
  OutputFormat format = OutputFormat::kTable;
  int64_t rpc_timeout_ms = 10'000;
  std::ostream* out = &std::cout;
  std::ostream* err = &std::cerr;
  // `out` is a terminal: watch draws one progress line instead of a line per step.
  bool terminal = false;
  // Added to an error where the coordinator closed the connection at once (what a TLS
  // server does to a plaintext client, or mutual TLS to a client without a certificate):
  // which flag may be missing.
  std::string closed_connection_hint;
};

int SubmitCommand(const CommandContext& context, const std::string& spec_file, bool wait,
                  const std::string& request_id);
int StatusCommand(const CommandContext& context, const std::string& job_id);
int WatchCommand(const CommandContext& context, const std::string& job_id);
// Every job (or those in `state`, unless UNSPECIFIED), oldest first, fetched a page at a time;
// at most `limit` when > 0. JSON output is one job a line.
int ListCommand(const CommandContext& context, v1::JobState state, int64_t limit);
int CancelCommand(const CommandContext& context, const std::string& job_id);
int WorkersCommand(const CommandContext& context);
// The last part of a rank's output (stdout and stderr) as its worker shipped it; with
// `follow`, then what it writes next, until its process or the job ends. A rank with no output
// yet is waited for while its job has not ended; of an ended job, that is an error (exit 1).
// `attempt` 0: the newest.
int LogsCommand(const CommandContext& context, const std::string& job_id, int rank, int attempt,
                bool follow);
enum class ExportFormat { kCsv, kJsonl };
// The job's whole telemetry history as the coordinator holds it (GetJobEvents, page by page):
// CSV with a header row (every TelemetryRecord field, in field-number order) or one JSON object
// a line. Exit 1 when the coordinator refuses.
int ExportCommand(const CommandContext& context, const std::string& job_id, ExportFormat format);

}  // namespace mptrain
