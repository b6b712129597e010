#include "client/format.h"

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

}  // namespace
}  // namespace mptrain
