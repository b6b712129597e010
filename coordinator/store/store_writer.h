#pragma once

// Commits the coordinator's mutations to a JobStore on a thread of its own, in the order they
// were made, so that no write happens while the state's lock is held: a heartbeat never waits
// behind a submit's transaction. A mutation hands its batch over under the lock (Enqueue), and
// the call that made it answers its client only once the batch is written (WaitWritten):
// whatever a client was told survives a crash of the coordinator.
//
// Bounded: with `max_queued` batches, or `max_queued_bytes` of them, waiting, Enqueue blocks
// until the writer catches up (back pressure on every mutation, rather than memory without
// end). The bytes of the batch being written count until it is written; a
// batch larger than the bound on its own waits until nothing else is queued or written.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "coordinator/store/job_store.h"

namespace mptrain {

class StoreWriter {
 public:
  static constexpr size_t kDefaultMaxQueuedBytes = size_t{256} << 20;
  // A commit is tried this many times (a moment apart) before its failure is lasting.
  static constexpr int kCommitAttempts = 3;
  // Called on the writer's thread when a batch could not be committed, before any caller
  // waiting for it is released. Null: the default, which logs and ends the process (exit code
  // kStoreFailureExitCode) — the coordinator stops rather than tell a client OK for a change a
  // restart would not find; its supervisor restarts it on what the store holds.
  using LastingFailure = std::function<void(const absl::Status&)>;
  static constexpr int kStoreFailureExitCode = 75;  // EX_TEMPFAIL
  explicit StoreWriter(JobStore* store, size_t max_queued = 10'000,
                       size_t max_queued_bytes = kDefaultMaxQueuedBytes,
                       LastingFailure on_failure = nullptr);
  // Writes what is queued, then stops.
  ~StoreWriter();
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  // Queues `batch` after every earlier one; returns its ticket for WaitWritten.
  uint64_t Enqueue(JobStore::Batch batch);
  // Returns once the batch of `ticket` (and every one before it) has been committed, or its
  // commit failed and the failure handler returned (tests only: the default ends the process).
  void WaitWritten(uint64_t ticket);
  // The ticket of the last batch enqueued (0: none): what an answer that reads the state must
  // wait for, so that it never shows a change that is not yet written.
  uint64_t LastTicket() const;
  // Whether the batch of `ticket` (and every one before it) is written.
  bool IsWritten(uint64_t ticket) const;
  // Runs `callback` once the batch of `ticket` is written: at once on this thread when it is,
  // else on the writer's thread right after (keep it short: it delays the next commit; and it
  // must not take a lock a caller of Enqueue may hold — Enqueue waits for this thread).
  void WhenWritten(uint64_t ticket, std::function<void()> callback);

  // Commits that failed so far.
  uint64_t failures() const;

  // What a batch holds, about (the size of its messages and key-value entries).
  static size_t ApproximateBytes(const JobStore::Batch& batch);

 private:
  void Run();

  JobStore* store_;
  const LastingFailure on_failure_;
  const size_t max_queued_;
  const size_t max_queued_bytes_;
  mutable std::mutex mu_;
  std::condition_variable queued_cv_;   // The writer waits for work.
  std::condition_variable written_cv_;  // Callers wait for their ticket; Enqueue for room.
  std::deque<std::pair<JobStore::Batch, size_t>> queue_;  // With its ApproximateBytes.
  size_t queued_bytes_ = 0;  // Of the queue and of the batch being written.
  uint64_t next_ticket_ = 1;  // The ticket of the next batch enqueued.
  uint64_t written_ = 0;      // Every ticket up to this one is written.
  std::multimap<uint64_t, std::function<void()>> callbacks_;  // WhenWritten, by ticket.
  uint64_t failures_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace mptrain
