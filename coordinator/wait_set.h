#pragma once

// The one wait/cancel mechanism for long calls (PollAssignments, KeyValueGet, WatchJob): a
// call that has nothing to answer yet registers a wait on a key ("worker:<id>", "job:<id>")
// with a deadline and a callback, and returns its thread to gRPC. The coordinator state names
// the keys each mutation touched; Notify runs the callbacks of exactly those waits (no wake-up
// for everybody), and one thread of its own runs them and the callbacks of waits whose
// deadline passed,
// and Cancel takes a wait back (the client went away). Each wait's callback runs exactly once.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace mptrain {

class WaitSet {
 public:
  enum class Reason { kNotified, kDeadline, kCancelled, kShutdown };
  using Callback = std::function<void(Reason)>;
  using Clock = std::chrono::steady_clock;

  WaitSet();
  ~WaitSet();  // Shuts down: pending callbacks run with kShutdown.

  // Returns an id for Cancel. The callback runs on the notifying or the timer thread, never
  // under a lock of this class, and never twice.
  uint64_t Wait(const std::string& key, Clock::time_point deadline, Callback callback);
  // Runs the callbacks of every wait on these keys, soon, on the wait set's own thread: a
  // callback never runs inside the notifier's call (which may hold another call's lock).
  void Notify(const std::vector<std::string>& keys);
  void Cancel(uint64_t id);
  void Shutdown();

  size_t size() const;

 private:
  struct Entry {
    std::string key;
    Clock::time_point deadline;
    Callback callback;
  };
  void TimerLoop();
  // Removes the entry (if still there) and returns its callback.
  Callback Take(uint64_t id);

  mutable std::mutex mu_;
  std::condition_variable timer_wake_;
  bool shutdown_ = false;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Entry> entries_;
  std::unordered_multimap<std::string, uint64_t> by_key_;
  std::multimap<Clock::time_point, uint64_t> by_deadline_;
  std::vector<Callback> notified_;  // Taken by Notify, run by the timer thread.
  std::thread timer_;
};

}  // namespace mptrain
