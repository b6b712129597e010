#include "coordinator/job_event_log.h"

#include <algorithm>
#include <cstddef>

namespace mptrain {

const v1::WatchJobEvent& JobEventLog::Append(v1::WatchJobEvent event) {
  event.set_sequence(++last_sequence_);
  events_.push_back(std::move(event));
  while (events_.size() > capacity_) events_.pop_front();
  return events_.back();
}

std::vector<v1::WatchJobEvent> JobEventLog::Since(int64_t sequence, size_t limit) const {
  auto first = std::upper_bound(
      events_.begin(), events_.end(), sequence,
      [](int64_t value, const v1::WatchJobEvent& event) { return value < event.sequence(); });
  const size_t count = std::min<size_t>(limit, static_cast<size_t>(events_.end() - first));
  return std::vector<v1::WatchJobEvent>(first, first + static_cast<std::ptrdiff_t>(count));
}

void JobEventLog::Shrink(size_t capacity) {
  capacity_ = capacity;
  while (events_.size() > capacity_) events_.pop_front();
}

void JobEventLog::Restore(std::vector<v1::WatchJobEvent> events, int64_t last_sequence) {
  events_.assign(events.begin(), events.end());
  while (events_.size() > capacity_) events_.pop_front();
  last_sequence_ = last_sequence;
}

}  // namespace mptrain
