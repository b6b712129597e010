#pragma once

// A job's watch events (state changes and telemetry) with strictly increasing sequence numbers,
// bounded: the oldest fall off past `capacity`, and a finished job keeps fewer. Not
// thread-safe: the coordinator state's lock guards it.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <vector>

#include "proto/mptrain.pb.h"

namespace mptrain {

class JobEventLog {
 public:
  explicit JobEventLog(size_t capacity) : capacity_(capacity) {}

  // Stamps the next sequence number on `event` and keeps it; returns the stamped event.
  const v1::WatchJobEvent& Append(v1::WatchJobEvent event);
  // Up to `limit` events after `sequence`, oldest first (found by binary search: a watcher's
  // fetch costs what it returns, not what the log holds).
  std::vector<v1::WatchJobEvent> Since(int64_t sequence,
                                       size_t limit = std::numeric_limits<size_t>::max()) const;
  // Keeps only the newest `capacity` events from now on (a finished job).
  void Shrink(size_t capacity);
  // Restores a log (after a coordinator restart): the events and the last sequence number.
  void Restore(std::vector<v1::WatchJobEvent> events, int64_t last_sequence);

  int64_t last_sequence() const { return last_sequence_; }
  const std::deque<v1::WatchJobEvent>& events() const { return events_; }

 private:
  size_t capacity_;
  std::deque<v1::WatchJobEvent> events_;
  int64_t last_sequence_ = 0;
};

}  // namespace mptrain
