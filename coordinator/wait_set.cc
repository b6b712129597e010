#include "coordinator/wait_set.h"

namespace mptrain {

WaitSet::WaitSet() : timer_([this] { TimerLoop(); }) {}

WaitSet::~WaitSet() {
  Shutdown();
  if (timer_.joinable()) timer_.join();
}

size_t WaitSet::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

uint64_t WaitSet::Wait(const std::string& key, Clock::time_point deadline, Callback callback) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shutdown_) {
      id = next_id_++;
      entries_[id] = Entry{key, deadline, std::move(callback)};
      by_key_.emplace(key, id);
      const bool earliest = by_deadline_.empty() || deadline < by_deadline_.begin()->first;
      by_deadline_.emplace(deadline, id);
      if (earliest) timer_wake_.notify_one();
      return id;
    }
  }
  callback(Reason::kShutdown);
  return 0;
}

WaitSet::Callback WaitSet::Take(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  Callback callback = std::move(it->second.callback);
  auto range = by_key_.equal_range(it->second.key);
  for (auto key = range.first; key != range.second; ++key) {
    if (key->second == id) {
      by_key_.erase(key);
      break;
    }
  }
  auto deadlines = by_deadline_.equal_range(it->second.deadline);
  for (auto deadline = deadlines.first; deadline != deadlines.second; ++deadline) {
    if (deadline->second == id) {
      by_deadline_.erase(deadline);
      break;
    }
  }
  entries_.erase(it);
  return callback;
}

void WaitSet::Notify(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  bool any = false;
  for (const std::string& key : keys) {
    std::vector<uint64_t> ids;
    auto range = by_key_.equal_range(key);
    for (auto it = range.first; it != range.second; ++it) ids.push_back(it->second);
    for (uint64_t id : ids) {
      if (Callback callback = Take(id)) {
        notified_.push_back(std::move(callback));
        any = true;
      }
    }
  }
  if (any) timer_wake_.notify_one();
}

void WaitSet::Cancel(uint64_t id) {
  Callback callback;
  {
    std::lock_guard<std::mutex> lock(mu_);
    callback = Take(id);
  }
  if (callback) callback(Reason::kCancelled);
}

void WaitSet::Shutdown() {
  std::vector<Callback> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    shutdown_ = true;
    std::vector<uint64_t> ids;
    for (const auto& [id, entry] : entries_) ids.push_back(id);
    for (uint64_t id : ids) due.push_back(Take(id));
    // Taken but not yet run: they end with the shutdown too.
    for (Callback& callback : notified_) due.push_back(std::move(callback));
    notified_.clear();
  }
  timer_wake_.notify_all();
  for (Callback& callback : due) callback(Reason::kShutdown);
}

void WaitSet::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutdown_) {
    if (!notified_.empty()) {
      std::vector<Callback> due = std::move(notified_);
      notified_.clear();
      lock.unlock();
      for (Callback& callback : due) callback(Reason::kNotified);
      lock.lock();
      continue;
    }
    if (by_deadline_.empty()) {
      timer_wake_.wait(lock);
      continue;
    }
    const Clock::time_point next = by_deadline_.begin()->first;
    if (Clock::now() < next) {
      timer_wake_.wait_until(lock, next);
      continue;
    }
    std::vector<Callback> due;
    while (!by_deadline_.empty() && by_deadline_.begin()->first <= Clock::now()) {
      due.push_back(Take(by_deadline_.begin()->second));
    }
    lock.unlock();
    for (Callback& callback : due) callback(Reason::kDeadline);
    lock.lock();
  }
}

}  // namespace mptrain
