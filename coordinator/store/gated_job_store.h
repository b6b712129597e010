#pragma once

// For tests: a JobStore whose commits wait while its gate is closed (a slow disk, held still).

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "coordinator/store/job_store.h"

namespace mptrain {

class GatedJobStore final : public JobStore {
 public:
  explicit GatedJobStore(JobStore* inner) : inner_(inner) {}
  absl::StatusOr<Snapshot> Load() override { return inner_->Load(); }
  absl::Status Commit(const Batch& batch) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
    --waiting_;
    return inner_->Commit(batch);
  }
  absl::StatusOr<std::vector<v1::WatchJobEvent>> LoadEvents(int64_t number, int64_t after,
                                                            int limit) override {
    return inner_->LoadEvents(number, after, limit);
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    changed_.notify_all();
  }
  // Until a commit waits at the closed gate; false when none came within `timeout` (a test then
  // fails instead of hanging).
  [[nodiscard]] bool AwaitHeldCommit(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, timeout, [this] { return waiting_ > 0; });
  }

 private:
  JobStore* inner_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool open_ = true;
  int waiting_ = 0;
};

}  // namespace mptrain
