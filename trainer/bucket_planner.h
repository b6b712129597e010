#pragma once

// Gradient buckets, planned once from sizes alone (a pure function, like DDP's bucket
// assignment): which parameter groups are reduced together, and how one large group is split
// into row chunks. No backend, no tensors: tested on plain numbers.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace mptrain {

// Groups [first, last] (inclusive) of the input, in the input's order.
struct PlannedBucket {
  size_t first = 0;
  size_t last = 0;
  int64_t bytes = 0;
  bool operator==(const PlannedBucket& other) const {
    return first == other.first && last == other.last && bytes == other.bytes;
  }
};

inline constexpr size_t kMaxPlannedGroups = size_t{1} << 20;

// `sizes_bytes[i]`: the gradient bytes of group i, in the order the backward pass finishes them
// (the last layer first). Greedy, as DDP fills its buckets: consecutive groups share a bucket
// while their total stays <= cap_bytes; a group larger than the cap is a bucket of its own.
// Every group is in exactly one bucket. INVALID_ARGUMENT when cap_bytes <= 0, a size is < 0, or
// there are more than kMaxPlannedGroups groups.
absl::StatusOr<std::vector<PlannedBucket>> PlanBuckets(const std::vector<int64_t>& sizes_bytes,
                                                       int64_t cap_bytes);

// Rows [first, first + count).
struct RowRange {
  int64_t first = 0;
  int64_t count = 0;
  bool operator==(const RowRange& other) const {
    return first == other.first && count == other.count;
  }
};

// A [rows, row_bytes / element] gradient computed and reduced in chunks of about chunk_bytes:
// k = min(rows, rows * row_bytes / chunk_bytes) chunks of rows [rows·c/k, rows·(c+1)/k), or one
// chunk of every row when k < 2. INVALID_ARGUMENT when rows < 1, row_bytes < 1 or
// chunk_bytes < 1.
absl::StatusOr<std::vector<RowRange>> PlanRowChunks(int64_t rows, int64_t row_bytes,
                                                    int64_t chunk_bytes);

}  // namespace mptrain
