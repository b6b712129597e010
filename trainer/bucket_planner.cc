#include "trainer/bucket_planner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mptrain {

absl::StatusOr<std::vector<PlannedBucket>> PlanBuckets(const std::vector<int64_t>& sizes_bytes,
                                                       int64_t cap_bytes) {
  if (cap_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket cap must be > 0 bytes, got ", cap_bytes));
  }
  if (sizes_bytes.size() > kMaxPlannedGroups) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxPlannedGroups,
                                                   " parameter groups, got ", sizes_bytes.size()));
  }
  std::vector<PlannedBucket> buckets;
  for (size_t i = 0; i < sizes_bytes.size(); ++i) {
    const int64_t bytes = sizes_bytes[i];
    if (bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter group ", i, " has ", bytes, " bytes; sizes must be >= 0"));
    }
    // Compared as cap - total so that no sum can overflow.
    if (buckets.empty() || bytes > cap_bytes - buckets.back().bytes) {
      buckets.push_back({i, i, bytes});
    } else {
      buckets.back().last = i;
      buckets.back().bytes += bytes;
    }
  }
  return buckets;
}

absl::StatusOr<std::vector<RowRange>> PlanRowChunks(int64_t rows, int64_t row_bytes,
                                                    int64_t chunk_bytes) {
  if (rows < 1 || row_bytes < 1 || chunk_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("row chunks need rows, row bytes and chunk "
                                                   "bytes >= 1, got ", rows, ", ", row_bytes,
                                                   ", ", chunk_bytes));
  }
  // rows * row_bytes / chunk_bytes without overflow: rows / chunk_bytes * row_bytes is exact
  // enough only when divisible, so compute in 128 bits.
  const __int128 total = static_cast<__int128>(rows) * row_bytes;
  const int64_t by_size = static_cast<int64_t>(std::min<__int128>(total / chunk_bytes, rows));
  const int64_t chunks = std::min(rows, by_size);
  if (chunks < 2) return std::vector<RowRange>{{0, rows}};
  std::vector<RowRange> ranges;
  ranges.reserve(chunks);
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = static_cast<int64_t>(static_cast<__int128>(rows) * c / chunks);
    const int64_t next = static_cast<int64_t>(static_cast<__int128>(rows) * (c + 1) / chunks);
    ranges.push_back({first, next - first});
  }
  return ranges;
}

}  // namespace mptrain
