#pragma once

// What a rank process says to the coordinator: the job's key-value store (rendezvous),
// batched telemetry and progress, and its final result. Every RPC has a deadline.

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/stop_token.h"
#include "proto/mptrain.grpc.pb.h"
#include "trainer/key_value_store.h"
#include "trainer/train_loop.h"

namespace mptrain {

struct RankIdentity {
  std::string job_id;
  int rank = 0;
  int attempt = 0;
  std::string secret;  // The assignment's rank secret: every call of this rank carries it.
};

// KeyValueStore over KeyValueSet / KeyValueGet (blocking get with timeout on the server).
class GrpcKeyValueStore final : public KeyValueStore {
 public:
  GrpcKeyValueStore(std::shared_ptr<v1::WorkerControl::StubInterface> stub, RankIdentity identity)
      : stub_(std::move(stub)), identity_(std::move(identity)) {}
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, int64_t timeout_ms) override;

 private:
  std::shared_ptr<v1::WorkerControl::StubInterface> stub_;
  RankIdentity identity_;
};

// The wire form of a step's telemetry.
v1::TelemetryRecord ToTelemetryRecord(const StepTelemetry& step);

// A TrainingObserver that queues records and sends them from a background thread every
// flush_interval_ms (so a rank never makes one RPC per step; the first step's record at once),
// with its step and latest checkpoint. The report doubles as the rank's liveness signal, so it
// is sent even when no step finished. When the coordinator answers abort (job cancelled or failed elsewhere), it trips
// the rank's stop token (which aborts the collective); ShouldStop() is that token.
class TelemetryReporter final : public TrainingObserver {
 public:
  // `stop` must outlive the reporter.
  TelemetryReporter(std::shared_ptr<v1::WorkerControl::StubInterface> stub, RankIdentity identity,
                    StopToken* stop, int64_t flush_interval_ms = 500);
  ~TelemetryReporter() override;

  void OnStep(int64_t step, const StepTelemetry* record) override;
  bool ShouldStop() override { return stop_->stop_requested(); }
  std::string StopReason() override;
  void OnCheckpoint(int64_t step, const std::string& path) override;
  void OnWarning(const std::string& message) override;
  void OnSetUp(double model_built_ms, double initialised_ms) override;
  // A generated text: a SAMPLE note, bounded as the warnings are.
  void OnSample(int64_t step, const std::string& text) override;
  void OnWorkUnit() override;
  int64_t AcknowledgedCheckpointStep() override;
  // Sends what is queued and stops the thread.
  void Flush();

 private:
  void Run();
  bool SendBatch();
  size_t QueuedRecords();

  std::shared_ptr<v1::WorkerControl::StubInterface> stub_;
  RankIdentity identity_;
  int64_t flush_interval_ms_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<v1::TelemetryRecord> queued_;
  void AddNote(v1::RankNote::Kind kind, int64_t step, const std::string& text);
  std::vector<v1::RankNote> notes_;  // Warnings for the job's events, sent with the next report.
  int64_t step_ = 0;
  int64_t work_units_ = 0;  // Evaluation batches and sampled tokens (ReportTelemetryRequest).
  int64_t checkpoint_step_ = 0;
  std::string checkpoint_path_;
  // The newest checkpoint step a report the coordinator answered carried: until then (0)
  // every checkpoint file stays.
  int64_t acknowledged_checkpoint_step_ = 0;
  StopToken* stop_;
  bool stopping_ = false;
  bool first_record_queued_ = false;
  bool send_now_ = false;  // The first record is queued: the thread sends without waiting.
  std::thread thread_;
};

// Sends the final result: a checksum, or the error. Retries briefly on UNAVAILABLE.
absl::Status ReportRankResult(v1::WorkerControl::StubInterface* stub, const RankIdentity& identity,
                              const absl::StatusOr<std::string>& checksum);

}  // namespace mptrain
