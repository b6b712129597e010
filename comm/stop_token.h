#pragma once

// One stop signal per rank process, shared by everything that may block on peers.
//
// The rank process trips it (SIGTERM from its worker, or the coordinator saying the job ended);
// each collective registers a callback that aborts it (Collective::Abort), so a collective
// blocked on a peer returns ABORTED at once instead of waiting out its timeout, and the loop
// sees stop_requested() between steps. The first reason given is the one kept.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace mptrain {

class StopToken {
 public:
  using Callback = std::function<void(const std::string& reason)>;

  // Keeps a callback registered while it lives; destroying it unregisters the callback and, if
  // the callback is running on another thread, waits for it to return (so whatever the callback
  // touches may be destroyed right after).
  class Registration {
   public:
    ~Registration();
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;

   private:
    friend class StopToken;
    Registration(StopToken* token, uint64_t id) : token_(token), id_(id) {}
    StopToken* token_;
    uint64_t id_;
  };

  StopToken() = default;
  StopToken(const StopToken&) = delete;
  StopToken& operator=(const StopToken&) = delete;
  ~StopToken();  // Every Registration must be gone by then.

  // Trips the token (only the first call has an effect) and runs every registered callback
  // once, on the calling thread. Thread-safe; not async-signal-safe (call it from a thread).
  void RequestStop(const std::string& reason);

  bool stop_requested() const { return stopped_.load(std::memory_order_acquire); }
  // The first reason given; empty while not tripped.
  std::string reason() const;

  // Registers `callback`; when the token is already tripped it runs at once, on this thread.
  // A callback must not register or unregister callbacks of this token (it runs under its lock).
  [[nodiscard]] std::unique_ptr<Registration> OnStop(Callback callback);

 private:
  void Unregister(uint64_t id);

  mutable std::mutex mu_;
  std::atomic<bool> stopped_{false};
  std::string reason_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Callback> callbacks_;
};

}  // namespace mptrain
