#include "coordinator/job_event_log.h"

namespace mptrain {

const v1::WatchJobEvent& JobEventLog::Append(v1::WatchJobEvent event) {
  event.set_sequence(++last_sequence_);
  events_.push_back(std::move(event));
  while (events_.size() > capacity_) events_.pop_front();
  return events_.back();
}

std::vector<v1::WatchJobEvent> JobEventLog::Since(int64_t sequence) const {
  std::vector<v1::WatchJobEvent> events;
  for (const v1::WatchJobEvent& event : events_) {
    if (event.sequence() > sequence) events.push_back(event);
  }
  return events;
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
