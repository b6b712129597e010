#include "coordinator/store/store_writer.h"

#include "spdlog/spdlog.h"

namespace mptrain {

StoreWriter::StoreWriter(JobStore* store, size_t max_queued, size_t max_queued_bytes)
    : store_(store),
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
    if (!status.ok()) {
      spdlog::error("could not write the job store (a coordinator restart would lose the "
                    "last changes): {}",
                    status.ToString());
    }
    lock.lock();
    if (!status.ok()) ++failures_;
    queued_bytes_ -= bytes;
    ++written_;
    written_cv_.notify_all();
  }
}

}  // namespace mptrain
