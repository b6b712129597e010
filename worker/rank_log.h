#pragma once

// A rank's output (its stdout and stderr, through one pipe): a thread copies every byte to the
// daemon's own stderr, as before, and keeps what the coordinator has not been sent yet, so that
// `trainctl logs` shows a rank's last lines without a shell on its worker.
//
// Bounded: at most kMaxUnsentBytes wait to be sent; older unsent bytes are dropped (the
// offsets say so: the next chunk starts past the gap).

#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace mptrain {

class RankLogTap {
 public:
  static constexpr size_t kMaxUnsentBytes = 256 << 10;

  // Takes ownership of `read_fd` (the pipe's read end) and starts copying.
  explicit RankLogTap(int read_fd);
  ~RankLogTap();  // Waits for the pipe to close (the rank and its children have exited).
  RankLogTap(const RankLogTap&) = delete;
  RankLogTap& operator=(const RankLogTap&) = delete;

  struct Chunk {
    int64_t offset = 0;  // Of data[0] in everything the rank wrote.
    std::string data;
  };
  // Up to `max_bytes` not yet taken (empty data: nothing new).
  Chunk Take(size_t max_bytes);
  // Whether the pipe is closed and every byte has been taken.
  bool Drained() const;
  // Waits (bounded) until the pipe has closed, so that a final Take gets the last lines.
  void WaitClosed(int timeout_ms);

 private:
  void Run();

  int fd_;
  mutable std::mutex mu_;
  std::string unsent_;
  int64_t unsent_offset_ = 0;  // Offset of unsent_[0].
  bool closed_ = false;
  std::thread thread_;
};

}  // namespace mptrain
