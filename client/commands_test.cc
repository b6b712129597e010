#include "client/commands.h"

#include <chrono>
#include <deque>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

// A coordinator that answers GetRankLog from a script (the last answer repeats) and GetJob
// with the job's current state.
class ScriptedCoordinator final : public v1::Coordinator::Service {
 public:
  struct Answer {
    grpc::Status status;
    v1::GetRankLogResponse response;
  };

  void Script(std::deque<Answer> answers, v1::JobState state) {
    std::lock_guard<std::mutex> lock(mu_);
    answers_ = std::move(answers);
    state_ = state;
  }
  int rank_log_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return rank_log_calls_;
  }

  grpc::Status GetRankLog(grpc::ServerContext*, const v1::GetRankLogRequest*,
                          v1::GetRankLogResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++rank_log_calls_;
    const Answer answer = answers_.front();
    if (answers_.size() > 1) answers_.pop_front();
    *response = answer.response;
    return answer.status;
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::GetJobResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    response->mutable_job()->set_job_id(request->job_id());
    response->mutable_job()->set_state(state_);
    return grpc::Status::OK;
  }

 private:
  std::mutex mu_;
  std::deque<Answer> answers_;
  v1::JobState state_ = v1::RUNNING;
  int rank_log_calls_ = 0;
};

ScriptedCoordinator::Answer NotFound(const std::string& message) {
  return {grpc::Status(grpc::StatusCode::NOT_FOUND, message), {}};
}

ScriptedCoordinator::Answer Output(const std::string& data, bool complete) {
  ScriptedCoordinator::Answer answer;
  answer.response.set_attempt(1);
  answer.response.set_data(data);
  answer.response.set_end_offset(static_cast<int64_t>(data.size()));
  answer.response.set_complete(complete);
  return answer;
}

class LogsCommandTest : public ::testing::Test {
 protected:
  LogsCommandTest() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&coordinator_);
    server_ = builder.BuildAndStart();
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
  }
  ~LogsCommandTest() override { server_->Shutdown(); }

  struct Run {
    int exit_code = -1;
    std::string out, err;
  };
  // `trainctl logs job-0001 --rank 1 --follow`, given `timeout` to return. A command that does
  // not return in time is left running on a thread of its own (the test fails, not hangs).
  std::optional<Run> Follow(std::chrono::seconds timeout) {
    auto promise = std::make_shared<std::promise<Run>>();
    std::future<Run> result = promise->get_future();
    std::thread([promise, channel = channel_] {
      std::shared_ptr<v1::Coordinator::StubInterface> stub = v1::Coordinator::NewStub(channel);
      std::ostringstream out, err;
      CommandContext context;
      context.stub = stub.get();
      context.out = &out;
      context.err = &err;
      Run run;
      run.exit_code = LogsCommand(context, "job-0001", /*rank=*/1, /*attempt=*/0,
                                  /*follow=*/true);
      run.out = out.str();
      run.err = err.str();
      promise->set_value(run);
    }).detach();
    if (result.wait_for(timeout) != std::future_status::ready) return std::nullopt;
    return result.get();
  }

  ScriptedCoordinator coordinator_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(LogsCommandTest, Follow_EndedJobWithNoOutputKept_ReturnsTheErrorAtOnce) {
  coordinator_.Script({NotFound("job job-0001 ended (FAILED) and no output of rank 1 is kept: "
                                "the rank wrote none, or never started")},
                      v1::FAILED);
  std::optional<Run> run = Follow(std::chrono::seconds(5));
  ASSERT_TRUE(run.has_value()) << "--follow on an ended job must return";
  EXPECT_EQ(run->exit_code, 1);
  EXPECT_NE(run->err.find("NOT_FOUND: job job-0001 ended (FAILED)"), std::string::npos)
      << run->err;
  // Once before it knew the job had ended, once after.
  EXPECT_EQ(coordinator_.rank_log_calls(), 2);
}

TEST_F(LogsCommandTest, Follow_EvenOnANotYetMessage_StopsWaitingOnceTheJobEnded) {
  // Whatever the message says (an older coordinator said "yet" of ended jobs too).
  coordinator_.Script({NotFound("job job-0001: no output of rank 1 yet")}, v1::CANCELLED);
  std::optional<Run> run = Follow(std::chrono::seconds(5));
  ASSERT_TRUE(run.has_value()) << "--follow on an ended job must return";
  EXPECT_EQ(run->exit_code, 1);
}

TEST_F(LogsCommandTest, Follow_WaitsForTheFirstOutputOfARunningJob_ThenPrintsToTheEnd) {
  coordinator_.Script({NotFound("job job-0001: no output of rank 1 yet"),
                       Output("step 1\n", /*complete=*/true)},
                      v1::RUNNING);
  std::optional<Run> run = Follow(std::chrono::seconds(10));
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_EQ(run->out, "step 1\n");
  EXPECT_EQ(coordinator_.rank_log_calls(), 2);
}

TEST_F(LogsCommandTest, Follow_OutputThatCameWithTheEnd_IsPrinted) {
  // The job ended between the two reads: the second one has its last output.
  coordinator_.Script({NotFound("job job-0001: no output of rank 1 yet"),
                       Output("last words\n", /*complete=*/true)},
                      v1::FAILED);
  std::optional<Run> run = Follow(std::chrono::seconds(5));
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_EQ(run->out, "last words\n");
}

// A coordinator with one job whose history is `history` (sequences 1..n): each WatchJob
// stream is scripted (a snapshot at some sequence, the live events after it, and how the
// stream ends); GetJobEvents pages the history two events at a time.
class HistoryCoordinator final : public v1::Coordinator::Service {
 public:
  struct Stream {
    int64_t snapshot_sequence = 0;
    v1::JobState snapshot_state = v1::RUNNING;
    std::vector<v1::WatchJobEvent> live;
    grpc::Status end = grpc::Status::OK;
    std::string snapshot_error;
    v1::Job snapshot_more;  // Merged into the snapshot (telemetry, progress, times).
  };
  std::vector<v1::WatchJobEvent> history;
  std::deque<Stream> streams;
  std::mutex mu;
  int history_calls = 0;

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*,
                         v1::SubmitJobResponse* response) override {
    response->set_job_id("job-0001");
    return grpc::Status::OK;
  }
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*,
                        grpc::ServerWriter<v1::WatchJobEvent>* writer) override {
    Stream stream;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (streams.empty()) return grpc::Status(grpc::StatusCode::INTERNAL, "no stream left");
      stream = streams.front();
      streams.pop_front();
    }
    v1::WatchJobEvent snapshot;
    snapshot.set_sequence(stream.snapshot_sequence);
    snapshot.mutable_snapshot()->set_job_id("job-0001");
    snapshot.mutable_snapshot()->set_state(stream.snapshot_state);
    snapshot.mutable_snapshot()->set_error(stream.snapshot_error);
    snapshot.mutable_snapshot()->mutable_spec()->set_steps(3);
    snapshot.mutable_snapshot()->MergeFrom(stream.snapshot_more);
    writer->Write(snapshot);
    for (const v1::WatchJobEvent& event : stream.live) writer->Write(event);
    return stream.end;
  }
  grpc::Status GetJobEvents(grpc::ServerContext*, const v1::GetJobEventsRequest* request,
                            v1::GetJobEventsResponse* response) override {
    std::lock_guard<std::mutex> lock(mu);
    ++history_calls;
    for (const v1::WatchJobEvent& event : history) {
      if (event.sequence() > request->after_sequence() && response->events_size() < 2) {
        *response->add_events() = event;
      }
    }
    return grpc::Status::OK;
  }

  static v1::WatchJobEvent State(int64_t sequence, v1::JobState state) {
    v1::WatchJobEvent event;
    event.set_sequence(sequence);
    event.mutable_state_change()->set_state(state);
    return event;
  }
  static v1::WatchJobEvent Step(int64_t sequence, int64_t step) {
    v1::WatchJobEvent event;
    event.set_sequence(sequence);
    event.mutable_telemetry()->set_step(step);
    event.mutable_telemetry()->set_attempt(1);
    event.mutable_telemetry()->set_loss(0.5);
    event.mutable_telemetry()->set_step_time_ms(4);
    return event;
  }
};

class FollowTest : public ::testing::Test {
 protected:
  FollowTest() {
    grpc::ServerBuilder builder;
    builder.RegisterService(&coordinator_);
    server_ = builder.BuildAndStart();
    stub_ = v1::Coordinator::NewStub(server_->InProcessChannel({}));
    // History: RUNNING, steps 1-3, SUCCEEDED.
    coordinator_.history = {HistoryCoordinator::State(1, v1::RUNNING),
                            HistoryCoordinator::Step(2, 1), HistoryCoordinator::Step(3, 2),
                            HistoryCoordinator::Step(4, 3),
                            HistoryCoordinator::State(5, v1::SUCCEEDED)};
  }
  ~FollowTest() override { server_->Shutdown(); }

  CommandContext Context() {
    CommandContext context;
    context.stub = stub_.get();
    context.out = &out_;
    context.err = &err_;
    return context;
  }
  // A 3-step job spec (the coordinator here answers any submit with job-0001).
  static std::string SpecFile() {
    const std::string path = absl::StrCat(::testing::TempDir(), "/follow_spec.json");
    std::ofstream(path) << R"({"name": "t", "world_size": 1, "device": "cpu",
      "model": {"input_dim": 4, "hidden_dims": [], "output_dim": 2},
      "data": {"synthetic": {"seed": 0}}, "micro_batch_size": 2, "steps": 3})";
    return path;
  }
  int Lines(const std::string& fragment) {
    int count = 0;
    std::istringstream lines(out_.str());
    for (std::string line; std::getline(lines, line);) {
      count += line.find(fragment) != std::string::npos ? 1 : 0;
    }
    return count;
  }

  HistoryCoordinator coordinator_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::ostringstream out_, err_;
};

// A job that ran, even ended, before submit --wait opened its watch: every step is printed
// (before, only the final state was: the snapshot said SUCCEEDED and the steps were gone).
TEST_F(FollowTest, SubmitWait_AJobThatEndedBeforeTheWatch_PrintsEveryStepOnce) {
  coordinator_.streams.push_back({5, v1::SUCCEEDED, {}, grpc::Status::OK});
  const std::string spec = SpecFile();
  EXPECT_EQ(SubmitCommand(Context(), spec, /*wait=*/true, ""), 0) << err_.str();
  EXPECT_EQ(Lines("step"), 3) << out_.str();
  for (const char* step : {"step      1  ", "step      2  ", "step      3  "}) {
    EXPECT_EQ(Lines(step), 1) << step << " in:\n" << out_.str();
  }
  EXPECT_EQ(Lines("job-0001 RUNNING"), 1) << out_.str();
  EXPECT_EQ(Lines("job-0001 SUCCEEDED"), 1) << out_.str();
  EXPECT_EQ(err_.str(), "");
}

// JSON keeps the stream's order: the snapshot first, then the history, one event a line.
TEST_F(FollowTest, SubmitWaitJson_SnapshotFirst_ThenEveryEvent) {
  coordinator_.streams.push_back({5, v1::SUCCEEDED, {}, grpc::Status::OK});
  const std::string spec = SpecFile();
  CommandContext context = Context();
  context.format = OutputFormat::kJson;
  EXPECT_EQ(SubmitCommand(context, spec, /*wait=*/true, ""), 0) << err_.str();
  std::istringstream lines(out_.str());
  std::string first;
  std::getline(lines, first);
  EXPECT_NE(first.find("\"snapshot\""), std::string::npos) << out_.str();
  EXPECT_EQ(Lines("\"telemetry\""), 3) << out_.str();
  EXPECT_EQ(Lines("\"state_change\""), 2) << out_.str();
}

// A stream dropped mid-job (the coordinator restarted): the steps made meanwhile are fetched
// from the history and printed once, then the new stream's live events.
TEST_F(FollowTest, Watch_Reconnected_PrintsTheStepsMadeWhileItWasAway) {
  coordinator_.streams.push_back({1, v1::RUNNING, {HistoryCoordinator::Step(2, 1)},
                                  grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed")});
  coordinator_.streams.push_back({4, v1::RUNNING,
                                  {HistoryCoordinator::State(5, v1::SUCCEEDED)},
                                  grpc::Status::OK});
  EXPECT_EQ(WatchCommand(Context(), "job-0001"), 0) << err_.str();
  for (const char* step : {"step      1  ", "step      2  ", "step      3  "}) {
    EXPECT_EQ(Lines(step), 1) << step << " in:\n" << out_.str();
  }
  EXPECT_EQ(Lines("job-0001 RUNNING"), 1) << out_.str();
  EXPECT_EQ(Lines("job-0001 SUCCEEDED"), 1) << out_.str();
  EXPECT_NE(err_.str().find("reconnecting"), std::string::npos) << err_.str();
}

// On a terminal, one progress line: its rate is the steps' (4 ms a step: 250 steps/s) while
// the records came in one burst, not steps over the microseconds between them (5.55e+04).
TEST_F(FollowTest, ProgressLine_RecordsInABurst_RateIsTheStepTimes) {
  CommandContext context = Context();
  context.terminal = true;
  coordinator_.streams.push_back({1, v1::RUNNING,
                                  {HistoryCoordinator::Step(2, 1), HistoryCoordinator::Step(3, 2),
                                   HistoryCoordinator::Step(4, 3),
                                   HistoryCoordinator::State(5, v1::SUCCEEDED)},
                                  grpc::Status::OK});
  EXPECT_EQ(WatchCommand(context, "job-0001"), 0);
  EXPECT_NE(out_.str().find("3/3 steps  250 steps/s  ETA 0 s"), std::string::npos) << out_.str();
  EXPECT_EQ(out_.str().find("e+"), std::string::npos) << out_.str();
}

// A watch of a running job starts from now (the history is `trainctl export`'s).
TEST_F(FollowTest, Watch_StartsFromTheSnapshot) {
  coordinator_.streams.push_back({3, v1::RUNNING,
                                  {HistoryCoordinator::Step(4, 3),
                                   HistoryCoordinator::State(5, v1::SUCCEEDED)},
                                  grpc::Status::OK});
  EXPECT_EQ(WatchCommand(Context(), "job-0001"), 0) << err_.str();
  EXPECT_EQ(Lines("step"), 1) << out_.str();
  EXPECT_EQ(coordinator_.history_calls, 0);
}

// A watch of a job that had already FAILED printed only "job-0001 FAILED", not why.
TEST_F(FollowTest, Watch_OfAFailedJob_PrintsTheReason) {
  HistoryCoordinator::Stream stream;
  stream.snapshot_sequence = 9;
  stream.snapshot_state = v1::FAILED;
  stream.snapshot_error = "rank 1 exited with status 3";
  coordinator_.streams.push_back(stream);
  EXPECT_EQ(WatchCommand(Context(), "job-0001"), 1);
  EXPECT_NE(out_.str().find("job-0001 FAILED: rank 1 exited with status 3"), std::string::npos)
      << out_.str();
}

// A watch of a job that had already ended: no step follows, so besides its state (and a failed
// one's reason) it says what the job came to.
TEST_F(FollowTest, Watch_OfAnEndedJob_PrintsTheStateAndASummary) {
  HistoryCoordinator::Stream stream;
  stream.snapshot_sequence = 9;
  stream.snapshot_state = v1::SUCCEEDED;
  v1::Job& job = stream.snapshot_more;
  job.set_started_unix_ms(10'000);
  job.set_finished_unix_ms(14'500);
  job.mutable_latest_telemetry()->set_step(3);
  job.mutable_latest_telemetry()->set_loss(0.125);
  job.mutable_latest_telemetry()->set_skipped_total(1);
  job.mutable_latest_evaluation()->set_step(3);
  job.mutable_latest_evaluation()->set_eval_loss(0.25);
  job.mutable_latest_evaluation()->set_eval_accuracy(0.975);
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankProgress* progress = job.add_progress();
    progress->set_rank(rank);
    progress->set_step(3);
    progress->set_finished(true);
    progress->set_parameter_checksum("00c0ffee12345678abcdef");
  }
  job.mutable_spec()->set_output_checkpoint("/out/model.safetensors");
  coordinator_.streams.push_back(stream);
  EXPECT_EQ(WatchCommand(Context(), "job-0001"), 0) << err_.str();
  EXPECT_EQ(Lines("job-0001 SUCCEEDED"), 1) << out_.str();
  EXPECT_NE(out_.str().find("job-0001 summary: 3/3 steps in 4s; final loss 0.125000, eval_loss "
                            "0.250000 (acc 0.9750) at step 3; 1 skipped; 2 ranks, identical "
                            "parameters (checksum 00c0ffee12345678); output "
                            "/out/model.safetensors\n"),
            std::string::npos)
      << out_.str();

  // Failed: the reason on the state's line, then how far it got.
  stream.snapshot_state = v1::FAILED;
  stream.snapshot_error = "rank 1 exited with status 3";
  stream.snapshot_more.mutable_latest_telemetry()->set_step(2);
  coordinator_.streams.push_back(stream);
  out_.str("");
  EXPECT_EQ(WatchCommand(Context(), "job-0001"), 1);
  EXPECT_NE(out_.str().find("job-0001 FAILED: rank 1 exited with status 3\n"
                            "job-0001 summary: 2/3 steps in 4s; final loss 0.125000"),
            std::string::npos)
      << out_.str();
  EXPECT_EQ(out_.str().find("identical parameters"), std::string::npos) << out_.str();
  EXPECT_EQ(out_.str().find("output /out"), std::string::npos) << "a failed job wrote none";

  // A running job's snapshot has no summary: its steps follow.
  coordinator_.streams.push_back({3, v1::RUNNING, {HistoryCoordinator::State(5, v1::SUCCEEDED)},
                                  grpc::Status::OK});
  out_.str("");
  EXPECT_EQ(WatchCommand(Context(), "job-0001"), 0);
  EXPECT_EQ(Lines("summary"), 0) << out_.str();
}

// Jobs for list (paged two at a time, oldest first, as the coordinator pages), cancel (job-0002
// is not the caller's), submit (the job waits: no worker can take it) and export (a NaN).
class JobsCoordinator final : public v1::Coordinator::Service {
 public:
  JobsCoordinator() {
    for (int i = 1; i <= 5; ++i) {
      v1::Job job;
      job.set_job_id(absl::StrCat("job-000", i));
      job.mutable_spec()->set_name(absl::StrCat("n", 6 - i));
      job.set_submitted_unix_ms(1000 * i);
      jobs_.push_back(job);
    }
  }
  std::vector<std::string> cancelled;
  std::vector<std::map<std::string, std::string>> selectors;  // Of each ListJobs with one.

  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override {
    if (!request->label_selector().empty()) {
      // The selected jobs: job-0003 and job-0004 wait, none runs.
      selectors.emplace_back(request->label_selector().begin(), request->label_selector().end());
      if (request->state() == v1::PENDING) {
        *response->add_jobs() = jobs_[2];
        *response->add_jobs() = jobs_[3];
      }
      return grpc::Status::OK;
    }
    const size_t from = request->page_token().empty() ? 0 : std::stoul(request->page_token());
    for (size_t i = from; i < jobs_.size() && i < from + 2; ++i) *response->add_jobs() = jobs_[i];
    if (from + 2 < jobs_.size()) response->set_next_page_token(std::to_string(from + 2));
    return grpc::Status::OK;
  }
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::CancelJobResponse* response) override {
    if (request->job_id() == "job-0002") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown job id job-0002");
    }
    cancelled.push_back(request->job_id());
    response->set_state(v1::CANCELLED);
    return grpc::Status::OK;
  }
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*,
                         v1::SubmitJobResponse* response) override {
    response->set_job_id("job-0006");
    response->set_state(v1::PENDING);
    return grpc::Status::OK;
  }
  // One worker as a coordinator before usage lists it: no usage at all.
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    v1::Worker* worker = response->add_workers();
    worker->set_worker_id("w1#1");
    worker->set_state(v1::ALIVE);
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::GetJobResponse* response) override {
    response->mutable_job()->set_job_id(request->job_id());
    response->mutable_job()->set_state(v1::PENDING);
    response->mutable_job()->set_pending_reason("needs 3 cpu slots; 2 exist");
    return grpc::Status::OK;
  }
  grpc::Status GetJobEvents(grpc::ServerContext*, const v1::GetJobEventsRequest* request,
                            v1::GetJobEventsResponse* response) override {
    if (request->after_sequence() == 0) {
      v1::WatchJobEvent* event = response->add_events();
      event->set_sequence(1);
      event->mutable_telemetry()->set_step(1);
      event->mutable_telemetry()->set_grad_norm(-std::numeric_limits<double>::quiet_NaN());
    }
    response->set_finished(true);
    return grpc::Status::OK;
  }

 private:
  std::vector<v1::Job> jobs_;
};

class JobsTest : public ::testing::Test {
 protected:
  JobsTest() {
    grpc::ServerBuilder builder;
    builder.RegisterService(&coordinator_);
    server_ = builder.BuildAndStart();
    stub_ = v1::Coordinator::NewStub(server_->InProcessChannel({}));
  }
  ~JobsTest() override { server_->Shutdown(); }
  CommandContext Context(OutputFormat format = OutputFormat::kTable) {
    CommandContext context;
    context.stub = stub_.get();
    context.out = &out_;
    context.err = &err_;
    context.format = format;
    context.fixed_now_unix_ms = 10'000;
    return context;
  }
  // The job ids in the order `out_` shows them.
  std::vector<std::string> Ids() {
    std::vector<std::string> ids;
    const std::string text = out_.str();
    for (size_t at = text.find("job-"); at != std::string::npos; at = text.find("job-", at + 1)) {
      ids.push_back(text.substr(at, 8));
    }
    return ids;
  }

  JobsCoordinator coordinator_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::ostringstream out_, err_;
};

// `list --limit 1` returned job-0001, the oldest.
TEST_F(JobsTest, List_NewestFirstByDefault_LimitAfterSorting) {
  ListOptions options;
  options.limit = 2;
  EXPECT_EQ(ListCommand(Context(), options), 0);
  EXPECT_EQ(Ids(), (std::vector<std::string>{"job-0005", "job-0004"})) << out_.str();
}

TEST_F(JobsTest, List_SortByName_AndOldest) {
  ListOptions options;
  options.sort = JobSort::kName;  // n1 is job-0005.
  EXPECT_EQ(ListCommand(Context(), options), 0);
  EXPECT_EQ(Ids(), (std::vector<std::string>{"job-0005", "job-0004", "job-0003", "job-0002",
                                             "job-0001"}));
  out_.str("");
  options.sort = JobSort::kOldest;
  EXPECT_EQ(ListCommand(Context(), options), 0);
  EXPECT_EQ(Ids(), (std::vector<std::string>{"job-0001", "job-0002", "job-0003", "job-0004",
                                             "job-0005"}));
}

TEST_F(JobsTest, List_Json_IsOneObjectWithEveryJob) {
  EXPECT_EQ(ListCommand(Context(OutputFormat::kJson), ListOptions()), 0);
  const std::string json = out_.str();
  EXPECT_EQ(json.rfind("{", 0), 0u) << json;
  EXPECT_NE(json.find("\"jobs\": ["), std::string::npos) << json;
  EXPECT_EQ(Ids().size(), 5u) << json;
}

// `workers --output json` has every field, the usage's included, whatever the coordinator
// left out; the table says n/a for what was not read.
TEST_F(JobsTest, Workers_JsonHasEveryUsageField_TableSaysNa) {
  EXPECT_EQ(WorkersCommand(Context(OutputFormat::kJson)), 0);
  const std::string json = out_.str();
  for (const char* part : {R"("usage": {)", R"("memory_available_bytes": "0")",
                           R"("memory_total_bytes": "0")", R"("devices": [])",
                           R"("usage_unix_ms": "0")"}) {
    EXPECT_NE(json.find(part), std::string::npos) << part << " not in " << json;
  }
  out_.str("");
  EXPECT_EQ(WorkersCommand(Context()), 0);
  EXPECT_NE(out_.str().find("ALIVE  n/a"), std::string::npos) << out_.str();
}

TEST_F(JobsTest, Cancel_SeveralIds_EachTried_ExitOneIfAnyRefused) {
  EXPECT_EQ(CancelCommand(Context(), {"job-0001", "job-0002", "job-0003"}), 1);
  EXPECT_EQ(coordinator_.cancelled, (std::vector<std::string>{"job-0001", "job-0003"}));
  EXPECT_NE(out_.str().find("job-0001 CANCELLED\njob-0003 CANCELLED\n"), std::string::npos)
      << out_.str();
  EXPECT_NE(err_.str().find("cancel job-0002 failed: NOT_FOUND"), std::string::npos)
      << err_.str();
}

// A job no worker can run was accepted silently and waited forever.
TEST_F(JobsTest, Submit_OfAJobThatCannotStartNow_SaysWhy) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/pending_spec.json");
  std::ofstream(path) << R"({"name": "t", "world_size": 3, "device": "cpu",
    "model": {"input_dim": 4, "hidden_dims": [], "output_dim": 2},
    "data": {"synthetic": {"seed": 0}}, "micro_batch_size": 2, "steps": 3,
    "queue_timeout_s": 30})";
  EXPECT_EQ(SubmitCommand(Context(), path, /*wait=*/false, ""), 0) << err_.str();
  EXPECT_EQ(out_.str(), "job-0006\n") << "the id alone stays on stdout";
  EXPECT_NE(err_.str().find("job-0006 cannot start now: needs 3 cpu slots; 2 exist (it fails "
                            "if not placed within queue_timeout_s 30)"),
            std::string::npos)
      << err_.str();
}

// printf gave "-nan" (a NaN with its sign bit set), which pandas and numpy do not read.
TEST_F(JobsTest, Export_Csv_NanIsNan) {
  EXPECT_EQ(ExportCommand(Context(), "job-0001", ExportFormat::kCsv), 0) << err_.str();
  EXPECT_EQ(out_.str().find("-nan"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find(",nan,"), std::string::npos) << out_.str();
}

TEST(ParseLabelSelector, PairsOrAnError) {
  std::map<std::string, std::string> labels;
  std::string error;
  ASSERT_TRUE(ParseLabelSelector("team=vision,env=", &labels, &error));
  EXPECT_EQ(labels, (std::map<std::string, std::string>{{"team", "vision"}, {"env", ""}}));
  EXPECT_FALSE(ParseLabelSelector("team", &labels, &error));
  EXPECT_NE(error.find("KEY=VALUE"), std::string::npos);
}

TEST_F(JobsTest, List_SendsTheSelector) {
  ListOptions options;
  options.labels = {{"team", "vision"}};
  EXPECT_EQ(ListCommand(Context(), options), 0);
  ASSERT_EQ(coordinator_.selectors.size(), 1u);
  EXPECT_EQ(coordinator_.selectors[0], options.labels);
}

// `cancel -l team=vision`: the pending and running jobs the coordinator selects, each cancelled.
TEST_F(JobsTest, CancelSelected_CancelsThePendingAndRunningJobsWithTheLabels) {
  EXPECT_EQ(CancelSelectedCommand(Context(), {{"team", "vision"}}), 0) << err_.str();
  EXPECT_EQ(coordinator_.selectors.size(), 2u) << "pending, then running";
  EXPECT_EQ(coordinator_.cancelled, (std::vector<std::string>{"job-0003", "job-0004"}));
}

}  // namespace
}  // namespace mptrain
