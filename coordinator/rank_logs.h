#pragma once

// The last part of each rank's output for one job (what `trainctl logs` shows), shipped by the
// workers in chunks. Per (attempt, rank): the newest kMaxBytesPerRank bytes, with their offsets
// in the rank's whole output, so a reader can follow it and knows when bytes fell off. Only the
// two newest attempts are kept; an ended job keeps a shorter tail. The job store keeps a copy
// (ToStored, Restore) so that an ended job's output outlives a coordinator restart; JobRecord
// says when to write it. Not thread-safe: CoordinatorState's lock guards it.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/store/stored_job.pb.h"
#include "proto/mptrain.pb.h"

namespace mptrain {

class RankLogs {
 public:
  static constexpr size_t kMaxBytesPerRank = 64 << 10;
  static constexpr size_t kMaxBytesPerRankEnded = 16 << 10;
  // An ended job's tails together (two attempts of every rank): with 1,000 ended jobs kept,
  // a few GiB at most however wide the jobs were.
  static constexpr size_t kMaxBytesPerJobEnded = 2 << 20;
  static constexpr size_t kMinBytesPerRankEnded = 1 << 10;
  static constexpr size_t kMaxChunkBytes = 64 << 10;

  // A chunk at `offset` of the rank's output. Bytes already held are skipped; a gap (bytes the
  // worker dropped) is accepted. INVALID_ARGUMENT: a chunk over kMaxChunkBytes or a negative
  // offset.
  absl::Status Append(int attempt, int rank, int64_t offset, const std::string& data);
  // The rank's process ended (its worker sends the rest of its output before saying so).
  void MarkComplete(int attempt, int rank);
  // The job (of `world_size` ranks) ended: keep less of each — kMaxBytesPerRankEnded, less for
  // wide jobs so that two attempts of every rank fit in kMaxBytesPerJobEnded (but at least
  // kMinBytesPerRankEnded) — and hold no more memory than that.
  void Shrink(int world_size);
  // The memory the tails hold.
  size_t HeldBytes() const;
  // NOT_FOUND: nothing of that rank (and attempt; 0 = the newest attempt with output).
  absl::StatusOr<v1::GetRankLogResponse> Read(int attempt, int rank, int64_t after_offset) const;

  // The tail of (attempt, rank) as the store keeps it; nullopt when none is held.
  std::optional<store::StoredRankLog> ToStored(int attempt, int rank) const;
  // Every tail held.
  std::vector<store::StoredRankLog> ToStored() const;
  // A tail the store kept (after a coordinator restart), cut to what this object keeps.
  void Restore(const store::StoredRankLog& stored);

 private:
  struct Tail {
    std::string data;
    int64_t start = 0;  // Offset of data[0].
    bool complete = false;
    int64_t end() const { return start + static_cast<int64_t>(data.size()); }
  };
  static store::StoredRankLog Stored(int attempt, int rank, const Tail& tail);
  // Drops the oldest bytes past max_bytes_.
  void Trim(Tail* tail) const;
  std::map<std::pair<int, int>, Tail> tails_;  // (attempt, rank) -> its tail
  size_t max_bytes_ = kMaxBytesPerRank;
};

}  // namespace mptrain
