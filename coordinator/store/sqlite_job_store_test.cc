#include "coordinator/store/sqlite_job_store.h"

#include <fstream>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

std::string FreshDir(const std::string& name) {
  const char* tmp = getenv("TEST_TMPDIR");
  std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name;
  std::string command = "rm -rf " + dir;
  EXPECT_EQ(system(command.c_str()), 0);
  return dir;
}

JobStore::Batch NewJob(int64_t number, const std::string& name) {
  JobStore::Batch batch;
  store::StoredJob job;
  job.set_number(number);
  job.set_attempt(1);
  job.mutable_job()->set_job_id("job-" + std::to_string(number));
  job.mutable_job()->set_state(v1::RUNNING);
  (*job.mutable_rank_secrets())[1].add_secret("s0");
  batch.jobs.push_back(job);
  batch.kv_writes.push_back({number, {1, "nccl_unique_id", std::string("\0\1\2", 3)}});
  v1::JobSpec spec;
  spec.set_name(name);
  batch.new_specs[number] = spec;
  batch.next_job_number = number + 1;
  return batch;
}

TEST(SqliteJobStore, CommitThenReopen_LoadsEverything) {
  const std::string dir = FreshDir("roundtrip");
  {
    auto store = SqliteJobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Commit(NewJob(1, "first")).ok());
    ASSERT_TRUE((*store)->Commit(NewJob(2, "second")).ok());
    JobStore::Batch events;
    for (int sequence = 1; sequence <= 5; ++sequence) {
      v1::WatchJobEvent event;
      event.set_sequence(sequence);
      event.mutable_telemetry()->set_step(sequence);
      events.events.push_back({1, event});
    }
    store::StoredJob updated = NewJob(1, "").jobs[0];
    updated.mutable_job()->set_state(v1::SUCCEEDED);
    events.jobs.push_back(updated);
    ASSERT_TRUE((*store)->Commit(events).ok());
    JobStore::Batch trim;
    trim.keep_events_after[1] = 3;
    trim.deleted.push_back(2);
    ASSERT_TRUE((*store)->Commit(trim).ok());
  }
  auto store = SqliteJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto snapshot = (*store)->Load();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->next_job_number, 3);
  ASSERT_EQ(snapshot->jobs.size(), 1u);
  EXPECT_EQ(snapshot->jobs[0].job().state(), v1::SUCCEEDED);
  ASSERT_EQ(snapshot->kv[1].size(), 1u);
  EXPECT_EQ(snapshot->kv[1][0].attempt, 1);
  EXPECT_EQ(snapshot->kv[1][0].key, "nccl_unique_id");
  EXPECT_EQ(snapshot->kv[1][0].value, std::string("\0\1\2", 3));
  EXPECT_EQ(snapshot->kv.count(2), 0u) << "a deleted job's keys were kept";
  EXPECT_EQ(snapshot->jobs[0].rank_secrets().at(1).secret(0), "s0");
  EXPECT_EQ(snapshot->specs.at(1).name(), "first");
  ASSERT_EQ(snapshot->events[1].size(), 2u);
  EXPECT_EQ(snapshot->events[1][0].telemetry().step(), 4);
}

TEST(SqliteJobStore, KeyValue_WrittenAKeyAtATime_ClearedBeforeTheBatchsWrites) {
  const std::string dir = FreshDir("kv");
  auto store = SqliteJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Commit(NewJob(1, "a")).ok());
  JobStore::Batch more;
  more.kv_writes.push_back({1, {1, "rank_1", "addr1"}});
  more.kv_writes.push_back({1, {1, "empty", ""}});
  ASSERT_TRUE((*store)->Commit(more).ok());
  auto keys = [&] {
    auto snapshot = (*store)->Load();
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    std::vector<std::string> found;
    for (const JobStore::KvEntry& entry : snapshot->kv[1]) {
      found.push_back(entry.key + "@" + std::to_string(entry.attempt) + "=" + entry.value);
    }
    return found;
  };
  EXPECT_EQ(keys(), (std::vector<std::string>{
                        "empty@1=", "nccl_unique_id@1=" + std::string("\0\1\2", 3),
                        "rank_1@1=addr1"}));
  // A new attempt: every key of the job goes, then the new attempt's first key is written.
  JobStore::Batch next;
  next.kv_cleared.insert(1);
  next.kv_writes.push_back({1, {2, "nccl_unique_id", "id2"}});
  ASSERT_TRUE((*store)->Commit(next).ok());
  EXPECT_EQ(keys(), std::vector<std::string>{"nccl_unique_id@2=id2"});
}

TEST(SqliteJobStore, LoadEvents_PagesOneJobsHistoryInOrder) {
  auto store = SqliteJobStore::Open(FreshDir("events"));
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Commit(NewJob(1, "a")).ok());
  ASSERT_TRUE((*store)->Commit(NewJob(2, "b")).ok());
  JobStore::Batch events;
  for (int sequence = 1; sequence <= 7; ++sequence) {
    v1::WatchJobEvent event;
    event.set_sequence(sequence);
    event.mutable_telemetry()->set_step(sequence);
    events.events.push_back({1, event});
    events.events.push_back({2, event});
  }
  ASSERT_TRUE((*store)->Commit(events).ok());
  auto page = (*store)->LoadEvents(1, 2, 3);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->size(), 3u);
  EXPECT_EQ((*page)[0].sequence(), 3);
  EXPECT_EQ((*page)[2].sequence(), 5);
  EXPECT_EQ((*store)->LoadEvents(1, 5, 100)->size(), 2u);
  EXPECT_TRUE((*store)->LoadEvents(3, 0, 100)->empty());
}

store::StoredRankLog RankLog(int attempt, int rank, const std::string& data) {
  store::StoredRankLog log;
  log.set_attempt(attempt);
  log.set_rank(rank);
  log.set_start_offset(7);
  log.set_data(data);
  log.set_complete(true);
  return log;
}

TEST(SqliteJobStore, RankLogs_ReplacedPerAttemptAndRank_TwoAttemptsKept_DeletedWithTheJob) {
  const std::string dir = FreshDir("rank_logs");
  {
    auto store = SqliteJobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Commit(NewJob(1, "a")).ok());
    ASSERT_TRUE((*store)->Commit(NewJob(2, "b")).ok());
    JobStore::Batch logs;
    logs.rank_logs.push_back({1, RankLog(1, 0, "old")});
    logs.rank_logs.push_back({1, RankLog(1, 0, "attempt 1 rank 0\n")});  // Replaces it.
    logs.rank_logs.push_back({1, RankLog(1, 1, "attempt 1 rank 1\n")});
    logs.rank_logs.push_back({2, RankLog(1, 0, "job 2\n")});
    ASSERT_TRUE((*store)->Commit(logs).ok());
    JobStore::Batch later;
    later.rank_logs.push_back({1, RankLog(2, 0, "attempt 2\n")});  // Attempt 1 stays.
    ASSERT_TRUE((*store)->Commit(later).ok());
    auto snapshot = (*store)->Load();
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    EXPECT_EQ(snapshot->rank_logs[1].size(), 3u);
    JobStore::Batch third;
    third.rank_logs.push_back({1, RankLog(3, 1, "attempt 3\n")});  // Attempt 1 goes.
    third.deleted.push_back(2);
    ASSERT_TRUE((*store)->Commit(third).ok());
  }
  auto store = SqliteJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto snapshot = (*store)->Load();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->rank_logs.count(2), 0u) << "a deleted job's logs go with it";
  const std::vector<store::StoredRankLog>& kept = snapshot->rank_logs[1];
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].attempt(), 2);
  EXPECT_EQ(kept[0].data(), "attempt 2\n");
  EXPECT_EQ(kept[1].attempt(), 3);
  EXPECT_EQ(kept[1].rank(), 1);
  EXPECT_EQ(kept[1].start_offset(), 7);
  EXPECT_TRUE(kept[1].complete());
}

TEST(SqliteJobStore, SecondOpenOfTheSameDirectory_IsRefusedAsLocked) {
  const std::string dir = FreshDir("locked");
  auto first = SqliteJobStore::Open(dir);
  ASSERT_TRUE(first.ok());
  auto second = SqliteJobStore::Open(dir);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("locked"), std::string::npos) << second.status();
}

TEST(SqliteJobStore, CorruptDatabase_IsAClearErrorNamingTheFile) {
  const std::string dir = FreshDir("corrupt");
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/state.db") << std::string(8192, 'x');
  auto store = SqliteJobStore::Open(dir);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("state.db"), std::string::npos) << store.status();
}

TEST(SqliteJobStore, StateDirIsAFile_IsAClearError) {
  const std::string dir = FreshDir("afile");
  std::ofstream(dir) << "x";
  auto store = SqliteJobStore::Open(dir);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("--state_dir"), std::string::npos) << store.status();
}

}  // namespace
}  // namespace mptrain
