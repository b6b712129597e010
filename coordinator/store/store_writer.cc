#include "coordinator/store/store_writer.h"

#include "spdlog/spdlog.h"

namespace mptrain {

StoreWriter::StoreWriter(JobStore* store, size_t max_queued)
    : store_(store), max_queued_(max_queued == 0 ? 1 : max_queued), thread_([this] { Run(); }) {}

StoreWriter::~StoreWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  queued_cv_.notify_all();
  thread_.join();
}

uint64_t StoreWriter::Enqueue(JobStore::Batch batch) {
  std::unique_lock<std::mutex> lock(mu_);
  written_cv_.wait(lock, [this] { return queue_.size() < max_queued_; });
  queue_.push_back(std::move(batch));
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
    JobStore::Batch batch = std::move(queue_.front());
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
    ++written_;
    written_cv_.notify_all();
  }
}

}  // namespace mptrain
