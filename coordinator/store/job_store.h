#pragma once

// Where the coordinator keeps what must survive its own death: every job's record (spec,
// state, attempts, placement, failures, checkpoints, request id, rank secrets, the current
// attempt's key-value store), a trimmed history of its events (telemetry and state changes),
// the kept tails of its ranks' output (two attempts, as coordinator/rank_logs.h holds them),
// and the job id counter, so that ids never repeat.
//
// The interface is what a highly available coordinator would implement over an external store
// (etcd, PostgreSQL): Load once at start, then one Commit per mutation of the coordinator
// state, applied atomically. SqliteJobStore is the embedded default.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/store/stored_job.pb.h"
#include "proto/mptrain.pb.h"

namespace mptrain {

class JobStore {
 public:
  // One key of a job attempt's key-value store (write-once: a key is never rewritten, only
  // every key of the job dropped at once, when its attempt ends).
  struct KvEntry {
    int32_t attempt = 0;
    std::string key;
    std::string value;
  };
  struct Snapshot {
    int64_t next_job_number = 1;
    std::vector<store::StoredJob> jobs;                      // In submission order.
    std::map<int64_t, std::vector<v1::WatchJobEvent>> events;  // job number -> oldest first
    std::map<int64_t, v1::JobSpec> specs;                    // job number -> its spec
    std::map<int64_t, std::vector<store::StoredRankLog>> rank_logs;  // job number -> its tails
    std::map<int64_t, std::vector<KvEntry>> kv;  // job number -> its key-value entries
  };

  // One atomic change: jobs written (the spec only when the job is new), events appended,
  // event histories trimmed, rank output tails written, key-value stores cleared then keys
  // written, jobs deleted, the counter.
  struct Batch {
    std::vector<store::StoredJob> jobs;
    std::map<int64_t, v1::JobSpec> new_specs;
    std::vector<std::pair<int64_t, v1::WatchJobEvent>> events;
    std::map<int64_t, int64_t> keep_events_after;  // job number -> drop sequences <= this
    // (job number, tail), in order: each replaces the stored tail of its (attempt, rank), and
    // the job's tails of attempts before attempt - 1 are dropped.
    std::vector<std::pair<int64_t, store::StoredRankLog>> rank_logs;
    std::set<int64_t> kv_cleared;                        // job numbers: every key dropped
    std::vector<std::pair<int64_t, KvEntry>> kv_writes;  // (job number, entry), after those
    std::vector<int64_t> deleted;
    int64_t next_job_number = 0;  // 0: unchanged
    bool empty() const {
      return jobs.empty() && new_specs.empty() && events.empty() && keep_events_after.empty() &&
             rank_logs.empty() && kv_cleared.empty() && kv_writes.empty() && deleted.empty() &&
             next_job_number == 0;
    }
  };

  virtual ~JobStore() = default;
  virtual absl::StatusOr<Snapshot> Load() = 0;
  virtual absl::Status Commit(const Batch& batch) = 0;
  // Up to `limit` events of job `number` after `after_sequence`, oldest first: the history a
  // finished job no longer holds in memory (telemetry export). May run beside Commit.
  virtual absl::StatusOr<std::vector<v1::WatchJobEvent>> LoadEvents(int64_t number,
                                                                    int64_t after_sequence,
                                                                    int limit) = 0;
};

}  // namespace mptrain
