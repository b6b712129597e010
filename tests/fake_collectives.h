#pragma once

// Test doubles for the backend's outside world: a single-rank collective, a wrapper that counts
// collective calls, and an in-memory blocking key-value store for in-process rendezvous.

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "trainer/backend.h"
#include "trainer/key_value_store.h"

namespace mptrain::testing {

// World size 1: the mean over one rank is the buffer itself.
class SingleRankCollective final : public Collective {
 public:
  absl::Status AllReduceMean(Tensor) override { return absl::OkStatus(); }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
};

// Forwards to `inner` and counts the calls.
class CountingCollective final : public Collective {
 public:
  explicit CountingCollective(std::unique_ptr<Collective> inner) : inner_(std::move(inner)) {}
  absl::Status AllReduceMean(Tensor buffer) override {
    ++calls_;
    return inner_->AllReduceMean(buffer);
  }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  int calls() const { return calls_; }

 private:
  std::unique_ptr<Collective> inner_;
  int calls_ = 0;
};

class InMemoryKeyValueStore final : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
    changed_.notify_all();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key, int64_t timeout_ms) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                           [&] { return values_.count(key) > 0; })) {
      return absl::DeadlineExceededError("key " + key + " not set in time");
    }
    return values_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

}  // namespace mptrain::testing
