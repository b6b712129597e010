#pragma once

// A KeyValueStore for ranks that live in one process (multi-GPU benchmarks, tests): the same
// blocking-get semantics as the coordinator's store, in memory.

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "trainer/key_value_store.h"

namespace mptrain {

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

}  // namespace mptrain
