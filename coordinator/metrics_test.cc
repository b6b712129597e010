#include "coordinator/metrics.h"

#include "gtest/gtest.h"

namespace mptrain {
namespace {

bool Contains(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST(RpcMetrics, CountsByCodeAndBucketsLatency) {
  RpcMetrics rpcs;
  rpcs.Record("/mptrain.v1.Coordinator/GetJob", "OK", 0.0007);
  rpcs.Record("/mptrain.v1.Coordinator/GetJob", "OK", 0.02);
  rpcs.Record("/mptrain.v1.Coordinator/GetJob", "NOT_FOUND", 100);
  const std::string text = RenderMetrics(CoordinatorState::Overview(), rpcs);
  EXPECT_TRUE(Contains(text, "mptrain_rpcs_total{service=\"mptrain.v1.Coordinator\","
                             "method=\"GetJob\",code=\"OK\"} 2\n"));
  EXPECT_TRUE(Contains(text, "mptrain_rpcs_total{service=\"mptrain.v1.Coordinator\","
                             "method=\"GetJob\",code=\"NOT_FOUND\"} 1\n"));
  EXPECT_TRUE(Contains(text, "mptrain_rpc_duration_seconds_bucket{service=\"mptrain.v1."
                             "Coordinator\",method=\"GetJob\",le=\"0.0005\"} 0\n"));
  EXPECT_TRUE(Contains(text, "mptrain_rpc_duration_seconds_bucket{service=\"mptrain.v1."
                             "Coordinator\",method=\"GetJob\",le=\"0.001\"} 1\n"));
  EXPECT_TRUE(Contains(text, "mptrain_rpc_duration_seconds_bucket{service=\"mptrain.v1."
                             "Coordinator\",method=\"GetJob\",le=\"0.025\"} 2\n"));
  // 100 s is past every bound: only +Inf and the count hold it.
  EXPECT_TRUE(Contains(text, "mptrain_rpc_duration_seconds_bucket{service=\"mptrain.v1."
                             "Coordinator\",method=\"GetJob\",le=\"30\"} 2\n"));
  EXPECT_TRUE(Contains(text, "mptrain_rpc_duration_seconds_bucket{service=\"mptrain.v1."
                             "Coordinator\",method=\"GetJob\",le=\"+Inf\"} 3\n"));
  EXPECT_TRUE(Contains(text, "mptrain_rpc_duration_seconds_count{service=\"mptrain.v1."
                             "Coordinator\",method=\"GetJob\"} 3\n"));
}

TEST(RenderMetrics, JobsWorkersAndRunningJobTelemetry) {
  CoordinatorState::Overview overview;
  overview.jobs[v1::RUNNING] = 1;
  overview.jobs[v1::FAILED] = 2;
  overview.queued = 3;
  overview.ended_total[v1::FAILED] = 2;
  v1::Worker worker;
  worker.set_worker_id("w#1");
  worker.set_host("h1");
  worker.set_device(v1::CPU);
  worker.set_state(v1::ALIVE);
  worker.set_slots(4);
  worker.set_free_slots(2);
  overview.workers.push_back({worker, 1.5});
  v1::Job job;
  job.set_job_id("job-0007");
  job.mutable_spec()->set_name("my \"run\"");
  job.mutable_spec()->set_steps(100);
  job.mutable_latest_telemetry()->set_step(42);
  job.mutable_latest_telemetry()->set_loss(0.125);
  job.mutable_latest_telemetry()->set_loss_scale(65536);
  job.mutable_latest_telemetry()->set_skipped_total(3);
  job.mutable_latest_telemetry()->set_lr(0.0025);
  job.mutable_latest_telemetry()->set_eval_accuracy(0.975);
  overview.running.push_back(job);
  const std::string text = RenderMetrics(overview, RpcMetrics());
  EXPECT_TRUE(Contains(text, "mptrain_job_learning_rate{job=\"job-0007\",name=\"my \\\"run\\\"\"} 0.0025\n"));
  EXPECT_TRUE(Contains(text, "mptrain_job_eval_accuracy{job=\"job-0007\",name=\"my \\\"run\\\"\"} 0.975\n"));
  EXPECT_FALSE(Contains(text, "mptrain_job_eval_loss{")) << "a job without evaluation has none";
  EXPECT_TRUE(Contains(text, "mptrain_jobs{state=\"running\"} 1\n"));
  EXPECT_TRUE(Contains(text, "mptrain_jobs{state=\"failed\"} 2\n"));
  EXPECT_TRUE(Contains(text, "mptrain_jobs{state=\"pending\"} 0\n"));
  EXPECT_TRUE(Contains(text, "mptrain_queue_length 3\n"));
  EXPECT_TRUE(Contains(text, "mptrain_jobs_ended_total{state=\"failed\"} 2\n"));
  EXPECT_TRUE(Contains(text, "mptrain_workers{state=\"alive\"} 1\n"));
  EXPECT_TRUE(Contains(text, "mptrain_worker_free_slots{worker=\"w#1\",host=\"h1\",device=\"cpu\"} 2\n"));
  EXPECT_TRUE(Contains(text, "mptrain_worker_heartbeat_age_seconds{worker=\"w#1\",host=\"h1\"} 1.5\n"));
  EXPECT_TRUE(Contains(text, "mptrain_job_step{job=\"job-0007\",name=\"my \\\"run\\\"\"} 42\n"));
  EXPECT_TRUE(Contains(text, "mptrain_job_loss{job=\"job-0007\",name=\"my \\\"run\\\"\"} 0.125\n"));
  EXPECT_TRUE(Contains(text, "mptrain_job_skipped_steps{job=\"job-0007\",name=\"my \\\"run\\\"\"} 3\n"));
  EXPECT_TRUE(Contains(text, "# TYPE mptrain_job_loss_scale gauge\n"));
}

}  // namespace
}  // namespace mptrain
