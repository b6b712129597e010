#include "client/commands.h"

#include <chrono>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

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

}  // namespace
}  // namespace mptrain
