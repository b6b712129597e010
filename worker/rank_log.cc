#include "worker/rank_log.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace mptrain {

RankLogTap::RankLogTap(int read_fd) : fd_(read_fd), thread_([this] { Run(); }) {}

RankLogTap::~RankLogTap() {
  thread_.join();
  close(fd_);
}

void RankLogTap::Run() {
  char buffer[16 << 10];
  while (true) {
    const ssize_t got = read(fd_, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    // The daemon's log keeps every rank line, as when ranks wrote there directly.
    for (ssize_t written = 0; written < got;) {
      const ssize_t n = write(STDERR_FILENO, buffer + written, got - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      written += n;
    }
    std::lock_guard<std::mutex> lock(mu_);
    unsent_.append(buffer, static_cast<size_t>(got));
    if (unsent_.size() > kMaxUnsentBytes) {
      const size_t drop = unsent_.size() - kMaxUnsentBytes;
      unsent_.erase(0, drop);
      unsent_offset_ += static_cast<int64_t>(drop);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

RankLogTap::Chunk RankLogTap::Take(size_t max_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Chunk chunk;
  chunk.offset = unsent_offset_;
  const size_t n = std::min(max_bytes, unsent_.size());
  chunk.data = unsent_.substr(0, n);
  unsent_.erase(0, n);
  unsent_offset_ += static_cast<int64_t>(n);
  return chunk;
}

bool RankLogTap::Drained() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_ && unsent_.empty();
}

void RankLogTap::WaitClosed(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace mptrain
