#include "coordinator/store/store_writer.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

// Records the order of commits; can be made slow or failing.
class RecordingStore : public JobStore {
 public:
  absl::StatusOr<Snapshot> Load() override { return Snapshot(); }
  absl::StatusOr<std::vector<v1::WatchJobEvent>> LoadEvents(int64_t, int64_t, int) override {
    return std::vector<v1::WatchJobEvent>();
  }
  absl::Status Commit(const Batch& batch) override {
    {
      // Held (Hold): the commit says it began, then waits for Release.
      std::unique_lock<std::mutex> lock(gate_mu);
      ++commits_begun;
      gate.notify_all();
      gate.wait(lock, [&] { return !held; });
    }
    std::this_thread::sleep_for(delay);
    std::lock_guard<std::mutex> lock(mu);
    committed.push_back(batch.next_job_number);
    if (fail) return absl::InternalError("disk full");
    if (fail_times > 0) {
      --fail_times;
      return absl::InternalError("disk full, for a moment");
    }
    return absl::OkStatus();
  }
  void Hold() {
    std::lock_guard<std::mutex> lock(gate_mu);
    held = true;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(gate_mu);
    held = false;
    gate.notify_all();
  }
  // Whether `count` commits have begun within 10 s.
  bool AwaitCommitsBegun(int count) {
    std::unique_lock<std::mutex> lock(gate_mu);
    return gate.wait_for(lock, std::chrono::seconds(10), [&] { return commits_begun >= count; });
  }
  std::chrono::milliseconds delay{0};
  std::atomic<bool> fail{false};
  std::atomic<int> fail_times{0};  // Fail this many commits, then succeed.
  std::mutex mu;
  std::vector<int64_t> committed;
  std::mutex gate_mu;
  std::condition_variable gate;
  bool held = false;
  int commits_begun = 0;
};

JobStore::Batch Numbered(int64_t n) {
  JobStore::Batch batch;
  batch.next_job_number = n;
  return batch;
}

TEST(StoreWriter, CommitsInOrder_AndWaitReturnsOnlyOnceWritten) {
  RecordingStore store;
  store.delay = std::chrono::milliseconds(20);
  StoreWriter writer(&store);
  uint64_t last = 0;
  for (int64_t n = 1; n <= 5; ++n) last = writer.Enqueue(Numbered(n));
  writer.WaitWritten(last);
  std::lock_guard<std::mutex> lock(store.mu);
  EXPECT_EQ(store.committed, (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

TEST(StoreWriter, WaitForAnEarlierTicket_DoesNotWaitForLaterOnes) {
  RecordingStore store;
  StoreWriter writer(&store);
  const uint64_t first = writer.Enqueue(Numbered(1));
  writer.WaitWritten(first);
  // The second write's commit begins and is held there until the end of the test: waiting for
  // the first ticket must return all the same (it would wait forever for the second).
  store.Hold();
  writer.Enqueue(Numbered(2));
  ASSERT_TRUE(store.AwaitCommitsBegun(2));
  auto waited = std::async(std::launch::async, [&] { writer.WaitWritten(first); });
  const bool returned = waited.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  store.Release();
  EXPECT_TRUE(returned) << "WaitWritten(first) waited for the second write's held commit";
}

// A failing commit is tried kCommitAttempts times; a lasting failure goes to the handler
// before the waiter is released (in production the handler ends the process, so no caller
// hears OK for it); a commit that fails once and then succeeds is no failure.
TEST(StoreWriter, LastingFailure_ReachesTheHandlerBeforeTheWaiter_ATransientOneIsRetried) {
  RecordingStore store;
  store.fail = true;
  std::atomic<int> handled{0};
  std::atomic<bool> released{false};
  bool released_before_handler = false;
  StoreWriter writer(&store, 10, StoreWriter::kDefaultMaxQueuedBytes,
                     [&](const absl::Status& status) {
                       released_before_handler = released.load();
                       EXPECT_NE(std::string(status.message()).find("disk full"),
                                 std::string::npos);
                       ++handled;
                     });
  writer.WaitWritten(writer.Enqueue(Numbered(1)));
  released = true;
  EXPECT_EQ(handled.load(), 1);
  EXPECT_FALSE(released_before_handler);
  EXPECT_EQ(writer.failures(), 1u);
  {
    std::lock_guard<std::mutex> lock(store.mu);
    EXPECT_EQ(store.committed.size(), static_cast<size_t>(StoreWriter::kCommitAttempts));
  }

  // Fails once, then the disk has room again.
  store.fail_times = 1;
  store.fail = false;
  writer.WaitWritten(writer.Enqueue(Numbered(2)));
  EXPECT_EQ(handled.load(), 1);
  EXPECT_EQ(writer.failures(), 1u);
}

// The default handler ends the process: the coordinator stops rather than answer for a change
// it could not store.
TEST(StoreWriterDeathTest, LastingFailure_EndsTheProcessByDefault) {
  EXPECT_EXIT(
      {
        RecordingStore store;
        store.fail = true;
        StoreWriter writer(&store);
        writer.WaitWritten(writer.Enqueue(Numbered(1)));
        std::fprintf(stderr, "released\n");
        std::exit(0);
      },
      // spdlog writes to stdout: the exit code says it (0 had the waiter been released).
      ::testing::ExitedWithCode(StoreWriter::kStoreFailureExitCode), "");
}

TEST(StoreWriter, Destructor_WritesWhatIsQueued) {
  RecordingStore store;
  store.delay = std::chrono::milliseconds(5);
  {
    StoreWriter writer(&store, /*max_queued=*/2);  // Enqueue blocks for room at times.
    for (int64_t n = 1; n <= 6; ++n) writer.Enqueue(Numbered(n));
  }
  std::lock_guard<std::mutex> lock(store.mu);
  EXPECT_EQ(store.committed.size(), 6u);
}

// The queue is bounded in bytes too: with 10 KB allowed and a 6 KB batch being written, the
// next 6 KB batch waits for it; a batch over the bound alone still goes through.
TEST(StoreWriter, QueuedBytes_AreBounded_ALargerBatchAloneStillGoes) {
  RecordingStore store;
  store.delay = std::chrono::milliseconds(400);
  StoreWriter writer(&store, /*max_queued=*/100, /*max_queued_bytes=*/10'000);
  auto sized = [](int64_t n, size_t bytes) {
    JobStore::Batch batch = Numbered(n);
    batch.kv_writes.push_back({n, {1, "key", std::string(bytes, 'v')}});
    return batch;
  };
  EXPECT_GE(StoreWriter::ApproximateBytes(sized(1, 6'000)), 6'000u);
  // Timed from before the first batch: the second can only go in once the first is committed,
  // which takes the store's 400 ms (a bound that holds however the threads are scheduled).
  const auto start = std::chrono::steady_clock::now();
  const uint64_t first = writer.Enqueue(sized(1, 6'000));
  writer.Enqueue(sized(2, 6'000));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(400)) << "a second 6 KB batch did not wait";
  writer.WaitWritten(first);
  store.delay = std::chrono::milliseconds(0);
  writer.WaitWritten(writer.Enqueue(sized(3, 50'000)));
  std::lock_guard<std::mutex> lock(store.mu);
  EXPECT_EQ(store.committed, (std::vector<int64_t>{1, 2, 3}));
}

}  // namespace
}  // namespace mptrain
