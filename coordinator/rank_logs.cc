#include "coordinator/rank_logs.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace mptrain {

absl::Status RankLogs::Append(int attempt, int rank, int64_t offset, const std::string& data) {
  if (data.size() > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a log chunk is at most ", kMaxChunkBytes,
                                                   " bytes, got ", data.size()));
  }
  if (offset < 0 || offset > std::numeric_limits<int64_t>::max() -
                                  static_cast<int64_t>(data.size())) {
    return absl::InvalidArgumentError("offset must be >= 0, and offset + the chunk's size fit "
                                      "in 64 bits");
  }
  Tail& tail = tails_[{attempt, rank}];
  const int64_t end = offset + static_cast<int64_t>(data.size());
  if (end <= tail.end()) return absl::OkStatus();  // Already held (a retried chunk).
  if (offset > tail.end()) {
    // The worker dropped bytes in between: start again at this chunk.
    tail.data = data;
    tail.start = offset;
  } else {
    tail.data.append(data, static_cast<size_t>(tail.end() - offset), std::string::npos);
  }
  Trim(&tail);
  // Only the two newest attempts.
  while (true) {
    int newest = 0, oldest = attempt;
    for (const auto& [key, unused] : tails_) {
      newest = std::max(newest, key.first);
      oldest = std::min(oldest, key.first);
    }
    if (newest - oldest < 2) break;
    for (auto it = tails_.begin(); it != tails_.end();) {
      it = it->first.first == oldest ? tails_.erase(it) : std::next(it);
    }
  }
  return absl::OkStatus();
}

void RankLogs::MarkComplete(int attempt, int rank) { tails_[{attempt, rank}].complete = true; }

void RankLogs::Trim(Tail* tail) const {
  if (tail->data.size() <= max_bytes_) return;
  const size_t drop = tail->data.size() - max_bytes_;
  // A copy of what is kept, not erase(): erase keeps the string's memory, so an ended job's
  // 16 KiB tails went on holding the 64 KiB (and more) of their running days.
  std::string kept(tail->data, drop);
  tail->data.swap(kept);
  tail->start += static_cast<int64_t>(drop);
}

void RankLogs::Shrink(int world_size) {
  const size_t tails = 2 * static_cast<size_t>(std::max(1, world_size));
  max_bytes_ = std::clamp(kMaxBytesPerJobEnded / tails, kMinBytesPerRankEnded,
                          kMaxBytesPerRankEnded);
  for (auto& [key, tail] : tails_) {
    Trim(&tail);
    tail.data.shrink_to_fit();
  }
}

size_t RankLogs::HeldBytes() const {
  size_t bytes = 0;
  for (const auto& [key, tail] : tails_) bytes += tail.data.capacity();
  return bytes;
}

store::StoredRankLog RankLogs::Stored(int attempt, int rank, const Tail& tail) {
  store::StoredRankLog stored;
  stored.set_attempt(attempt);
  stored.set_rank(rank);
  stored.set_start_offset(tail.start);
  stored.set_data(tail.data);
  stored.set_complete(tail.complete);
  return stored;
}

std::optional<store::StoredRankLog> RankLogs::ToStored(int attempt, int rank) const {
  auto it = tails_.find({attempt, rank});
  if (it == tails_.end()) return std::nullopt;
  return Stored(attempt, rank, it->second);
}

std::vector<store::StoredRankLog> RankLogs::ToStored() const {
  std::vector<store::StoredRankLog> all;
  for (const auto& [key, tail] : tails_) all.push_back(Stored(key.first, key.second, tail));
  return all;
}

void RankLogs::Restore(const store::StoredRankLog& stored) {
  Tail& tail = tails_[{stored.attempt(), stored.rank()}];
  tail.data = stored.data();
  tail.start = std::max<int64_t>(0, stored.start_offset());
  tail.complete = stored.complete();
  Trim(&tail);
}

absl::StatusOr<v1::GetRankLogResponse> RankLogs::Read(int attempt, int rank,
                                                      int64_t after_offset) const {
  if (attempt == 0) {
    for (const auto& [key, tail] : tails_) {
      if (key.second == rank && !tail.data.empty()) attempt = std::max(attempt, key.first);
    }
  }
  auto it = tails_.find({attempt, rank});
  if (it == tails_.end()) {
    return absl::NotFoundError(absl::StrCat("no output of rank ", rank,
                                            attempt == 0 ? "" : absl::StrCat(" attempt ", attempt),
                                            " yet"));
  }
  const Tail& tail = it->second;
  v1::GetRankLogResponse response;
  response.set_attempt(attempt);
  const int64_t from = std::clamp<int64_t>(after_offset, tail.start, tail.end());
  response.set_start_offset(from);
  response.set_data(tail.data.substr(static_cast<size_t>(from - tail.start)));
  response.set_end_offset(tail.end());
  response.set_complete(tail.complete);
  return response;
}

}  // namespace mptrain
