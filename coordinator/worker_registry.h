#pragma once

// The coordinator's worker daemons: who they are (name, incarnation, secret), whether they are
// alive, and which of their slots hold which rank. It decides nothing about jobs: when a worker
// is lost it returns the ranks it held, and the caller fails their jobs.
//
// A slot is busy from placement until its rank process is known to be gone: the worker reported
// its exit, or no longer lists it as running. After its job ends (or restarts) a slot whose rank
// is still stopping is draining: not desired, not free. Whether a slot's rank is still wanted is
// the caller's knowledge, passed in as `is_current`.
//
// Not thread-safe: CoordinatorState's lock guards it. No clocks: times are passed in.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "coordinator/placement.h"
#include "proto/mptrain.pb.h"

namespace mptrain {

// Data and output roots a worker may declare, each.
inline constexpr int kMaxRootsPerKind = 32;
// Slots (and device descriptions) one worker may declare: no more than a job's ranks, and each
// scheduling pass walks every free slot.
inline constexpr int kMaxWorkerSlots = kMaxWorldSize;
// Live workers at once unless --max_live_workers says otherwise; a registration past it is
// RESOURCE_EXHAUSTED with a retry delay.
inline constexpr int kDefaultMaxLiveWorkers = 65'536;
// The payload key of a refusal's retry delay (milliseconds, decimal): the gRPC layer sends it
// as the trailing metadata kRetryAfterMetadataKey (common/grpc_status.h), which the worker
// daemon honours.
inline constexpr char kRetryAfterPayloadUrl[] = "type.mptrain/retry_after_ms";
// Names of refused workers remembered for a pending job's reason, and for how long.
inline constexpr size_t kMaxRefusedNamesTracked = 4'096;
inline constexpr int64_t kRefusedNameRetentionMs = 120'000;

// A heartbeat's usage (HeartbeatRequest.usage and usage_age_ms) against the bounds of
// proto/mptrain.proto's WorkerUsage and the devices `worker` registered: at most
// kMaxUsageDevices readings, each of a registered device and at most once; every figure >= 0;
// a utilization in [0, 100]; used <= total where both are known; an unavailable reading with
// no figures; the age in [0, kMaxUsageAgeMs]. INVALID_ARGUMENT naming the field and the bound
// ("usage.devices[2].utilization_percent must be in [0, 100], got 101"). Pure; O(readings x
// registered devices).
absl::Status ValidateWorkerUsage(const v1::WorkerUsage& usage, int64_t age_ms,
                                 const v1::Worker& worker);

// What one slot runs: a rank of one attempt of a job.
struct BusySlot {
  std::string job_id;
  int rank = 0;
  int attempt = 0;
  int64_t memory_bytes = 0;  // The job's estimate of one rank (its machine's share).
};

// "job/rank/attempt": how polls and exits name a rank process.
std::string AssignmentKey(const std::string& job_id, int rank, int attempt);

struct WorkerRecord {
  v1::Worker info;  // Its state and last heartbeat change only through WorkerRegistry.
  std::string name;
  std::string secret;
  std::string registration_nonce;
  int64_t lost_at_ms = 0;
  // The store ticket of the last change to what this worker should run: a poll hands that
  // change out only once it is written (0: nothing pending).
  uint64_t assignments_ticket = 0;
  // Stops handed to this incarnation (assignment key -> when), for ranks it still reports
  // running: a poll repeats a stop only after kStopResendMs, so a worker whose rank takes a
  // while to die waits in its poll instead of being answered the same stop at once, thousands
  // of times a second. Bounded by what its poll lists.
  std::map<std::string, int64_t> stops_sent;

  bool alive() const { return info.state() == v1::ALIVE; }
  // After a coordinator restart, nothing is placed on a worker until its first poll has
  // reported (and re-adopted) the ranks it still runs: its slots only look free.
  bool awaiting_first_poll() const { return awaiting_first_poll_; }
  const std::map<int, BusySlot>& busy_slots() const { return busy_slots_; }  // slot -> its rank
  int free_slots() const { return info.slots() - static_cast<int>(busy_slots_.size()); }
  // Memory one rank may use on `slot` (0: the worker did not say).
  int64_t SlotMemory(int slot) const;
  // The machine whose memory it shares with its co-located workers: the id it sent, or, when
  // it sent none, one of its own.
  std::string machine() const;

 private:
  // Private so that every change goes through WorkerRegistry, which keeps its indexes (free
  // slots, machines, jobs) in step with them.
  friend class WorkerRegistry;
  bool awaiting_first_poll_ = false;
  std::map<int, BusySlot> busy_slots_;
};

// The memory of one machine as its live CPU workers share it.
struct MachineUse {
  // The largest memory_bytes one of its workers advertises (each sees the whole machine, or
  // its cgroup's part of it); 0: none says (no bound).
  int64_t capacity_bytes = 0;
  int64_t used_bytes = 0;  // The estimates of the ranks its workers' busy slots hold.
  std::vector<std::string> worker_ids;
  int64_t free_bytes() const { return capacity_bytes - used_bytes; }
};

class WorkerRegistry {
 public:
  struct Options {
    int64_t heartbeat_timeout_ms = 10'000;
    // Lost workers stay listed (ListWorkers) for this long, and never more than this many.
    int64_t lost_worker_retention_ms = 3'600'000;
    size_t max_lost_workers = 1'000;
    int max_live_workers = kDefaultMaxLiveWorkers;
  };
  explicit WorkerRegistry(Options options) : options_(options) {}

  // The name in a worker id ("gpu0#12" -> "gpu0"): ids are the name and a registration number.
  // What a placement still says after a restart, before its worker has registered again.
  static std::string NameOfId(const std::string& worker_id);

  // INVALID_ARGUMENT: no slots or no device kind, a malformed name or root.
  // ALREADY_EXISTS: a live worker holds the name. RESOURCE_EXHAUSTED: max_live_workers are
  // live; the status carries a retry delay (RetryAfterMs). Every refusal is counted
  // (RefusedTotals) and logged (at most once a second). A retried registration (same incarnation and
  // registration nonce) gets the first answer again. A lost worker of the same name is
  // replaced: the daemon came back.
  absl::StatusOr<v1::RegisterWorkerResponse> Register(const v1::RegisterWorkerRequest& request,
                                                      const std::string& principal,
                                                      bool awaiting_first_poll, int64_t now);

  // NOT_FOUND: unknown, lost or stale incarnation. PERMISSION_DENIED: the secret differs.
  absl::StatusOr<WorkerRecord*> FindLive(const std::string& worker_id, uint64_t incarnation,
                                         const std::string& secret);
  // Any worker, lost ones included; null when unknown.
  WorkerRecord* Find(const std::string& worker_id);
  const WorkerRecord* Find(const std::string& worker_id) const;

  // Marks the worker LOST and returns the ranks of current attempts it held (job -> ranks); its
  // slots are cleared (its processes are gone with it, or will be).
  std::map<std::string, std::vector<int>> MarkLost(
      WorkerRecord* worker, const std::function<bool(const BusySlot&)>& is_current, int64_t now);
  // Live workers silent past the heartbeat timeout, with how long each has been silent, in
  // worker id order. O(silent workers x log n): live workers are kept ordered by last heartbeat.
  std::vector<std::pair<WorkerRecord*, int64_t>> Silent(int64_t now);
  // Forgets lost workers past the retention bounds.
  void PruneLost(int64_t now);

  // A call the live worker proved its own: it is alive at `now`. O(log n).
  void Touch(WorkerRecord* worker, int64_t now);
  // The live worker's usage, read at `read_unix_ms` (validated: ValidateWorkerUsage), replaces
  // the one it had. Kept in memory only; a lost worker's is dropped (MarkLost).
  void RecordUsage(WorkerRecord* worker, const v1::WorkerUsage& usage, int64_t read_unix_ms);
  // Its first poll after a coordinator restart has reported what it runs: its free slots may
  // take ranks.
  void FirstPollDone(WorkerRecord* worker);
  // `slot` of the live worker runs `busy` from now on. False (nothing changes) when the slot
  // does not exist or is busy.
  bool Occupy(WorkerRecord* worker, int slot, const BusySlot& busy);

  // Frees the slots whose rank is not current and whose process is gone: `exited_key` names
  // the one that just exited, or `running` lists what the worker still runs. Returns whether
  // any slot was freed.
  bool FreeDrainingSlots(WorkerRecord* worker, const std::function<bool(const BusySlot&)>& is_current,
                         const std::set<std::string>* running, const std::string& exited_key);
  // Frees the slots of (job, attempt) whose rank `exited` says is gone. Walks only the workers
  // holding slots of that job.
  void ReleaseExited(const std::string& job_id, int attempt,
                     const std::function<bool(int rank)>& exited);

  // PlaceRanks (placement.h) over the live workers of `device` that may take ranks now, their
  // free slots big enough for `rank_memory_bytes` and, for CPU ranks, their machines' free
  // memory: the answer PlaceRanks gives for the list of those workers (in id order, each with
  // its fitting free slots) without a walk of the workers. It visits them in placement order (most free slots first) from an index,
  // and stops once the job is placed: O(visited x slots + log n) where visited is about the
  // workers the job lands on. (Workers whose free slots are all too small for the job, or whose
  // machines' memory is taken, are visited and passed over.)
  std::optional<std::vector<RankSlot>> Place(v1::DeviceKind device, int world_size,
                                             int64_t rank_memory_bytes,
                                             const std::set<std::string>& rank0_workers) const;
  // The machines of live CPU workers (machine id -> its memory and workers). O(machines).
  std::map<std::string, MachineUse> CpuMachines() const;
  // Free slots of live `device` workers that may take ranks now (an upper bound for any one
  // job: some may be too small for it). A counter.
  int FreeSlots(v1::DeviceKind device) const;
  // The largest memory a slot of a live `device` worker offers (INT64_MAX: one does not say;
  // -1: no live worker of that kind). O(log n).
  int64_t LargestSlotMemory(v1::DeviceKind device) const;
  // Why a job of `world_size` ranks of `rank_memory_bytes` on `device` cannot be placed now;
  // workers refused for capacity lately are named ("; N workers refused for capacity").
  // O(distinct slot sizes) from the index, except when enough slots are free but their CPU
  // machines' memory is not: that explanation walks the live CPU workers.
  std::string PendingReason(v1::DeviceKind device, int world_size,
                            int64_t rank_memory_bytes) const;
  std::vector<const WorkerRecord*> Live(v1::DeviceKind device) const;
  // The ids of the records (live and lost) of one worker name.
  const std::set<std::string>& IdsOfName(const std::string& name) const;

  // Recomputes every index from the records and compares (for tests and fuzzers): OK, or
  // INTERNAL naming the first index that disagrees. O(n).
  absl::Status CheckIndexes() const;

  // Every worker, its usage always present (zeros and usage_unix_ms 0 until it sent one).
  std::vector<v1::Worker> List() const;
  // Every worker record, for the caller's passes over slots.
  std::map<std::string, WorkerRecord>& all() { return workers_; }
  const std::map<std::string, WorkerRecord>& all() const { return workers_; }

  int64_t heartbeat_interval_ms() const;
  int live_workers() const { return live_workers_; }
  // Refusals since start, by reason ("capacity", "name_held").
  const std::map<std::string, uint64_t>& RefusedTotals() const { return refused_totals_; }
  // Distinct workers refused for capacity in the last kRefusedNameRetentionMs (at most
  // kMaxRefusedNamesTracked are told apart), and the last such refusal ("" if none).
  size_t RecentlyRefusedForCapacity() const { return refused_names_.size(); }
  const std::string& last_refusal() const { return last_refusal_; }
  // The delay a capacity refusal asks for: room frees when a worker deregisters or misses
  // heartbeats, so about a heartbeat interval; the daemon backs off exponentially from it.
  int64_t RetryAfterMs() const;
  // The retry delay a status carries (0: none).
  static int64_t RetryAfterOf(const absl::Status& status);

 private:
  std::string SlotsReason(v1::DeviceKind device, int world_size, int64_t rank_memory_bytes) const;
  absl::Status Refuse(const std::string& reason, const std::string& name, absl::Status status,
                      int64_t now);
  v1::RegisterWorkerResponse Answer(const std::string& worker_id,
                                    const WorkerRecord& worker) const;

  // The slots one worker adds to its kind's counts, or takes back (sign -1): every change to a
  // live worker's slots, state or first poll is wrapped in Unindex ... Index.
  void Index(const WorkerRecord& worker, int sign);
  void Unindex(const WorkerRecord& worker) { Index(worker, -1); }
  void Index(const WorkerRecord& worker) { Index(worker, +1); }
  // The free slots of `worker` big enough for a rank of `rank_memory_bytes`, increasing.
  static WorkerSlots FittingSlots(const WorkerRecord& worker, int64_t rank_memory_bytes);
  // The free memory of a CPU machine for PlaceRanks (nullopt: no bound).
  std::optional<int64_t> MachineFreeBytes(const std::string& machine) const;

  Options options_;
  std::map<std::string, WorkerRecord> workers_;
  std::deque<std::string> lost_;  // In the order they were lost.
  // Name -> ids of its records (live and lost): registration finds its name's records without
  // a walk of the table.
  std::map<std::string, std::set<std::string>> ids_by_name_;
  int live_workers_ = 0;  // Records in state ALIVE, kept as they change.
  // Live worker ids per device kind: a pass for CUDA jobs never walks CPU workers (with CUDA
  // jobs queued, each registration of a CPU worker used to walk the whole table).
  std::map<v1::DeviceKind, std::set<std::string>> live_by_device_;
  // What registration, heartbeat and placement would otherwise walk every worker for (at
  // 10,000 workers and a few queued jobs, each registration did), kept as workers change:
  struct SlotCounts {
    int slots = 0;
    int free = 0;
  };
  struct DeviceIndex {
    int free_slots = 0;  // Of live workers not awaiting their first poll.
    // (-free slots, id) of those with a free slot: placement order (most free first, then id,
    // the order PlaceRanks' stable sort gives an id-ordered list).
    std::set<std::pair<int, std::string>> by_free;
    // Slot capacity (SlotMemory; 0: not said) -> slots and free slots of live workers
    // (awaiting ones too, as PendingReason counts them).
    std::map<int64_t, SlotCounts> capacities;
  };
  std::map<v1::DeviceKind, DeviceIndex> devices_;
  struct MachineIndex {
    std::multiset<int64_t> memory_bytes;  // What each of its live CPU workers advertises.
    int64_t used_bytes = 0;
    std::set<std::string> worker_ids;
  };
  std::map<std::string, MachineIndex> cpu_machines_;  // Machines of live CPU workers.
  // (last heartbeat, id) of live workers: the liveness tick reads only the silent ones.
  std::set<std::pair<int64_t, std::string>> by_heartbeat_;
  // Job id -> worker id -> its slots holding a rank of the job (any attempt).
  std::map<std::string, std::map<std::string, int>> workers_by_job_;
  int64_t next_worker_number_ = 1;
  std::map<std::string, uint64_t> refused_totals_;
  std::map<std::string, int64_t> refused_names_;  // Name -> its last capacity refusal.
  std::string last_refusal_;
  int64_t last_refusal_logged_ms_ = -1'000'000;
  uint64_t refusals_not_logged_ = 0;
};

}  // namespace mptrain
