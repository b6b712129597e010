#pragma once

// trainctl's commands, each written against the generated StubInterface so that it runs the
// same against a real server or a test double. Each returns the process exit code: 0 on
// success, 1 when the coordinator refused or the job did not succeed, 2 for usage errors.

#include <iostream>
#include <map>
#include <string>
#include <vector>

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
  // The clock of AGE and DURATION columns (tests set it).
  int64_t fixed_now_unix_ms = 0;
  int64_t now_unix_ms() const;
};

int SubmitCommand(const CommandContext& context, const std::string& spec_file, bool wait,
                  const std::string& request_id);
int StatusCommand(const CommandContext& context, const std::string& job_id);
int WatchCommand(const CommandContext& context, const std::string& job_id);
enum class JobSort { kNewest, kOldest, kName, kState, kOwner };
// "newest", "oldest", "name", "state", "owner"; false for anything else.
bool ParseJobSort(const std::string& name, JobSort* sort);
struct ListOptions {
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;  // UNSPECIFIED: every state.
  int64_t limit = 0;                                // > 0: at most this many, after sorting.
  JobSort sort = JobSort::kNewest;
  std::map<std::string, std::string> labels;  // Only jobs with every one of these labels.
};
// The jobs, fetched a page at a time, then sorted (ties in submission order) and cut to
// `limit`. Table: FormatJobTable ("No jobs." for none); JSON: one ListJobsResponse object
// {"jobs": [...], "next_page_token": ""}.
int ListCommand(const CommandContext& context, const ListOptions& options);
// Cancels each job in turn, whatever became of the others; exit 1 if any was refused. JSON:
// {"jobs": [{"job_id", "state", "error"}, ...]} in the order given.
int CancelCommand(const CommandContext& context, const std::vector<std::string>& job_ids);
// Cancels every pending or running job that has all of `labels` (`cancel -l team=vision`);
// none matching is not an error. Output as CancelCommand's.
int CancelSelectedCommand(const CommandContext& context,
                          const std::map<std::string, std::string>& labels);
// "team=vision,env=prod" as a map; false (and `error` set) for a pair without '='.
bool ParseLabelSelector(const std::string& text, std::map<std::string, std::string>* labels,
                        std::string* error);
int WorkersCommand(const CommandContext& context);
// The last part of a rank's output (stdout and stderr) as its worker shipped it (JSON: one
// GetRankLogResponse object a line, every field present); with
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
