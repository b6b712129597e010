#include "coordinator/store/sqlite_job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace mptrain {
namespace {

constexpr int kSchemaVersion = 1;

// A prepared statement that finalizes itself.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) {
    if (sqlite3_prepare_v2(db, sql, -1, &statement_, nullptr) != SQLITE_OK) statement_ = nullptr;
  }
  ~Statement() { sqlite3_finalize(statement_); }
  sqlite3_stmt* get() const { return statement_; }
  bool ok() const { return statement_ != nullptr; }

 private:
  sqlite3_stmt* statement_ = nullptr;
};

std::string Blob(sqlite3_stmt* statement, int column) {
  const void* data = sqlite3_column_blob(statement, column);
  const int bytes = sqlite3_column_bytes(statement, column);
  return data == nullptr ? std::string() : std::string(static_cast<const char*>(data), bytes);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(
    const std::string& directory) {
  if (mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir ", directory, ": cannot create it: ", strerror(errno)));
  }
  struct stat info {};
  if (stat(directory.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir ", directory, ": not a directory"));
  }
  // SQLite's own locks do not stop a second coordinator from opening the database and
  // interleaving commits: an exclusive lock on a side file does.
  const std::string lock_path = directory + "/state.lock";
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (lock_fd >= 0) close(lock_fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "--state_dir ", directory, " is locked",
        error == EWOULDBLOCK ? " by another running coordinator" : "", ": ", strerror(error)));
  }
  const std::string path = directory + "/state.db";
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    close(lock_fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", message));
  }
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(db, path));
  store->lock_fd_ = lock_fd;
  sqlite3_busy_timeout(db, 2000);
  // Checks the file is a sound database before trusting anything in it.
  {
    Statement check(db, "PRAGMA quick_check");
    if (!check.ok() || sqlite3_step(check.get()) != SQLITE_ROW ||
        std::string(reinterpret_cast<const char*>(sqlite3_column_text(check.get(), 0))) != "ok") {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is not a sound SQLite database (", sqlite3_errmsg(db),
                       "); move it away to start afresh, or restore a copy"));
    }
  }
  for (const char* sql : {
           "PRAGMA journal_mode=WAL",
           "PRAGMA synchronous=NORMAL",
           "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
           "CREATE TABLE IF NOT EXISTS jobs (number INTEGER PRIMARY KEY, spec BLOB NOT NULL, "
           "record BLOB NOT NULL)",
           "CREATE TABLE IF NOT EXISTS events (number INTEGER NOT NULL, sequence INTEGER NOT "
           "NULL, event BLOB NOT NULL, PRIMARY KEY (number, sequence))",
           // Added to schema 1 without a version change: an older database gains it empty.
           "CREATE TABLE IF NOT EXISTS rank_logs (number INTEGER NOT NULL, attempt INTEGER NOT "
           "NULL, rank INTEGER NOT NULL, log BLOB NOT NULL, PRIMARY KEY (number, attempt, rank))",
           // Likewise: a job attempt's key-value store, a row per key (a store of an older
           // build keeps it inside the job's record; restore moves it here).
           "CREATE TABLE IF NOT EXISTS kv (number INTEGER NOT NULL, attempt INTEGER NOT NULL, "
           "key BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY (number, key))",
       }) {
    if (absl::Status status = store->Exec(sql); !status.ok()) return status;
  }
  {
    Statement version(db, "SELECT value FROM meta WHERE key = 'schema'");
    if (!version.ok()) return store->Error("reading the schema version");
    if (sqlite3_step(version.get()) == SQLITE_ROW) {
      if (sqlite3_column_int64(version.get(), 0) != kSchemaVersion) {
        return absl::FailedPreconditionError(
            absl::StrCat(path, " has schema version ", sqlite3_column_int64(version.get(), 0),
                         "; this coordinator reads version ", kSchemaVersion));
      }
    } else if (absl::Status status = store->Exec(
                   absl::StrCat("INSERT INTO meta VALUES ('schema', ", kSchemaVersion, ")")
                       .c_str());
               !status.ok()) {
      return status;
    }
  }
  return store;
}

SqliteJobStore::~SqliteJobStore() {
  sqlite3_close(db_);
  if (lock_fd_ >= 0) close(lock_fd_);
}

absl::Status SqliteJobStore::Error(const std::string& what) const {
  return absl::InternalError(absl::StrCat(path_, ": ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status SqliteJobStore::Exec(const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    std::string text = message ? message : "unknown error";
    sqlite3_free(message);
    return absl::FailedPreconditionError(absl::StrCat(path_, ": ", text));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::WatchJobEvent>> SqliteJobStore::LoadEvents(
    int64_t number, int64_t after_sequence, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement select(db_,
                   "SELECT event FROM events WHERE number = ? AND sequence > ? "
                   "ORDER BY sequence LIMIT ?");
  if (!select.ok()) return Error("reading events");
  sqlite3_bind_int64(select.get(), 1, number);
  sqlite3_bind_int64(select.get(), 2, after_sequence);
  sqlite3_bind_int(select.get(), 3, limit);
  std::vector<v1::WatchJobEvent> events;
  int step;
  while ((step = sqlite3_step(select.get())) == SQLITE_ROW) {
    v1::WatchJobEvent event;
    if (!event.ParseFromString(Blob(select.get(), 0))) {
      return absl::FailedPreconditionError(absl::StrCat(path_, ": an event is corrupt"));
    }
    events.push_back(std::move(event));
  }
  if (step != SQLITE_DONE) return Error("reading events");
  return events;
}

absl::StatusOr<JobStore::Snapshot> SqliteJobStore::Load() {
  std::lock_guard<std::mutex> lock(mu_);
  Snapshot snapshot;
  {
    Statement counter(db_, "SELECT value FROM meta WHERE key = 'next_job_number'");
    if (!counter.ok()) return Error("reading the job counter");
    if (sqlite3_step(counter.get()) == SQLITE_ROW) {
      snapshot.next_job_number = sqlite3_column_int64(counter.get(), 0);
    }
  }
  {
    Statement jobs(db_, "SELECT number, spec, record FROM jobs ORDER BY number");
    if (!jobs.ok()) return Error("reading jobs");
    int step;
    while ((step = sqlite3_step(jobs.get())) == SQLITE_ROW) {
      const int64_t number = sqlite3_column_int64(jobs.get(), 0);
      store::StoredJob job;
      v1::JobSpec spec;
      if (!spec.ParseFromString(Blob(jobs.get(), 1)) ||
          !job.ParseFromString(Blob(jobs.get(), 2)) || job.number() != number) {
        return absl::FailedPreconditionError(
            absl::StrCat(path_, ": the record of job number ", number, " is corrupt"));
      }
      snapshot.specs[number] = std::move(spec);
      snapshot.jobs.push_back(std::move(job));
    }
    if (step != SQLITE_DONE) return Error("reading jobs");
  }
  {
    Statement events(db_, "SELECT number, event FROM events ORDER BY number, sequence");
    if (!events.ok()) return Error("reading events");
    int step;
    while ((step = sqlite3_step(events.get())) == SQLITE_ROW) {
      v1::WatchJobEvent event;
      if (!event.ParseFromString(Blob(events.get(), 1))) {
        return absl::FailedPreconditionError(absl::StrCat(path_, ": an event is corrupt"));
      }
      snapshot.events[sqlite3_column_int64(events.get(), 0)].push_back(std::move(event));
    }
    if (step != SQLITE_DONE) return Error("reading events");
  }
  {
    Statement logs(db_, "SELECT number, log FROM rank_logs ORDER BY number, attempt, rank");
    if (!logs.ok()) return Error("reading rank logs");
    int step;
    while ((step = sqlite3_step(logs.get())) == SQLITE_ROW) {
      store::StoredRankLog log;
      if (!log.ParseFromString(Blob(logs.get(), 1))) {
        return absl::FailedPreconditionError(absl::StrCat(path_, ": a rank log is corrupt"));
      }
      snapshot.rank_logs[sqlite3_column_int64(logs.get(), 0)].push_back(std::move(log));
    }
    if (step != SQLITE_DONE) return Error("reading rank logs");
  }
  {
    Statement kv(db_, "SELECT number, attempt, key, value FROM kv ORDER BY number, key");
    if (!kv.ok()) return Error("reading key-value stores");
    int step;
    while ((step = sqlite3_step(kv.get())) == SQLITE_ROW) {
      KvEntry entry;
      entry.attempt = sqlite3_column_int(kv.get(), 1);
      entry.key = Blob(kv.get(), 2);
      entry.value = Blob(kv.get(), 3);
      snapshot.kv[sqlite3_column_int64(kv.get(), 0)].push_back(std::move(entry));
    }
    if (step != SQLITE_DONE) return Error("reading key-value stores");
  }
  return snapshot;
}

absl::Status SqliteJobStore::Commit(const Batch& batch) {
  if (batch.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status status = Exec("BEGIN IMMEDIATE"); !status.ok()) return status;
  auto fail = [this](const std::string& what) {
    absl::Status status = Error(what);
    Exec("ROLLBACK").IgnoreError();
    return status;
  };
  std::string bytes;
  for (const auto& [number, spec] : batch.new_specs) {
    Statement insert(db_, "INSERT OR REPLACE INTO jobs (number, spec, record) VALUES (?, ?, x'')");
    spec.SerializeToString(&bytes);
    if (!insert.ok()) return fail("preparing a job insert");
    sqlite3_bind_int64(insert.get(), 1, number);
    sqlite3_bind_blob(insert.get(), 2, bytes.data(), static_cast<int>(bytes.size()),
                      SQLITE_TRANSIENT);
    if (sqlite3_step(insert.get()) != SQLITE_DONE) return fail("inserting a job");
  }
  {
    Statement update(db_, "UPDATE jobs SET record = ? WHERE number = ?");
    if (!update.ok()) return fail("preparing a job update");
    for (const store::StoredJob& job : batch.jobs) {
      job.SerializeToString(&bytes);
      sqlite3_reset(update.get());
      sqlite3_bind_blob(update.get(), 1, bytes.data(), static_cast<int>(bytes.size()),
                        SQLITE_TRANSIENT);
      sqlite3_bind_int64(update.get(), 2, job.number());
      if (sqlite3_step(update.get()) != SQLITE_DONE) return fail("updating a job");
    }
  }
  {
    Statement insert(db_, "INSERT OR REPLACE INTO events (number, sequence, event) VALUES (?, ?, ?)");
    if (!insert.ok()) return fail("preparing an event insert");
    for (const auto& [number, event] : batch.events) {
      event.SerializeToString(&bytes);
      sqlite3_reset(insert.get());
      sqlite3_bind_int64(insert.get(), 1, number);
      sqlite3_bind_int64(insert.get(), 2, event.sequence());
      sqlite3_bind_blob(insert.get(), 3, bytes.data(), static_cast<int>(bytes.size()),
                        SQLITE_TRANSIENT);
      if (sqlite3_step(insert.get()) != SQLITE_DONE) return fail("appending an event");
    }
  }
  {
    Statement trim(db_, "DELETE FROM events WHERE number = ? AND sequence <= ?");
    if (!trim.ok()) return fail("preparing an event trim");
    for (const auto& [number, sequence] : batch.keep_events_after) {
      sqlite3_reset(trim.get());
      sqlite3_bind_int64(trim.get(), 1, number);
      sqlite3_bind_int64(trim.get(), 2, sequence);
      if (sqlite3_step(trim.get()) != SQLITE_DONE) return fail("trimming events");
    }
  }
  {
    Statement insert(db_,
                     "INSERT OR REPLACE INTO rank_logs (number, attempt, rank, log) "
                     "VALUES (?, ?, ?, ?)");
    Statement prune(db_, "DELETE FROM rank_logs WHERE number = ? AND attempt < ?");
    if (!insert.ok() || !prune.ok()) return fail("preparing a rank log write");
    for (const auto& [number, log] : batch.rank_logs) {
      log.SerializeToString(&bytes);
      sqlite3_reset(insert.get());
      sqlite3_bind_int64(insert.get(), 1, number);
      sqlite3_bind_int(insert.get(), 2, log.attempt());
      sqlite3_bind_int(insert.get(), 3, log.rank());
      sqlite3_bind_blob(insert.get(), 4, bytes.data(), static_cast<int>(bytes.size()),
                        SQLITE_TRANSIENT);
      if (sqlite3_step(insert.get()) != SQLITE_DONE) return fail("writing a rank log");
      // Two attempts, as in memory.
      sqlite3_reset(prune.get());
      sqlite3_bind_int64(prune.get(), 1, number);
      sqlite3_bind_int(prune.get(), 2, log.attempt() - 1);
      if (sqlite3_step(prune.get()) != SQLITE_DONE) return fail("pruning rank logs");
    }
  }
  {
    Statement clear(db_, "DELETE FROM kv WHERE number = ?");
    Statement insert(db_, "INSERT OR REPLACE INTO kv (number, attempt, key, value) VALUES (?, ?, ?, ?)");
    if (!clear.ok() || !insert.ok()) return fail("preparing a key-value write");
    for (int64_t number : batch.kv_cleared) {
      sqlite3_reset(clear.get());
      sqlite3_bind_int64(clear.get(), 1, number);
      if (sqlite3_step(clear.get()) != SQLITE_DONE) return fail("clearing a key-value store");
    }
    for (const auto& [number, entry] : batch.kv_writes) {
      sqlite3_reset(insert.get());
      sqlite3_bind_int64(insert.get(), 1, number);
      sqlite3_bind_int(insert.get(), 2, entry.attempt);
      sqlite3_bind_blob(insert.get(), 3, entry.key.data(), static_cast<int>(entry.key.size()),
                        SQLITE_STATIC);
      sqlite3_bind_blob(insert.get(), 4, entry.value.data(),
                        static_cast<int>(entry.value.size()), SQLITE_STATIC);
      if (sqlite3_step(insert.get()) != SQLITE_DONE) return fail("writing a key-value entry");
    }
  }
  for (int64_t number : batch.deleted) {
    for (const char* sql : {"DELETE FROM jobs WHERE number = ?", "DELETE FROM events WHERE number = ?",
                            "DELETE FROM rank_logs WHERE number = ?", "DELETE FROM kv WHERE number = ?"}) {
      Statement remove(db_, sql);
      if (!remove.ok()) return fail("preparing a delete");
      sqlite3_bind_int64(remove.get(), 1, number);
      if (sqlite3_step(remove.get()) != SQLITE_DONE) return fail("deleting a job");
    }
  }
  if (batch.next_job_number > 0) {
    Statement counter(db_, "INSERT OR REPLACE INTO meta (key, value) VALUES ('next_job_number', ?)");
    if (!counter.ok()) return fail("preparing the counter");
    sqlite3_bind_int64(counter.get(), 1, batch.next_job_number);
    if (sqlite3_step(counter.get()) != SQLITE_DONE) return fail("writing the counter");
  }
  return Exec("COMMIT");
}

}  // namespace mptrain
