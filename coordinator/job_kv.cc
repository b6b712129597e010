#include "coordinator/job_kv.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace mptrain {

absl::Status JobKv::Set(const std::string& key, const std::string& value) {
  auto existing = values_.find(key);
  if (existing != values_.end()) {
    if (existing->second == value) return absl::OkStatus();
    return absl::AlreadyExistsError(
        absl::StrCat("key ", TruncateForError(key, 128), " is already set"));
  }
  const size_t bytes = key.size() + value.size();
  if (values_.size() >= max_keys_ || bytes_ + bytes > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the key-value store is full (", values_.size(), " keys, ", bytes_, " bytes; limits ",
        max_keys_, " keys, ", max_bytes_, " bytes)"));
  }
  values_[key] = value;
  bytes_ += bytes;
  return absl::OkStatus();
}

std::optional<std::string> JobKv::Get(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

void JobKv::Clear() {
  values_.clear();
  bytes_ = 0;
}

}  // namespace mptrain
