#include "client/commands.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "client/format.h"
#include "common/job_spec.h"
#include "common/secrets.h"
#include "nlohmann/json.hpp"

namespace mptrain {
namespace {

constexpr int kListPageSize = 500;

void SetDeadline(const CommandContext& context, grpc::ClientContext* rpc) {
  rpc->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(context.rpc_timeout_ms));
}

// One line, no stack trace: what failed, the code and the server's message.
int ReportRpcError(const CommandContext& context, const std::string& what,
                   const grpc::Status& status) {
  std::string code;
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE: code = "UNAVAILABLE"; break;
    case grpc::StatusCode::DEADLINE_EXCEEDED: code = "DEADLINE_EXCEEDED"; break;
    case grpc::StatusCode::INVALID_ARGUMENT: code = "INVALID_ARGUMENT"; break;
    case grpc::StatusCode::NOT_FOUND: code = "NOT_FOUND"; break;
    case grpc::StatusCode::FAILED_PRECONDITION: code = "FAILED_PRECONDITION"; break;
    case grpc::StatusCode::UNAUTHENTICATED: code = "UNAUTHENTICATED"; break;
    case grpc::StatusCode::PERMISSION_DENIED: code = "PERMISSION_DENIED"; break;
    case grpc::StatusCode::ALREADY_EXISTS: code = "ALREADY_EXISTS"; break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: code = "RESOURCE_EXHAUSTED"; break;
    default: code = absl::StrCat("code ", static_cast<int>(status.error_code()));
  }
  *context.err << "trainctl: " << what << " failed: " << code << ": " << status.error_message()
               << "\n";
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE &&
      status.error_message().find("Socket closed") != std::string::npos &&
      !context.closed_connection_hint.empty()) {
    *context.err << "trainctl: " << context.closed_connection_hint << "\n";
  }
  return 1;
}

// One line redrawn in place on a terminal: "[#####-----]  40/100 steps  2.5 steps/s  ETA 24 s".
class ProgressLine {
 public:
  explicit ProgressLine(std::ostream* out) : out_(out) {}
  void SetTotal(int64_t steps) { total_ = steps; }
  void Update(const v1::TelemetryRecord& record) {
    const double rate = Rate(record);
    constexpr int kWidth = 24;
    const double fraction =
        total_ > 0 ? std::clamp(static_cast<double>(record.step()) / total_, 0.0, 1.0) : 0;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string line = absl::StrCat("[", std::string(filled, '#'), std::string(kWidth - filled, '-'),
                                    "] ", record.step(), "/", total_, " steps");
    if (rate > 0) {
      absl::StrAppend(&line, absl::StrFormat("  %.3g steps/s  ETA %s", rate,
                                             FormatSeconds((total_ - record.step()) / rate)));
    }
    absl::StrAppend(&line, absl::StrFormat("  loss %.6g  scale %g%s", record.loss(),
                                           record.loss_scale(),
                                           record.skipped_total() > 0
                                               ? absl::StrCat("  skipped ", record.skipped_total())
                                               : ""));
    *out_ << "\r\x1b[2K" << line << std::flush;
    drawn_ = true;
  }
  // Forgets the arrivals so far (a replayed history arrives at once: it says nothing of the
  // rate).
  void Rebase() { arrivals_.clear(); }
  // Ends the line so that what follows starts on its own.
  void Finish() {
    if (drawn_) *out_ << "\n";
    drawn_ = false;
  }

 private:
  static std::string FormatSeconds(double seconds) {
    if (seconds < 90) return absl::StrFormat("%.0f s", seconds);
    if (seconds < 5400) return absl::StrFormat("%.0f min", seconds / 60);
    return absl::StrFormat("%.1f h", seconds / 3600);
  }
  // Steps per second over the last ~30 s of arrivals (10 s made the ETA jump between 19 s
  // and 2 min from one step to the next). Records come in batches (a rank sends
  // every 0.5 s; a watch opens with the job's history at once): a batch counts as its last
  // step at its arrival, so the rate spans whole batches. Until arrivals span 1.5 s, the
  // rate is the step time's.
  double Rate(const v1::TelemetryRecord& record) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point now = Clock::now();
    if (!arrivals_.empty() && now - arrivals_.back().first < std::chrono::milliseconds(50)) {
      arrivals_.back().second = std::max(arrivals_.back().second, record.step());
    } else {
      arrivals_.emplace_back(now, record.step());
    }
    while (arrivals_.size() > 2 && now - arrivals_[1].first >= std::chrono::seconds(30)) {
      arrivals_.pop_front();
    }
    const double span = std::chrono::duration<double>(now - arrivals_.front().first).count();
    if (span >= 1.5) return (record.step() - arrivals_.front().second) / span;
    return record.step_time_ms() > 0 ? 1000.0 / record.step_time_ms() : 0;
  }

  std::ostream* out_;
  int64_t total_ = 0;
  // (arrival, the highest step that had arrived then), oldest first.
  std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> arrivals_;
  bool drawn_ = false;
};

// How long a watch keeps reconnecting to a coordinator that went away (a restart takes a few
// seconds) before it gives up with the error.
constexpr auto kWatchReconnectFor = std::chrono::seconds(60);

// Streams WatchJob, printing each event; returns the terminal state seen (or UNSPECIFIED).
// What happened before a stream's snapshot and after the last event printed is fetched from
// the job's history (GetJobEvents) and printed first: with `from_start` (submit --wait: every
// step of a job that may have run, or even ended, before the watch opened), and after a
// reconnect (a stream the coordinator dropped — UNAVAILABLE: it restarted, or the network
// failed — is opened again for up to kWatchReconnectFor). A snapshot's state is printed only
// if it is not the state printed last, and an attempt's steps only once.
v1::JobState FollowJob(const CommandContext& context, const std::string& job_id, bool from_start,
                       int* exit_code) {
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  bool seen = false;          // A snapshot came.
  bool state_shown = false;   // `last` was printed.
  int64_t last_sequence = 0;  // Of the last event handled.
  int64_t last_step = 0;      // The last telemetry step printed, and its attempt.
  int32_t last_attempt = 0;
  std::string error;
  const bool progress_bar = context.format == OutputFormat::kTable && context.terminal;
  ProgressLine progress(context.out);
  auto reconnect_until = std::chrono::steady_clock::now() + kWatchReconnectFor;
  bool told_reconnecting = false;

  // Prints one event (from the stream or the history) unless it repeats what was printed.
  auto show = [&](const v1::WatchJobEvent& event) {
    if (event.event_case() != v1::WatchJobEvent::kSnapshot) {
      last_sequence = std::max(last_sequence, event.sequence());
    }
    const bool first_snapshot = event.event_case() == v1::WatchJobEvent::kSnapshot && !seen;
    const bool repeated =
        (event.event_case() == v1::WatchJobEvent::kSnapshot && state_shown &&
         event.snapshot().state() == last &&
         !(first_snapshot && context.format == OutputFormat::kJson)) ||
        (event.event_case() == v1::WatchJobEvent::kStateChange && state_shown &&
         event.state_change().state() == last) ||
        (event.event_case() == v1::WatchJobEvent::kTelemetry &&
         event.telemetry().attempt() == last_attempt && event.telemetry().step() <= last_step);
    if (event.event_case() == v1::WatchJobEvent::kSnapshot) seen = true;
    if (repeated) return;
    if (progress_bar && event.event_case() != v1::WatchJobEvent::kTelemetry) progress.Finish();
    if (context.format == OutputFormat::kJson) *context.out << ToJson(event, false) << "\n";
    switch (event.event_case()) {
      case v1::WatchJobEvent::kSnapshot:
      case v1::WatchJobEvent::kStateChange: {
        const bool snapshot = event.event_case() == v1::WatchJobEvent::kSnapshot;
        last = snapshot ? event.snapshot().state() : event.state_change().state();
        error = snapshot ? event.snapshot().error() : event.state_change().error();
        state_shown = true;
        if (context.format == OutputFormat::kTable) {
          // A snapshot's error too where the job has ended (a watch of a FAILED job says
          // why); a running one's snapshot error is an earlier attempt's.
          const bool ended = last == v1::FAILED || last == v1::CANCELLED;
          *context.out << job_id << " " << ShortState(last)
                       << ((snapshot && !ended) || error.empty() ? "" : ": " + error) << "\n";
          if (snapshot && (ended || last == v1::SUCCEEDED)) {
            // A job that had ended before the watch opened: no step will follow, so what it
            // came to (steps, final loss, checksums) is said here rather than only its state.
            *context.out << job_id << " summary: " << FormatJobSummary(event.snapshot())
                         << "\n";
          }
        }
        break;
      }
      case v1::WatchJobEvent::kTelemetry:
        last_step = event.telemetry().step();
        last_attempt = event.telemetry().attempt();
        if (progress_bar) {
          progress.Update(event.telemetry());
        } else if (context.format == OutputFormat::kTable) {
          *context.out << FormatTelemetryLine(event.telemetry()) << "\n";
        }
        break;
      case v1::WatchJobEvent::kNote:
        if (context.format == OutputFormat::kTable) {
          const v1::RankNote& note = event.note();
          *context.out << (note.kind() == v1::RankNote::SAMPLE ? "sample" : "warning")
                       << " (rank " << note.rank() << ", step " << note.step() << "): "
                       << note.text() << "\n";
        }
        break;
      default:
        break;
    }
    context.out->flush();
  };
  // The history after `after` up to the snapshot's sequence `until`, page by page.
  auto replay = [&](int64_t after, int64_t until) {
    v1::GetJobEventsRequest history;
    history.set_job_id(job_id);
    history.set_after_sequence(after);
    while (history.after_sequence() < until) {
      v1::GetJobEventsResponse response;
      grpc::ClientContext rpc;
      SetDeadline(context, &rpc);
      grpc::Status status = context.stub->GetJobEvents(&rpc, history, &response);
      if (!status.ok()) {  // The live events still come: say what is missing, go on.
        *context.err << "trainctl: watch " << job_id << ": events "
                     << history.after_sequence() + 1 << " to " << until
                     << " not shown: " << status.error_message() << "\n";
        return;
      }
      if (response.events().empty()) return;
      for (const v1::WatchJobEvent& event : response.events()) {
        if (event.sequence() > until) return;
        show(event);
        history.set_after_sequence(event.sequence());
      }
    }
  };

  while (true) {
    grpc::ClientContext rpc;  // No deadline: a watch lasts as long as the job.
    std::unique_ptr<grpc::ClientReaderInterface<v1::WatchJobEvent>> reader =
        context.stub->WatchJob(&rpc, request);
    v1::WatchJobEvent event;
    while (reader->Read(&event)) {
      reconnect_until = std::chrono::steady_clock::now() + kWatchReconnectFor;
      told_reconnecting = false;
      if (event.event_case() == v1::WatchJobEvent::kSnapshot) {
        progress.SetTotal(event.snapshot().spec().steps());
        const bool missed = (seen || from_start) && event.sequence() > last_sequence;
        // JSON keeps the stream's order (the snapshot first, then the events: here the
        // history up to it); a table shows the history, then the state if it changed.
        const bool json = context.format == OutputFormat::kJson;
        if (json) show(event);
        if (missed) {
          replay(last_sequence, event.sequence());
          progress.Rebase();  // The history came at once: no rate from it.
        }
        last_sequence = std::max(last_sequence, event.sequence());
        if (!json) show(event);
        continue;
      }
      show(event);
    }
    grpc::Status status = reader->Finish();
    const bool ended = last == v1::SUCCEEDED || last == v1::FAILED || last == v1::CANCELLED;
    // Only a stream that worked (a snapshot came): a wrong address fails at once.
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && seen && !ended &&
        std::chrono::steady_clock::now() < reconnect_until) {
      if (!told_reconnecting) {
        progress.Finish();
        *context.err << "trainctl: watch " << job_id << ": " << status.error_message()
                     << "; reconnecting\n";
        told_reconnecting = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    progress.Finish();
    if (!status.ok()) {
      *exit_code = ReportRpcError(context, "watch " + job_id, status);
      return last;
    }
    *exit_code = last == v1::SUCCEEDED ? 0 : 1;
    return last;
  }
}

// A job that waits at once (no live worker of its kind, more ranks than slots, all busy) is
// said so on stderr, with the coordinator's reason: a job that cannot run must not look as if
// it were about to.
void WarnIfCannotStart(const CommandContext& context, const std::string& job_id,
                       const v1::JobSpec& spec) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::GetJobResponse response;
  grpc::ClientContext rpc;
  SetDeadline(context, &rpc);
  if (!context.stub->GetJob(&rpc, request, &response).ok()) return;  // The id still prints.
  const v1::Job& job = response.job();
  if (job.state() != v1::PENDING || job.pending_reason().empty()) return;
  *context.err << "trainctl: " << job_id << " cannot start now: " << job.pending_reason()
               << (spec.queue_timeout_s() > 0
                       ? absl::StrFormat(" (it fails if not placed within queue_timeout_s %g)",
                                         spec.queue_timeout_s())
                       : std::string(" (it waits until it can be placed; queue_timeout_s "
                                     "makes it fail instead)"))
               << "\n";
}

}  // namespace

// A submit is sent this many times while the coordinator is UNAVAILABLE or the answer does not
// come (0.5, 1, 1.5, 2 s apart: a restart takes a few seconds), always with the same request
// id.
constexpr int kSubmitAttempts = 5;

int SubmitCommand(const CommandContext& context, const std::string& spec_file, bool wait,
                  const std::string& request_id) {
  auto spec = LoadJobSpecFile(spec_file);
  if (!spec.ok()) {
    *context.err << "trainctl: " << spec.status().message() << "\n";
    return 2;
  }
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *spec;
  // Always idempotent: a submit whose answer was lost (the coordinator restarted after storing
  // the job) is sent again with the same id and answered with the job it made.
  request.set_request_id(request_id.empty() ? absl::StrCat("trainctl-", RandomSecret())
                                            : request_id);
  v1::SubmitJobResponse response;
  grpc::Status status;
  for (int attempt = 1; attempt <= kSubmitAttempts; ++attempt) {
    grpc::ClientContext rpc;
    SetDeadline(context, &rpc);
    status = context.stub->SubmitJob(&rpc, request, &response);
    // DEADLINE_EXCEEDED too: the answer may be what was lost (the request id makes it safe).
    const bool retry = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!retry || attempt == kSubmitAttempts) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500 * attempt));
  }
  if (!status.ok()) return ReportRpcError(context, "submit " + spec_file, status);
  if (response.state() == v1::PENDING) WarnIfCannotStart(context, response.job_id(), *spec);
  if (context.format == OutputFormat::kJson && !wait) {
    *context.out << ToJson(response) << "\n";
  }
  if (!wait) {
    if (context.format == OutputFormat::kTable) *context.out << response.job_id() << "\n";
    return 0;
  }
  int exit_code = 1;
  FollowJob(context, response.job_id(), /*from_start=*/true, &exit_code);
  // The job id stays the last line, as without --wait.
  if (context.format == OutputFormat::kTable) *context.out << response.job_id() << "\n";
  return exit_code;
}

int StatusCommand(const CommandContext& context, const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::GetJobResponse response;
  grpc::ClientContext rpc;
  SetDeadline(context, &rpc);
  grpc::Status status = context.stub->GetJob(&rpc, request, &response);
  if (!status.ok()) return ReportRpcError(context, "status " + job_id, status);
  *context.out << (context.format == OutputFormat::kJson ? ToJson(response.job()) + "\n"
                                                         : FormatJobDetail(response.job()));
  return 0;
}

int WatchCommand(const CommandContext& context, const std::string& job_id) {
  int exit_code = 1;
  FollowJob(context, job_id, /*from_start=*/false, &exit_code);
  return exit_code;
}

bool ParseJobSort(const std::string& name, JobSort* sort) {
  static const std::pair<const char*, JobSort> kSorts[] = {
      {"newest", JobSort::kNewest}, {"oldest", JobSort::kOldest}, {"name", JobSort::kName},
      {"state", JobSort::kState},   {"owner", JobSort::kOwner}};
  for (const auto& [spelling, value] : kSorts) {
    if (name == spelling) {
      *sort = value;
      return true;
    }
  }
  return false;
}

int ListCommand(const CommandContext& context, const ListOptions& options) {
  // Every page first (each answer stays small however many jobs there are: the coordinator
  // bounds how many it keeps), then sorted here: the coordinator pages oldest first.
  v1::ListJobsRequest request;
  request.set_state(options.state);
  request.set_page_size(kListPageSize);
  request.mutable_label_selector()->insert(options.labels.begin(), options.labels.end());
  std::vector<v1::Job> jobs;
  while (true) {
    v1::ListJobsResponse page;
    grpc::ClientContext rpc;
    SetDeadline(context, &rpc);
    grpc::Status status = context.stub->ListJobs(&rpc, request, &page);
    if (!status.ok()) return ReportRpcError(context, "list", status);
    for (v1::Job& job : *page.mutable_jobs()) jobs.push_back(std::move(job));
    if (page.next_page_token().empty()) break;
    request.set_page_token(page.next_page_token());
  }
  // Submission order is the pages' order (ids are numbered): a stable sort keeps it as the
  // tie-break of every key.
  auto newest_first = [](const v1::Job& a, const v1::Job& b) {
    return a.submitted_unix_ms() > b.submitted_unix_ms();
  };
  switch (options.sort) {
    case JobSort::kNewest:
      std::reverse(jobs.begin(), jobs.end());
      std::stable_sort(jobs.begin(), jobs.end(), newest_first);
      break;
    case JobSort::kOldest:
      break;
    case JobSort::kName:
      std::stable_sort(jobs.begin(), jobs.end(), [](const v1::Job& a, const v1::Job& b) {
        return a.spec().name() < b.spec().name();
      });
      break;
    case JobSort::kState:
      std::stable_sort(jobs.begin(), jobs.end(), [](const v1::Job& a, const v1::Job& b) {
        return a.state() < b.state();
      });
      break;
    case JobSort::kOwner:
      std::stable_sort(jobs.begin(), jobs.end(), [](const v1::Job& a, const v1::Job& b) {
        return a.owner() < b.owner();
      });
      break;
  }
  if (options.limit > 0 && static_cast<int64_t>(jobs.size()) > options.limit) {
    jobs.resize(options.limit);
  }
  if (context.format == OutputFormat::kJson) {
    v1::ListJobsResponse all;  // {"jobs": [...], "next_page_token": ""}: one shape.
    for (v1::Job& job : jobs) *all.add_jobs() = std::move(job);
    *context.out << ToJson(all) << "\n";
    return 0;
  }
  *context.out << FormatJobTable(jobs, context.now_unix_ms());
  return 0;
}

int CancelCommand(const CommandContext& context, const std::vector<std::string>& job_ids) {
  // Each id is tried, whatever became of the others; exit 1 if any was refused.
  nlohmann::json results = nlohmann::json::array();
  int exit_code = 0;
  for (const std::string& job_id : job_ids) {
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    v1::CancelJobResponse response;
    grpc::ClientContext rpc;
    SetDeadline(context, &rpc);
    grpc::Status status = context.stub->CancelJob(&rpc, request, &response);
    if (!status.ok()) {
      exit_code = ReportRpcError(context, "cancel " + job_id, status);
      results.push_back({{"job_id", job_id}, {"state", ""}, {"error", status.error_message()}});
      continue;
    }
    results.push_back(
        {{"job_id", job_id}, {"state", ShortState(response.state())}, {"error", ""}});
    if (context.format == OutputFormat::kTable) {
      *context.out << job_id << " " << ShortState(response.state()) << "\n";
    }
  }
  if (context.format == OutputFormat::kJson) {
    *context.out << nlohmann::json{{"jobs", results}}.dump(
                        2, ' ', false, nlohmann::json::error_handler_t::replace)
                 << "\n";
  }
  return exit_code;
}

bool ParseLabelSelector(const std::string& text, std::map<std::string, std::string>* labels,
                        std::string* error) {
  for (absl::string_view pair : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const size_t equals = pair.find('=');
    if (equals == absl::string_view::npos) {
      *error = "a selector is KEY=VALUE[,KEY=VALUE...]";
      return false;
    }
    (*labels)[std::string(pair.substr(0, equals))] = std::string(pair.substr(equals + 1));
  }
  return true;
}

int CancelSelectedCommand(const CommandContext& context,
                          const std::map<std::string, std::string>& labels) {
  std::vector<std::string> job_ids;
  for (v1::JobState state : {v1::PENDING, v1::RUNNING}) {
    v1::ListJobsRequest request;
    request.set_state(state);
    request.set_page_size(kListPageSize);
    request.mutable_label_selector()->insert(labels.begin(), labels.end());
    while (true) {
      v1::ListJobsResponse page;
      grpc::ClientContext rpc;
      SetDeadline(context, &rpc);
      grpc::Status status = context.stub->ListJobs(&rpc, request, &page);
      if (!status.ok()) return ReportRpcError(context, "cancel", status);
      for (const v1::Job& job : page.jobs()) job_ids.push_back(job.job_id());
      if (page.next_page_token().empty()) break;
      request.set_page_token(page.next_page_token());
    }
  }
  if (job_ids.empty() && context.format == OutputFormat::kTable) {
    *context.out << "No pending or running job has those labels.\n";
    return 0;
  }
  return CancelCommand(context, job_ids);
}

int WorkersCommand(const CommandContext& context) {
  v1::ListWorkersResponse response;
  grpc::ClientContext rpc;
  SetDeadline(context, &rpc);
  grpc::Status status = context.stub->ListWorkers(&rpc, v1::ListWorkersRequest(), &response);
  if (!status.ok()) return ReportRpcError(context, "workers", status);
  // Every field in the JSON, the usage's too (a coordinator before usage sends none).
  for (v1::Worker& worker : *response.mutable_workers()) worker.mutable_usage();
  *context.out << (context.format == OutputFormat::kJson
                       ? ToJson(response) + "\n"
                       : FormatWorkerTable({response.workers().begin(), response.workers().end()}));
  if (context.format != OutputFormat::kJson && response.registrations_refused_for_capacity() > 0) {
    // Daemons the coordinator turned away are not in the table: say that they exist.
    *context.out << response.registrations_refused_for_capacity()
                 << " registrations refused for capacity (--max_live_workers "
                 << response.max_live_workers() << "); last: " << response.last_refusal() << "\n";
  }
  return 0;
}

namespace {

// "nan", "inf", "-inf" as pandas and numpy read them (printf gives "-nan" for a NaN whose sign
// bit is set, which they do not).
std::string CsvNumber(double value, const absl::FormatSpec<double>& format) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return absl::StrFormat(format, value);
}

// A CSV cell: numbers as they print; text quoted when it needs it.
std::string CsvField(const google::protobuf::Message& message,
                     const google::protobuf::FieldDescriptor* field) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  // An optional field not set (an MSE job's accuracy, a step without evaluation) is an empty
  // cell: a 0 would read as a value.
  if (field->has_presence() && !reflection->HasField(message, field)) return "";
  using Type = google::protobuf::FieldDescriptor::CppType;
  switch (field->cpp_type()) {
    case Type::CPPTYPE_DOUBLE: return CsvNumber(reflection->GetDouble(message, field), "%.17g");
    case Type::CPPTYPE_FLOAT: return CsvNumber(reflection->GetFloat(message, field), "%.9g");
    case Type::CPPTYPE_INT64: return absl::StrCat(reflection->GetInt64(message, field));
    case Type::CPPTYPE_INT32: return absl::StrCat(reflection->GetInt32(message, field));
    case Type::CPPTYPE_UINT64: return absl::StrCat(reflection->GetUInt64(message, field));
    case Type::CPPTYPE_UINT32: return absl::StrCat(reflection->GetUInt32(message, field));
    case Type::CPPTYPE_BOOL: return reflection->GetBool(message, field) ? "true" : "false";
    default: {
      std::string text;
      if (field->cpp_type() == Type::CPPTYPE_STRING) text = reflection->GetString(message, field);
      if (text.find_first_of(",\"\n") == std::string::npos) return text;
      std::string quoted = "\"";
      for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
      return quoted + "\"";
    }
  }
}

}  // namespace

int ExportCommand(const CommandContext& context, const std::string& job_id, ExportFormat format) {
  const google::protobuf::Descriptor* descriptor = v1::TelemetryRecord::descriptor();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  for (int i = 0; i < descriptor->field_count(); ++i) {
    if (!descriptor->field(i)->is_repeated() &&
        descriptor->field(i)->cpp_type() !=
            google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      fields.push_back(descriptor->field(i));
    }
  }
  std::sort(fields.begin(), fields.end(), [](auto* a, auto* b) { return a->number() < b->number(); });
  bool header_written = format != ExportFormat::kCsv;  // Once the job is known to exist.
  v1::GetJobEventsRequest request;
  request.set_job_id(job_id);
  request.set_max_events(10'000);
  while (true) {
    v1::GetJobEventsResponse response;
    grpc::ClientContext rpc;
    SetDeadline(context, &rpc);
    grpc::Status status = context.stub->GetJobEvents(&rpc, request, &response);
    if (!status.ok()) return ReportRpcError(context, "export " + job_id, status);
    if (!header_written) {
      for (size_t i = 0; i < fields.size(); ++i) *context.out << (i ? "," : "") << fields[i]->name();
      *context.out << "\n";
      header_written = true;
    }
    for (const v1::WatchJobEvent& event : response.events()) {
      request.set_after_sequence(event.sequence());
      if (!event.has_telemetry()) continue;
      if (format == ExportFormat::kJsonl) {
        *context.out << ToJson(event.telemetry(), /*multiline=*/false) << "\n";
        continue;
      }
      for (size_t i = 0; i < fields.size(); ++i) {
        *context.out << (i ? "," : "") << CsvField(event.telemetry(), fields[i]);
      }
      *context.out << "\n";
    }
    // A running job's history goes on: export what exists now.
    if (response.finished() || response.events().empty()) break;
  }
  context.out->flush();
  return 0;
}

int LogsCommand(const CommandContext& context, const std::string& job_id, int rank, int attempt,
                bool follow) {
  v1::GetRankLogRequest request;
  request.set_job_id(job_id);
  request.set_rank(rank);
  request.set_attempt(attempt);
  bool announced_gap = false;
  bool asked_after_end = false;
  while (true) {
    v1::GetRankLogResponse response;
    grpc::ClientContext rpc;
    SetDeadline(context, &rpc);
    grpc::Status status = context.stub->GetRankLog(&rpc, request, &response);
    if (status.error_code() == grpc::StatusCode::NOT_FOUND && follow && !asked_after_end) {
      // No output (yet): wait for it while the job has not ended. Once it has, ask once more
      // (its last output may have come with its end), then give up.
      v1::GetJobRequest get;
      get.set_job_id(job_id);
      v1::GetJobResponse job;
      grpc::ClientContext job_rpc;
      SetDeadline(context, &job_rpc);
      if (context.stub->GetJob(&job_rpc, get, &job).ok()) {
        const v1::JobState state = job.job().state();
        if (state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED) {
          asked_after_end = true;
        } else {
          std::this_thread::sleep_for(std::chrono::seconds(1));
        }
        continue;
      }
    }
    if (!status.ok()) return ReportRpcError(context, "logs " + job_id, status);
    if (response.start_offset() > request.after_offset() && !announced_gap) {
      *context.err << "trainctl: the first " << response.start_offset()
                   << " bytes of rank " << rank << "'s output are no longer kept\n";
      announced_gap = true;
    }
    if (context.format == OutputFormat::kJson) {
      // One GetRankLogResponse a line: {"data": ..., "start_offset": ..., "complete": ...}.
      *context.out << ToJson(response, /*multiline=*/false) << "\n";
    } else {
      *context.out << response.data();
    }
    context.out->flush();
    request.set_attempt(response.attempt());
    request.set_after_offset(response.end_offset());
    if (!follow || response.complete()) return 0;
    if (response.data().empty()) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

int64_t CommandContext::now_unix_ms() const {
  if (fixed_now_unix_ms > 0) return fixed_now_unix_ms;
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace mptrain
