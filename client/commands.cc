#include "client/commands.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "client/format.h"
#include "common/job_spec.h"

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
  return 1;
}

// Streams WatchJob, printing each event; returns the terminal state seen (or UNSPECIFIED).
v1::JobState FollowJob(const CommandContext& context, const std::string& job_id, int* exit_code) {
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  grpc::ClientContext rpc;  // No deadline: a watch lasts as long as the job.
  std::unique_ptr<grpc::ClientReaderInterface<v1::WatchJobEvent>> reader =
      context.stub->WatchJob(&rpc, request);
  v1::WatchJobEvent event;
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  std::string error;
  while (reader->Read(&event)) {
    if (context.format == OutputFormat::kJson) *context.out << ToJson(event, false) << "\n";
    switch (event.event_case()) {
      case v1::WatchJobEvent::kSnapshot:
        last = event.snapshot().state();
        error = event.snapshot().error();
        if (context.format == OutputFormat::kTable) {
          *context.out << job_id << " " << ShortState(last) << "\n";
        }
        break;
      case v1::WatchJobEvent::kStateChange:
        last = event.state_change().state();
        error = event.state_change().error();
        if (context.format == OutputFormat::kTable) {
          *context.out << job_id << " " << ShortState(last)
                       << (error.empty() ? "" : ": " + error) << "\n";
        }
        break;
      case v1::WatchJobEvent::kTelemetry:
        if (context.format == OutputFormat::kTable) {
          *context.out << FormatTelemetryLine(event.telemetry()) << "\n";
        }
        break;
      default:
        break;
    }
    context.out->flush();
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    *exit_code = ReportRpcError(context, "watch " + job_id, status);
    return last;
  }
  *exit_code = last == v1::SUCCEEDED ? 0 : 1;
  return last;
}

}  // namespace

int SubmitCommand(const CommandContext& context, const std::string& spec_file, bool wait,
                  const std::string& request_id) {
  auto spec = LoadJobSpecFile(spec_file);
  if (!spec.ok()) {
    *context.err << "trainctl: " << spec.status().message() << "\n";
    return 2;
  }
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *spec;
  request.set_request_id(request_id);
  v1::SubmitJobResponse response;
  grpc::ClientContext rpc;
  SetDeadline(context, &rpc);
  grpc::Status status = context.stub->SubmitJob(&rpc, request, &response);
  if (!status.ok()) return ReportRpcError(context, "submit " + spec_file, status);
  if (context.format == OutputFormat::kJson && !wait) {
    *context.out << ToJson(response) << "\n";
  }
  if (!wait) {
    if (context.format == OutputFormat::kTable) *context.out << response.job_id() << "\n";
    return 0;
  }
  int exit_code = 1;
  FollowJob(context, response.job_id(), &exit_code);
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
  FollowJob(context, job_id, &exit_code);
  return exit_code;
}

int ListCommand(const CommandContext& context, v1::JobState state, int64_t limit) {
  // Page by page (each answer stays small however many jobs there are), up to `limit` jobs.
  v1::ListJobsRequest request;
  request.set_state(state);
  std::vector<v1::Job> jobs;
  int64_t listed = 0;
  while (true) {
    request.set_page_size(
        static_cast<int>(limit > 0 ? std::min<int64_t>(kListPageSize, limit - listed)
                                   : kListPageSize));
    v1::ListJobsResponse page;
    grpc::ClientContext rpc;
    SetDeadline(context, &rpc);
    grpc::Status status = context.stub->ListJobs(&rpc, request, &page);
    if (!status.ok()) return ReportRpcError(context, "list", status);
    for (v1::Job& job : *page.mutable_jobs()) {
      ++listed;
      if (context.format == OutputFormat::kJson) {
        *context.out << ToJson(job, false) << "\n";  // One job a line: any number of them.
      } else {
        jobs.push_back(std::move(job));
      }
    }
    if (page.next_page_token().empty() || (limit > 0 && listed >= limit)) break;
    request.set_page_token(page.next_page_token());
  }
  if (context.format == OutputFormat::kTable) *context.out << FormatJobTable(jobs);
  return 0;
}

int CancelCommand(const CommandContext& context, const std::string& job_id) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  v1::CancelJobResponse response;
  grpc::ClientContext rpc;
  SetDeadline(context, &rpc);
  grpc::Status status = context.stub->CancelJob(&rpc, request, &response);
  if (!status.ok()) return ReportRpcError(context, "cancel " + job_id, status);
  *context.out << (context.format == OutputFormat::kJson
                       ? ToJson(response) + "\n"
                       : job_id + " " + ShortState(response.state()) + "\n");
  return 0;
}

int WorkersCommand(const CommandContext& context) {
  v1::ListWorkersResponse response;
  grpc::ClientContext rpc;
  SetDeadline(context, &rpc);
  grpc::Status status = context.stub->ListWorkers(&rpc, v1::ListWorkersRequest(), &response);
  if (!status.ok()) return ReportRpcError(context, "workers", status);
  *context.out << (context.format == OutputFormat::kJson
                       ? ToJson(response) + "\n"
                       : FormatWorkerTable({response.workers().begin(), response.workers().end()}));
  return 0;
}

}  // namespace mptrain
