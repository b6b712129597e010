#pragma once

// The embedded job store: one SQLite database, `state.db` in the coordinator's --state_dir,
// in WAL mode. Every Commit is one transaction, so a coordinator killed at any point restarts
// from the last complete mutation. synchronous=NORMAL: a commit survives the coordinator
// process dying at any moment (the write-ahead log is in the kernel's hands); a power loss
// may lose the last few commits, never consistency.

#include <memory>
#include <mutex>
#include <string>

#include "coordinator/store/job_store.h"

struct sqlite3;

namespace mptrain {

class SqliteJobStore final : public JobStore {
 public:
  // Creates the directory (mode 0700) and the database if missing. FAILED_PRECONDITION names
  // the file when it is not a database of ours, corrupt, or locked by another coordinator.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(const std::string& directory);
  ~SqliteJobStore() override;

  absl::StatusOr<Snapshot> Load() override;
  absl::Status Commit(const Batch& batch) override;
  absl::StatusOr<std::vector<v1::WatchJobEvent>> LoadEvents(int64_t number,
                                                            int64_t after_sequence,
                                                            int limit) override;

 private:
  SqliteJobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const char* sql);
  absl::Status Error(const std::string& what) const;

  std::mutex mu_;  // One connection: the writer thread and readers take turns.
  sqlite3* db_;
  std::string path_;
  int lock_fd_ = -1;  // flock on state.lock: one coordinator per directory.
};

}  // namespace mptrain
