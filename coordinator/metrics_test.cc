#include "coordinator/metrics.h"

#include <chrono>
#include <string>

#include "common/rpc_limits.h"
#include "coordinator/prometheus_text.h"

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

// Method names come from clients (a call to a method that does not exist is still counted):
// only the served ones are labels, so 10,000 invented names make one "unknown" series.
TEST(RpcMetrics, MethodsTheServerDoesNotHave_AreOneUnknownSeries) {
  RpcMetrics rpcs;
  for (int i = 0; i < 10'000; ++i) {
    rpcs.Record("/grpc.health.v1.Health/" + std::to_string(i), "UNIMPLEMENTED", 0.0001);
    rpcs.Record("/mptrain.v1.Coordinator/Nope" + std::to_string(i), "UNIMPLEMENTED", 0.0001);
  }
  rpcs.Record("/mptrain.v1.WorkerControl/Heartbeat", "OK", 0.001);
  rpcs.Record("/grpc.health.v1.Health/Check", "OK", 0.001);
  const auto methods = rpcs.Snapshot();
  EXPECT_EQ(methods.size(), 3u);
  ASSERT_EQ(methods.count(RpcMetrics::kUnknownMethod), 1u);
  EXPECT_EQ(methods.at(RpcMetrics::kUnknownMethod).count, 20'000u);
  EXPECT_EQ(methods.count("/mptrain.v1.WorkerControl/Heartbeat"), 1u);
  EXPECT_EQ(methods.count("/grpc.health.v1.Health/Check"), 1u);
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
  overview.running.push_back(job);
  const std::string text = RenderMetrics(overview, RpcMetrics());
  EXPECT_TRUE(Contains(text, "mptrain_job_learning_rate{job_id=\"job-0007\",name=\"my \\\"run\\\"\"} 0.0025\n"));
  for (const char* name : {"mptrain_job_eval_loss{", "mptrain_job_eval_accuracy{",
                           "mptrain_job_eval_step{", "mptrain_job_accuracy{"}) {
    EXPECT_FALSE(Contains(text, name)) << "a job that has not evaluated has no " << name;
  }
  EXPECT_TRUE(Contains(text, "mptrain_jobs{state=\"running\"} 1\n"));
  EXPECT_TRUE(Contains(text, "mptrain_jobs{state=\"failed\"} 2\n"));
  EXPECT_TRUE(Contains(text, "mptrain_jobs{state=\"pending\"} 0\n"));
  // The pending count is mptrain_jobs{state="pending"}; no second family says it again.
  EXPECT_FALSE(Contains(text, "mptrain_queue_length"));
  // `job` is the scrape target's label: a job's own is job_id.
  EXPECT_FALSE(Contains(text, "{job=")) << text;
  EXPECT_TRUE(Contains(text, "mptrain_jobs_ended_total{state=\"failed\"} 2\n"));
  EXPECT_TRUE(Contains(text, "mptrain_workers{state=\"alive\"} 1\n"));
  EXPECT_TRUE(Contains(text, "mptrain_worker_free_slots{worker=\"w\",host=\"h1\",device=\"cpu\"} 2\n"));
  EXPECT_TRUE(Contains(text, "mptrain_worker_heartbeat_age_seconds{worker=\"w\",host=\"h1\"} 1.5\n"));
  EXPECT_TRUE(Contains(text, "mptrain_job_step{job_id=\"job-0007\",name=\"my \\\"run\\\"\"} 42\n"));
  EXPECT_TRUE(Contains(text, "mptrain_job_loss{job_id=\"job-0007\",name=\"my \\\"run\\\"\"} 0.125\n"));
  // It only goes up: a counter, named as one.
  EXPECT_TRUE(Contains(text, "# TYPE mptrain_job_skipped_steps_total counter\n"));
  EXPECT_TRUE(Contains(text, "mptrain_job_skipped_steps_total{job_id=\"job-0007\",name=\"my \\\"run\\\"\"} 3\n"));
  EXPECT_FALSE(Contains(text, "mptrain_job_skipped_steps{"));
  EXPECT_TRUE(Contains(text, "# TYPE mptrain_job_loss_scale gauge\n"));
  // Restarts: the coordinator's count and each job's, each a counter with its own name.
  EXPECT_TRUE(Contains(text, "# TYPE mptrain_jobs_restarted_total counter\n"));
  EXPECT_TRUE(Contains(text, "# TYPE mptrain_job_restarts_total counter\n"));
  EXPECT_TRUE(Contains(text, "mptrain_job_restarts_total{job_id=\"job-0007\",name=\"my \\\"run\\\"\"} 0\n"));
  EXPECT_FALSE(Contains(text, "mptrain_job_restarts{"));
  EXPECT_FALSE(Contains(text, "# TYPE mptrain_job_restarts gauge"));
}

v1::Worker UsageWorker(const std::string& id, v1::WorkerState state, int64_t usage_unix_ms) {
  v1::Worker worker;
  worker.set_worker_id(id);
  worker.set_host("10.0.0.7");
  worker.set_device(v1::CUDA);
  worker.set_state(state);
  worker.set_usage_unix_ms(usage_unix_ms);
  return worker;
}

// A live worker's latest usage: its host memory, and a series per GPU whose reading is
// available (utilization as a ratio); nothing for an unavailable reading, a worker that has
// sent none yet, or a lost one.
TEST(RenderMetrics, WorkerUsage_LiveReadingsOnly) {
  CoordinatorState::Overview overview;
  v1::Worker gpu = UsageWorker("g1#3", v1::ALIVE, 1'000);
  gpu.mutable_usage()->set_memory_available_bytes(int64_t{12} << 30);
  gpu.mutable_usage()->set_memory_total_bytes(int64_t{64} << 30);
  v1::DeviceUsage* read = gpu.mutable_usage()->add_devices();
  read->set_index(0);
  read->set_available(true);
  read->set_memory_used_bytes(int64_t{30} << 30);
  read->set_memory_total_bytes(int64_t{80} << 30);
  read->set_utilization_percent(75);
  gpu.mutable_usage()->add_devices()->set_index(1);  // Not available.
  overview.workers.push_back({gpu, 0.5, 1.25});
  v1::Worker silent = UsageWorker("g2#4", v1::ALIVE, 0);  // No reading yet.
  *silent.mutable_usage() = gpu.usage();  // (Zeros in practice; ignored either way.)
  overview.workers.push_back({silent, 0.5, 0});
  v1::Worker lost = UsageWorker("g3#5", v1::LOST, 1'000);
  *lost.mutable_usage() = gpu.usage();
  overview.workers.push_back({lost, 0.5, 0});

  const std::string text = RenderMetrics(overview, RpcMetrics());
  const std::string g1 = "{worker=\"g1\",host=\"10.0.0.7\"";
  auto bytes = [](int64_t gib) { return PrometheusText::FormatValue(gib * 1073741824.0); };
  EXPECT_TRUE(Contains(text, "# TYPE mptrain_worker_memory_available_bytes gauge\n"));
  EXPECT_TRUE(Contains(text, "mptrain_worker_memory_available_bytes" + g1 + "} " + bytes(12) + "\n"))
      << text;
  EXPECT_TRUE(Contains(text, "mptrain_worker_memory_total_bytes" + g1 + "} " + bytes(64) + "\n"));
  EXPECT_TRUE(Contains(text, "mptrain_worker_usage_age_seconds" + g1 + "} 1.25\n"));
  EXPECT_TRUE(Contains(text, "mptrain_worker_gpu_memory_used_bytes" + g1 + ",gpu=\"0\"} " +
                                 bytes(30) + "\n"));
  EXPECT_TRUE(Contains(text, "mptrain_worker_gpu_memory_total_bytes" + g1 + ",gpu=\"0\"} " +
                                 bytes(80) + "\n"));
  EXPECT_TRUE(Contains(text, "mptrain_worker_gpu_utilization_ratio" + g1 + ",gpu=\"0\"} 0.75\n"));
  EXPECT_FALSE(Contains(text, ",gpu=\"1\"}")) << "an unavailable reading has series";
  for (const char* family :
       {"mptrain_worker_usage_age_seconds", "mptrain_worker_memory_available_bytes",
        "mptrain_worker_memory_total_bytes", "mptrain_worker_gpu_memory_used_bytes",
        "mptrain_worker_gpu_memory_total_bytes", "mptrain_worker_gpu_utilization_ratio"}) {
    EXPECT_FALSE(Contains(text, std::string(family) + "{worker=\"g2\""))
        << "a worker with no reading yet has " << family;
    EXPECT_FALSE(Contains(text, std::string(family) + "{worker=\"g3\""))
        << "a lost worker has " << family;
  }
  EXPECT_TRUE(Contains(text, "\nmptrain_worker_gpu_readings_omitted 0\n"));
}

// However many live GPUs report, each GPU family holds at most kMaxGpuSeries series; the
// readings left out are counted.
TEST(RenderMetrics, GpuSeries_AreBounded) {
  CoordinatorState::Overview overview;
  const int workers = static_cast<int>(kMaxGpuSeries / kMaxUsageDevices) + 2;
  for (int w = 0; w < workers; ++w) {
    v1::Worker worker = UsageWorker("g" + std::to_string(w) + "#1", v1::ALIVE, 1'000);
    for (int d = 0; d < kMaxUsageDevices; ++d) {
      v1::DeviceUsage* device = worker.mutable_usage()->add_devices();
      device->set_index(d);
      device->set_available(true);
      device->set_memory_total_bytes(1);
    }
    overview.workers.push_back({worker, 0.5, 0.5});
  }
  const std::string text = RenderMetrics(overview, RpcMetrics());
  size_t series = 0;
  for (size_t at = text.find("\nmptrain_worker_gpu_utilization_ratio{"); at != std::string::npos;
       at = text.find("\nmptrain_worker_gpu_utilization_ratio{", at + 1)) {
    ++series;
  }
  EXPECT_EQ(series, kMaxGpuSeries);
  EXPECT_TRUE(Contains(text, "\nmptrain_worker_gpu_readings_omitted " +
                                 std::to_string(2 * kMaxUsageDevices) + "\n"));
}

TEST(RenderMetrics, BuildInfoAndProcessMetrics) {
  const std::string text = RenderMetrics(CoordinatorState::Overview(), RpcMetrics());
  EXPECT_TRUE(Contains(text, "# TYPE mptrain_build_info gauge\nmptrain_build_info{version=\""));
  for (const char* family :
       {"process_cpu_seconds_total ", "process_resident_memory_bytes ", "process_open_fds ",
        "process_start_time_seconds ", "process_virtual_memory_bytes "}) {
    EXPECT_TRUE(Contains(text, std::string("\n") + family)) << family << " missing:\n" << text;
  }
  // Values as /proc says, not placeholders: this test process has stdin..stderr open and
  // some memory resident, and it started before now.
  auto value = [&](const std::string& family) {
    const size_t at = text.find("\n" + family + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + family.size() + 2));
  };
  EXPECT_GE(value("process_open_fds"), 3);
  EXPECT_GT(value("process_resident_memory_bytes"), 1e6);
  EXPECT_GT(value("process_start_time_seconds"), 1.7e9);
  EXPECT_LE(value("process_start_time_seconds"),
            std::chrono::duration<double>(
                std::chrono::system_clock::now().time_since_epoch()).count());
}

// A job that ends between two scrapes is still scraped: its final values stay for
// kEndedJobMetricsMs, then go; only kMaxEndedJobMetrics of them, the newest.
TEST(RenderMetrics, EndedJobsStayForMinutes_ThenGo_Bounded) {
  int64_t now_ms = 1'000'000;
  CoordinatorOptions options;
  options.now_ms = [&] { return now_ms; };
  CoordinatorState state(options);
  v1::SubmitJobRequest submit;
  v1::JobSpec* spec = submit.mutable_spec();
  spec->set_name("short");
  spec->set_world_size(1);
  spec->set_device(v1::CPU);
  spec->mutable_model()->set_input_dim(4);
  spec->mutable_model()->set_output_dim(2);
  spec->mutable_data()->mutable_synthetic()->set_seed(0);
  spec->set_micro_batch_size(2);
  spec->set_accumulation_steps(1);
  spec->set_steps(10);
  spec->mutable_optimizer()->set_lr(0.1);
  std::vector<std::string> ids;
  for (size_t i = 0; i < CoordinatorState::Overview::kMaxEndedJobMetrics + 2; ++i) {
    auto submitted = state.SubmitJob(submit);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    ids.push_back(submitted->job_id());
    now_ms += 1;
    ASSERT_TRUE(state.CancelJob(ids.back()).ok());
  }
  auto metrics = [&] { return RenderMetrics(state.GetOverview(), RpcMetrics()); };
  auto has = [&](const std::string& text, const std::string& id) {
    return Contains(text, "mptrain_job_step{job_id=\"" + id + "\",name=\"short\"} 0\n");
  };
  std::string text = metrics();
  EXPECT_TRUE(has(text, ids.back())) << text;
  EXPECT_TRUE(Contains(text, "mptrain_job_ended_timestamp_seconds{job_id=\"" + ids.back() +
                                 "\",name=\"short\"} "));
  EXPECT_TRUE(has(text, ids[2]));
  EXPECT_FALSE(has(text, ids[0])) << "more than kMaxEndedJobMetrics ended jobs kept";
  EXPECT_FALSE(has(text, ids[1]));
  now_ms += CoordinatorState::Overview::kEndedJobMetricsMs - 10;
  EXPECT_TRUE(has(metrics(), ids.back()));
  now_ms += 20;
  text = metrics();
  EXPECT_FALSE(has(text, ids.back())) << "an ended job's series outlived kEndedJobMetricsMs";
  EXPECT_FALSE(Contains(text, "mptrain_job_step{"));
}

// The digits example's cadence, through the coordinator state: telemetry every 50 steps,
// evaluation every 100. The eval gauges appear with the first evaluation and stay, with the
// step they belong to, until the next one replaces them.
TEST(RenderMetrics, EvaluationStaysBetweenEvaluations_AndIsAbsentBeforeTheFirst) {
  CoordinatorState state(CoordinatorOptions{});
  v1::RegisterWorkerRequest worker;
  worker.set_host("127.0.0.1");
  worker.set_name("w");
  worker.set_device(v1::CPU);
  worker.set_slots(1);
  worker.set_incarnation(1);
  ASSERT_TRUE(state.RegisterWorker(worker).ok());
  v1::SubmitJobRequest submit;
  v1::JobSpec* spec = submit.mutable_spec();
  spec->set_name("digits");
  spec->set_world_size(1);
  spec->set_device(v1::CPU);
  spec->mutable_model()->set_input_dim(4);
  spec->mutable_model()->set_output_dim(2);
  spec->mutable_data()->mutable_synthetic()->set_seed(0);
  spec->set_micro_batch_size(2);
  spec->set_accumulation_steps(1);
  spec->set_steps(300);
  spec->mutable_optimizer()->set_lr(0.1);
  auto submitted = state.SubmitJob(submit);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string job = submitted->job_id();
  ASSERT_EQ(state.GetJob(job)->state(), v1::RUNNING);

  // Rank 0 reports `step`, with an evaluation when `eval_loss` >= 0.
  auto report = [&](int64_t step, double eval_loss, double eval_accuracy) {
    v1::ReportTelemetryRequest request;
    request.set_job_id(job);
    request.set_attempt(1);
    request.set_step(step);
    request.set_rank_secret(state.RankSecretForTesting(job, 1, 0));
    v1::TelemetryRecord* record = request.add_records();
    record->set_step(step);
    record->set_loss(1.0 / step);
    if (eval_loss >= 0) {
      record->set_eval_loss(eval_loss);
      record->set_eval_accuracy(eval_accuracy);
    }
    ASSERT_TRUE(state.ReportTelemetry(request).ok());
  };
  auto metrics = [&] { return RenderMetrics(state.GetOverview(), RpcMetrics()); };
  const std::string labels = "{job_id=\"" + job + "\",name=\"digits\"} ";

  report(50, -1, 0);
  std::string text = metrics();
  EXPECT_TRUE(Contains(text, "mptrain_job_step" + labels + "50\n")) << text;
  for (const char* name : {"mptrain_job_eval_loss{", "mptrain_job_eval_accuracy{",
                           "mptrain_job_eval_step{"}) {
    EXPECT_FALSE(Contains(text, name)) << "no evaluation yet, yet " << name << " is there";
  }

  report(100, 0.5, 0.875);
  text = metrics();
  EXPECT_TRUE(Contains(text, "mptrain_job_eval_loss" + labels + "0.5\n")) << text;
  EXPECT_TRUE(Contains(text, "mptrain_job_eval_accuracy" + labels + "0.875\n")) << text;
  EXPECT_TRUE(Contains(text, "mptrain_job_eval_step" + labels + "100\n")) << text;

  // The latest record has no evaluation: the last one is still exported, with its step.
  report(150, -1, 0);
  text = metrics();
  EXPECT_TRUE(Contains(text, "mptrain_job_step" + labels + "150\n")) << text;
  EXPECT_TRUE(Contains(text, "mptrain_job_eval_loss" + labels + "0.5\n")) << text;
  EXPECT_TRUE(Contains(text, "mptrain_job_eval_accuracy" + labels + "0.875\n")) << text;
  EXPECT_TRUE(Contains(text, "mptrain_job_eval_step" + labels + "100\n")) << text;
  EXPECT_EQ(state.GetJob(job)->latest_evaluation().step(), 100);

  report(200, 0.25, 0.9375);
  text = metrics();
  EXPECT_TRUE(Contains(text, "mptrain_job_eval_loss" + labels + "0.25\n")) << text;
  EXPECT_TRUE(Contains(text, "mptrain_job_eval_accuracy" + labels + "0.9375\n")) << text;
  EXPECT_TRUE(Contains(text, "mptrain_job_eval_step" + labels + "200\n")) << text;
}

}  // namespace
}  // namespace mptrain
