#include "coordinator/store/store_writer.h"

#include <chrono>
#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

#include "spdlog/spdlog.h"

namespace mptrain {

StoreWriter::StoreWriter(JobStore* store, size_t max_queued, size_t max_queued_bytes,
                         LastingFailure on_failure)
    : store_(store),
      on_failure_(on_failure != nullptr ? std::move(on_failure) : [](const absl::Status& status) {
        spdlog::critical("could not write the job store after {} attempts: {}; the coordinator "
                         "stops rather than answer for changes it could not store (restart it "
                         "once the store can be written: it resumes from what the store holds)",
                         kCommitAttempts, status.ToString());
        std::_Exit(kStoreFailureExitCode);
      }),
      max_queued_(max_queued == 0 ? 1 : max_queued),
      max_queued_bytes_(max_queued_bytes),
      thread_([this] { Run(); }) {}

size_t StoreWriter::ApproximateBytes(const JobStore::Batch& batch) {
  size_t bytes = 0;
  for (const store::StoredJob& job : batch.jobs) bytes += job.ByteSizeLong();
  for (const auto& [number, spec] : batch.new_specs) bytes += spec.ByteSizeLong();
  for (const auto& [number, event] : batch.events) bytes += event.ByteSizeLong();
  for (const auto& [number, log] : batch.rank_logs) bytes += log.ByteSizeLong();
  for (const auto& [number, entry] : batch.kv_writes) {
    bytes += entry.key.size() + entry.value.size();
  }
  return bytes;
}

StoreWriter::~StoreWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  queued_cv_.notify_all();
  thread_.join();
}

uint64_t StoreWriter::Enqueue(JobStore::Batch batch) {
  const size_t bytes = ApproximateBytes(batch);
  std::unique_lock<std::mutex> lock(mu_);
  written_cv_.wait(lock, [&] {
    return (queue_.empty() && queued_bytes_ == 0) ||
           (queue_.size() < max_queued_ && queued_bytes_ + bytes <= max_queued_bytes_);
  });
  queue_.emplace_back(std::move(batch), bytes);
  queued_bytes_ += bytes;
  const uint64_t ticket = next_ticket_++;
  lock.unlock();
  queued_cv_.notify_one();
  return ticket;
}

void StoreWriter::WaitWritten(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  written_cv_.wait(lock, [&] { return written_ >= ticket; });
}

uint64_t StoreWriter::LastTicket() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_ticket_ - 1;
}

bool StoreWriter::IsWritten(uint64_t ticket) const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_ >= ticket;
}

void StoreWriter::WhenWritten(uint64_t ticket, std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (written_ < ticket) {
      callbacks_.emplace(ticket, std::move(callback));
      return;
    }
  }
  callback();
}

uint64_t StoreWriter::failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_;
}

void StoreWriter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    queued_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // Stopping, and everything is written.
    JobStore::Batch batch = std::move(queue_.front().first);
    const size_t bytes = queue_.front().second;
    queue_.pop_front();
    lock.unlock();
    absl::Status status = store_->Commit(batch);
    for (int attempt = 2; !status.ok() && attempt <= kCommitAttempts; ++attempt) {
      spdlog::error("could not write the job store (attempt {} of {}): {}", attempt - 1,
                    kCommitAttempts, status.ToString());
      std::this_thread::sleep_for(std::chrono::milliseconds(200 * attempt));
      status = store_->Commit(batch);  // A failed commit was rolled back whole.
    }
    if (!status.ok()) on_failure_(status);  // Before anyone waiting for it hears back.
    lock.lock();
    if (!status.ok()) ++failures_;
    queued_bytes_ -= bytes;
    ++written_;
    written_cv_.notify_all();
    if (!callbacks_.empty() && callbacks_.begin()->first <= written_) {
      std::vector<std::function<void()>> due;
      while (!callbacks_.empty() && callbacks_.begin()->first <= written_) {
        due.push_back(std::move(callbacks_.begin()->second));
        callbacks_.erase(callbacks_.begin());
      }
      lock.unlock();
      for (std::function<void()>& callback : due) callback();
      lock.lock();
    }
  }
}

}  // namespace mptrain
