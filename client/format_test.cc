#include "client/format.h"

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(FormatTable, PadsColumnsToTheWidestCell) {
  EXPECT_EQ(FormatTable({{"A", "BB"}, {"ccc", "d"}}), "A    BB\nccc  d\n");
}

TEST(FormatTelemetryLine, ShowsEveryTelemetryField) {
  v1::TelemetryRecord record;
  record.set_step(3);
  record.set_loss(0.5);
  record.set_grad_norm(1.25);
  record.set_loss_scale(65536);
  record.set_skipped(true);
  record.set_skipped_total(2);
  record.set_step_time_ms(1.5);
  record.set_samples_per_second(1000);
  const std::string line = FormatTelemetryLine(record);
  for (const char* part : {"step      3", "loss 0.500000", "grad_norm 1.25", "scale 65536",
                           "skipped yes (2 total)", "1.500 ms", "1000 samples/s",
                           "lr 0"}) {  // A warm-up's first step trains with lr 0: shown.
    EXPECT_NE(line.find(part), std::string::npos) << part << " not in: " << line;
  }
}

TEST(ToJson, UsesProtoFieldNames) {
  v1::SubmitJobResponse response;
  response.set_job_id("job-0001");
  response.set_state(v1::PENDING);
  EXPECT_EQ(ToJson(response, false), R"({"job_id":"job-0001","state":"PENDING"})");
}

TEST(FormatJobDetail, ShowsErrorPlacementAndChecksums) {
  v1::Job job;
  job.set_job_id("job-0002");
  job.set_state(v1::FAILED);
  job.set_error("rank 1 on worker w#2 (h) was killed by signal 9");
  job.mutable_spec()->set_world_size(2);
  job.mutable_spec()->mutable_model()->set_input_dim(4);
  job.mutable_spec()->mutable_model()->set_output_dim(2);
  auto* placement = job.add_placement();
  placement->set_rank(0);
  placement->set_worker_id("w#2");
  auto* progress = job.add_progress();
  progress->set_parameter_checksum("00ff");
  const std::string text = FormatJobDetail(job);
  EXPECT_NE(text.find("FAILED"), std::string::npos);
  EXPECT_NE(text.find("signal 9"), std::string::npos);
  EXPECT_NE(text.find("w#2"), std::string::npos);
  EXPECT_NE(text.find("00ff"), std::string::npos);
  EXPECT_NE(text.find("MLP 4->2"), std::string::npos);
  EXPECT_NE(text.find("training:   mse, sgd lr 0"), std::string::npos) << text;
}

TEST(FormatJobDetail, AGptJobShowsItsShapeNotAnEmptyMlp) {
  v1::Job job;
  job.set_job_id("job-0009");
  job.mutable_spec()->set_world_size(2);
  v1::GptSpec* gpt = job.mutable_spec()->mutable_model()->mutable_gpt();
  gpt->set_vocab_size(50257);
  gpt->set_padded_vocab_size(50304);
  gpt->set_context_length(1024);
  gpt->set_layers(12);
  gpt->set_heads(12);
  gpt->set_width(768);
  const std::string text = FormatJobDetail(job);
  EXPECT_NE(text.find("GPT 12 layers x 768 wide, 12 heads, context 1024, vocab 50257 (padded to "
                      "50304)"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("MLP"), std::string::npos) << text;
}

TEST(FormatJobDetail, ShowsLossOptimizerAndSchedule) {
  v1::Job job;
  job.mutable_spec()->set_loss(v1::CROSS_ENTROPY);
  job.mutable_spec()->mutable_optimizer()->set_kind(v1::ADAMW);
  job.mutable_spec()->mutable_optimizer()->set_lr(0.002);
  job.mutable_spec()->mutable_lr_schedule()->set_kind(v1::WARMUP_COSINE);
  job.mutable_spec()->mutable_eval_data()->set_features_path("/d/x.npy");
  const std::string text = FormatJobDetail(job);
  EXPECT_NE(text.find("training:   cross_entropy, adamw lr 0.002, warmup_cosine, evaluated"),
            std::string::npos)
      << text;
}

TEST(FormatTelemetryLine, ShowsLearningRateAccuracyAndEvaluation) {
  v1::TelemetryRecord record;
  record.set_lr(0.001);
  record.set_accuracy(0.75);
  record.set_eval_loss(0.25);
  record.set_eval_accuracy(0.5);
  const std::string line = FormatTelemetryLine(record);
  for (const char* part : {"lr 0.001", "acc 0.7500", "eval_loss 0.250000", "eval_acc 0.5000"}) {
    EXPECT_NE(line.find(part), std::string::npos) << part << " not in: " << line;
  }
}

TEST(FormatJobDetail, ShowsTheLastEvaluationBetweenEvaluations) {
  v1::Job job;
  job.mutable_latest_telemetry()->set_step(150);
  EXPECT_EQ(FormatJobDetail(job).find("evaluated:"), std::string::npos) << "none yet";
  job.mutable_latest_evaluation()->set_step(100);
  job.mutable_latest_evaluation()->set_eval_loss(0.25);
  job.mutable_latest_evaluation()->set_eval_accuracy(0.875);
  const std::string text = FormatJobDetail(job);
  EXPECT_NE(text.find("evaluated:  step    100  eval_loss 0.250000  eval_acc 0.8750\n"),
            std::string::npos)
      << text;
}

// Defaults were dropped: rank 0's placement had no "rank", so `jq '.placement[].rank'` gave
// null, and `lr: 0`, `skipped: false` disappeared.
TEST(ToJson, EveryFieldIsPresent_DefaultsToo) {
  v1::Job job;
  job.set_job_id("job-0001");
  job.add_placement()->set_worker_id("w0");  // Rank 0, device 0: all defaults.
  const std::string json = ToJson(job, false);
  EXPECT_NE(json.find(R"("placement":[{"rank":0,"worker_id":"w0","host":"","device_index":0})"),
            std::string::npos)
      << json;
  v1::TelemetryRecord record;
  const std::string telemetry = ToJson(record, false);
  EXPECT_NE(telemetry.find(R"("lr":0)"), std::string::npos) << telemetry;
  EXPECT_NE(telemetry.find(R"("skipped":false)"), std::string::npos) << telemetry;
}

// Each worker's latest usage: host memory available of total, and each GPU's memory and
// utilization, "n/a" for a device without a reading (or before any), "-" without devices.
TEST(FormatWorkerTable, ShowsMemoryAvailableAndGpuUse_NaWhenUnread) {
  v1::Worker cpu;
  cpu.set_worker_id("w1#1");
  cpu.set_host("10.0.0.1");
  cpu.set_device(v1::CPU);
  cpu.set_state(v1::ALIVE);
  cpu.set_usage_unix_ms(1);
  cpu.mutable_usage()->set_memory_available_bytes(int64_t{12} << 30);
  cpu.mutable_usage()->set_memory_total_bytes(int64_t{64} << 30);
  v1::Worker gpu;
  gpu.set_worker_id("g1#2");
  gpu.set_host("10.0.0.2");
  gpu.set_device(v1::CUDA);
  gpu.set_state(v1::ALIVE);
  for (int i = 0; i < 2; ++i) {
    v1::DeviceInfo* device = gpu.add_devices();
    device->set_index(i);
    device->set_name("NVIDIA H100");
  }
  v1::Worker unread = gpu;  // Registered, no heartbeat with usage yet.
  unread.set_worker_id("g2#3");
  gpu.set_usage_unix_ms(1);
  gpu.mutable_usage()->set_memory_available_bytes(int64_t{40} << 30);
  gpu.mutable_usage()->set_memory_total_bytes(int64_t{64} << 30);
  v1::DeviceUsage* read = gpu.mutable_usage()->add_devices();
  read->set_index(0);
  read->set_available(true);
  read->set_memory_used_bytes(int64_t{30} << 30);
  read->set_memory_total_bytes(int64_t{80} << 30);
  read->set_utilization_percent(75);
  gpu.mutable_usage()->add_devices()->set_index(1);  // Not available.
  const std::string table = FormatWorkerTable({cpu, gpu, unread});
  const std::vector<std::string> lines = absl::StrSplit(table, '\n');
  ASSERT_GE(lines.size(), 4u) << table;
  EXPECT_NE(lines[0].find("MEM AVAIL"), std::string::npos) << table;
  EXPECT_NE(lines[0].find("GPU USE"), std::string::npos) << table;
  EXPECT_NE(lines[1].find("12.0/64.0 GiB"), std::string::npos) << table;
  EXPECT_EQ(lines[1].substr(lines[1].size() - 1), "-") << table;
  EXPECT_NE(lines[2].find("40.0/64.0 GiB"), std::string::npos) << table;
  EXPECT_NE(lines[2].find("0: 30.0/80.0 GiB 75%, 1: n/a"), std::string::npos) << table;
  EXPECT_NE(lines[3].find("n/a  "), std::string::npos) << "memory before a reading: " << table;
  EXPECT_NE(lines[3].find("0: n/a, 1: n/a"), std::string::npos) << table;

  const std::string json = ToJson(unread, false);
  EXPECT_NE(json.find(R"("usage_unix_ms":"0")"), std::string::npos) << json;
}

TEST(FormatJobTable, NoJobs_SaysSo) { EXPECT_EQ(FormatJobTable({}, 0), "No jobs.\n"); }

TEST(FormatJobTable, ShowsOwnerAgeDurationAndThePendingReason) {
  v1::Job waiting;
  waiting.set_job_id("job-0002");
  waiting.set_owner("alice");
  waiting.set_state(v1::PENDING);
  waiting.set_pending_reason("needs 3 cpu slots; the workers have 2");
  waiting.set_submitted_unix_ms(10'000'000'000 - 90'000);
  v1::Job done;
  done.set_job_id("job-0001");
  done.set_state(v1::SUCCEEDED);
  done.set_submitted_unix_ms(10'000'000'000 - 7'200'000);
  done.set_started_unix_ms(10'000'000'000 - 7'200'000);
  done.set_finished_unix_ms(10'000'000'000 - 7'200'000 + 300'000);
  const std::string table = FormatJobTable({waiting, done}, 10'000'000'000);
  for (const char* part : {"OWNER", "AGE", "DURATION", "REASON", "alice", "90s",
                           "needs 3 cpu slots; the workers have 2", "2h", "5m"}) {
    EXPECT_NE(table.find(part), std::string::npos) << part << " not in:\n" << table;
  }
}

// A CPU rank's DEVICE column read `0`, as if it ran on GPU 0; and no times were shown.
TEST(FormatJobDetail, CpuRanksHaveNoDeviceIndex_TimesAreShown) {
  v1::Job job;
  job.set_job_id("job-0003");
  job.set_state(v1::RUNNING);
  job.mutable_spec()->set_device(v1::CPU);
  job.set_submitted_unix_ms(1'700'000'000'000);
  job.set_started_unix_ms(1'700'000'001'000);
  v1::RankPlacement* placement = job.add_placement();
  placement->set_worker_id("w0");
  placement->set_host("h0");
  const std::string detail = FormatJobDetail(job);
  EXPECT_NE(detail.find("submitted:  2023-11-14 22:13:20 UTC"), std::string::npos) << detail;
  EXPECT_NE(detail.find("started:    2023-11-14 22:13:21 UTC"), std::string::npos) << detail;
  const size_t row = detail.find("w0");
  ASSERT_NE(row, std::string::npos) << detail;
  const std::string line = detail.substr(row, detail.find('\n', row) - row);
  const std::vector<std::string> cells = absl::StrSplit(line, ' ', absl::SkipEmpty());
  ASSERT_GE(cells.size(), 3u) << line;
  EXPECT_EQ(cells[2], "-") << "the DEVICE of a CPU rank: " << line;
}

}  // namespace
}  // namespace mptrain
