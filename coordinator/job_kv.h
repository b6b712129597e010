#pragma once

// One job attempt's key-value store (the NCCL unique id, gloo's rendezvous addresses): keys
// are write-once (a retry with the same value is fine; another value is ALREADY_EXISTS, so no
// rank can rewrite another's rendezvous data) and the store is bounded in keys and bytes.
// Not thread-safe: the coordinator state's lock guards it.

#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace mptrain {

class JobKv {
 public:
  JobKv(size_t max_keys, size_t max_bytes) : max_keys_(max_keys), max_bytes_(max_bytes) {}

  // ALREADY_EXISTS: the key holds another value. RESOURCE_EXHAUSTED: over a bound (the
  // message names both). Key and value sizes are checked by the caller, before any lock.
  absl::Status Set(const std::string& key, const std::string& value);
  std::optional<std::string> Get(const std::string& key) const;
  bool Contains(const std::string& key) const { return values_.count(key) > 0; }
  void Clear();

  const std::map<std::string, std::string>& values() const { return values_; }
  size_t bytes() const { return bytes_; }

 private:
  size_t max_keys_;
  size_t max_bytes_;
  std::map<std::string, std::string> values_;
  size_t bytes_ = 0;
};

}  // namespace mptrain
