#include "coordinator/worker_registry.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/path_rules.h"
#include "common/resource_estimate.h"
#include "common/rpc_limits.h"
#include "common/secrets.h"
#include "spdlog/spdlog.h"

namespace mptrain {
namespace {

bool IsWorkerName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == ':' || c == '@';
    if (!ok) return false;
  }
  return true;
}

absl::Status CheckRoots(const char* field,
                        const google::protobuf::RepeatedPtrField<std::string>& roots) {
  if (roots.size() > kMaxRootsPerKind) {
    return absl::InvalidArgumentError(absl::StrCat(field, " may list at most ", kMaxRootsPerKind,
                                                   " directories, got ", roots.size()));
  }
  for (int i = 0; i < roots.size(); ++i) {
    if (absl::Status status = CheckPathSyntax(absl::StrCat(field, "[", i, "]"), roots[i]);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string AssignmentKey(const std::string& job_id, int rank, int attempt) {
  return absl::StrCat(job_id, "/", rank, "/", attempt);
}

int64_t WorkerRecord::SlotMemory(int slot) const {
  if (info.device() == v1::CUDA) {
    for (const v1::DeviceInfo& device : info.devices()) {
      if (device.index() == slot) return device.memory_bytes();
    }
    return 0;
  }
  // CPU ranks of one worker share its memory.
  return info.memory_bytes() / std::max(1, info.slots());
}

std::string WorkerRecord::machine() const {
  // '/' is no machine id's character: a worker's own machine cannot be claimed by another.
  return info.machine_id().empty() ? absl::StrCat("worker/", info.worker_id())
                                   : info.machine_id();
}

int64_t WorkerRegistry::heartbeat_interval_ms() const {
  // A fifth of the timeout: a network blip of more than half of it (a lost heartbeat, and
  // one after the link is back on a fresh connection) passes before the worker is declared
  // lost.
  return std::max<int64_t>(100, options_.heartbeat_timeout_ms / 5);
}

v1::RegisterWorkerResponse WorkerRegistry::Answer(const std::string& worker_id,
                                                  const WorkerRecord& worker) const {
  v1::RegisterWorkerResponse response;
  response.set_worker_id(worker_id);
  response.set_heartbeat_interval_ms(heartbeat_interval_ms());
  response.set_heartbeat_timeout_ms(options_.heartbeat_timeout_ms);
  response.set_worker_secret(worker.secret);
  return response;
}

absl::StatusOr<v1::RegisterWorkerResponse> WorkerRegistry::Register(
    const v1::RegisterWorkerRequest& request, const std::string& principal,
    bool awaiting_first_poll, int64_t now) {
  if (request.slots() < 1 || request.slots() > kMaxWorkerSlots) {
    return absl::InvalidArgumentError(absl::StrCat("slots must be in [1, ", kMaxWorkerSlots,
                                                   "], got ", request.slots()));
  }
  if (request.devices_size() > kMaxWorkerSlots) {
    return absl::InvalidArgumentError(absl::StrCat("devices may list at most ", kMaxWorkerSlots,
                                                   " devices, got ", request.devices_size()));
  }
  for (const v1::DeviceInfo& device : request.devices()) {
    if (device.name().size() > kMaxDeviceNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat("devices[].name must be at most ",
                                                     kMaxDeviceNameBytes, " bytes, got ",
                                                     device.name().size()));
    }
  }
  if (request.registration_nonce().size() > kMaxRegistrationNonceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("registration_nonce must be at most ",
                                                   kMaxRegistrationNonceBytes, " bytes, got ",
                                                   request.registration_nonce().size()));
  }
  if (request.device() != v1::CPU && request.device() != v1::CUDA) {
    return absl::InvalidArgumentError("device must be cpu or cuda");
  }
  if (request.machine_id().size() > kMaxMachineIdBytes ||
      !std::all_of(request.machine_id().begin(), request.machine_id().end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
               c == ':' || c == '-';
      })) {
    return absl::InvalidArgumentError(absl::StrCat("machine_id must be at most ",
                                                   kMaxMachineIdBytes,
                                                   " characters of [A-Za-z0-9._:-]"));
  }
  if (request.memory_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_bytes must be >= 0 (0: not said), got ", request.memory_bytes()));
  }
  if (request.host().empty() || request.host().size() > 255) {
    return absl::InvalidArgumentError("host must be set, at most 255 bytes");
  }
  std::string name = request.name().empty() ? request.host() : request.name();
  if (!IsWorkerName(name)) {
    return absl::InvalidArgumentError("name must be 1 to 128 characters of [A-Za-z0-9._:@-]");
  }
  if (absl::Status status = CheckRoots("data_roots", request.data_roots()); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckRoots("output_roots", request.output_roots()); !status.ok()) {
    return status;
  }
  std::vector<std::string> replaced;
  if (auto same_name = ids_by_name_.find(name); same_name != ids_by_name_.end()) {
    for (const std::string& id : same_name->second) {
      const WorkerRecord& worker = workers_.at(id);
      if (!worker.alive()) {
        replaced.push_back(id);
        continue;
      }
      if (worker.info.incarnation() == request.incarnation() &&
          !request.registration_nonce().empty() &&
          SecretsEqual(worker.registration_nonce, request.registration_nonce())) {
        // The same daemon again: its first answer was lost (a client-side deadline).
        return Answer(id, worker);
      }
      // Taking over a live worker's name would hand its ranks' slots to whoever asks.
      return Refuse("name_held", name,
                    absl::AlreadyExistsError(absl::StrCat(
                        "worker name ", name, " is held by live worker ", id,
                        "; it frees when that worker deregisters or misses heartbeats for ",
                        options_.heartbeat_timeout_ms / 1000.0, " s")),
                    now);
    }
  }
  if (live_workers_ >= options_.max_live_workers) {
    const int64_t retry_after_ms = RetryAfterMs();
    absl::Status refusal = absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator has ", live_workers_, " live workers, its limit (--max_live_workers ",
        options_.max_live_workers, "); this one is not registered: retry in ",
        retry_after_ms / 1000.0, " s or later"));
    refusal.SetPayload(kRetryAfterPayloadUrl, absl::Cord(absl::StrCat(retry_after_ms)));
    return Refuse("capacity", name, std::move(refusal), now);
  }
  // The daemon is back under its name: its lost entry is history now.
  for (const std::string& id : replaced) {
    workers_.erase(id);
    ids_by_name_[name].erase(id);
    lost_.erase(std::remove(lost_.begin(), lost_.end(), id), lost_.end());
  }
  refused_names_.erase(name);
  WorkerRecord worker;
  worker.name = name;
  worker.secret = RandomSecret();
  worker.registration_nonce = request.registration_nonce();
  worker.awaiting_first_poll = awaiting_first_poll;
  std::string worker_id = absl::StrCat(name, "#", next_worker_number_++);  // NameOfId's form.
  worker.info.set_worker_id(worker_id);
  worker.info.set_host(request.host());
  worker.info.set_device(request.device());
  worker.info.set_slots(request.slots());
  *worker.info.mutable_devices() = request.devices();
  worker.info.set_incarnation(request.incarnation());
  worker.info.set_state(v1::ALIVE);
  worker.info.set_last_heartbeat_unix_ms(now);
  *worker.info.mutable_data_roots() = request.data_roots();
  *worker.info.mutable_output_roots() = request.output_roots();
  worker.info.set_memory_bytes(request.memory_bytes());
  worker.info.set_machine_id(request.machine_id());
  worker.info.set_principal(principal);
  const WorkerRecord& stored = workers_[worker_id] = std::move(worker);
  ids_by_name_[name].insert(worker_id);
  live_by_device_[request.device()].insert(worker_id);
  ++live_workers_;
  spdlog::info("worker {} registered: host {}, {} {} slot(s){}", worker_id, request.host(),
               request.slots(), v1::DeviceKind_Name(request.device()),
               replaced.empty() ? "" : " (replacing its lost entry)");
  return Answer(worker_id, stored);
}

absl::StatusOr<WorkerRecord*> WorkerRegistry::FindLive(const std::string& worker_id,
                                                       uint64_t incarnation,
                                                       const std::string& secret) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown worker ", TruncateForError(worker_id, 128), "; register again"));
  }
  WorkerRecord& worker = it->second;
  // The secret first: without it nothing about the worker is revealed or changed.
  if (!SecretsEqual(worker.secret, secret)) {
    return absl::PermissionDeniedError(absl::StrCat("the worker secret does not match worker ",
                                                    TruncateForError(worker_id, 128)));
  }
  if (worker.info.incarnation() != incarnation) {
    return absl::NotFoundError(absl::StrCat("worker ", worker_id, " has incarnation ",
                                            worker.info.incarnation(), ", not ", incarnation,
                                            "; register again"));
  }
  if (!worker.alive()) {
    return absl::NotFoundError(
        absl::StrCat("worker ", worker_id, " was marked lost; register again"));
  }
  return &worker;
}

WorkerRecord* WorkerRegistry::Find(const std::string& worker_id) {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

const WorkerRecord* WorkerRegistry::Find(const std::string& worker_id) const {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

std::map<std::string, std::vector<int>> WorkerRegistry::MarkLost(
    WorkerRecord* worker, const std::function<bool(const BusySlot&)>& is_current, int64_t now) {
  if (worker->alive()) {
    --live_workers_;
    live_by_device_[worker->info.device()].erase(worker->info.worker_id());
  }
  worker->info.set_state(v1::LOST);
  worker->lost_at_ms = now;
  lost_.push_back(worker->info.worker_id());
  std::map<std::string, std::vector<int>> affected;
  for (const auto& [index, slot] : worker->busy_slots) {
    if (is_current(slot)) affected[slot.job_id].push_back(slot.rank);
  }
  worker->busy_slots.clear();
  return affected;
}

std::vector<std::pair<WorkerRecord*, int64_t>> WorkerRegistry::Silent(int64_t now) {
  std::vector<std::pair<WorkerRecord*, int64_t>> silent;
  for (auto& [id, worker] : workers_) {
    if (!worker.alive()) continue;
    const int64_t silent_ms = now - worker.info.last_heartbeat_unix_ms();
    if (silent_ms > options_.heartbeat_timeout_ms) silent.emplace_back(&worker, silent_ms);
  }
  return silent;
}

void WorkerRegistry::PruneLost(int64_t now) {
  while (!lost_.empty()) {
    const WorkerRecord* oldest = Find(lost_.front());
    if (oldest != nullptr && lost_.size() <= options_.max_lost_workers &&
        now - oldest->lost_at_ms <= options_.lost_worker_retention_ms) {
      break;
    }
    if (oldest != nullptr && !oldest->alive()) {
      auto same_name = ids_by_name_.find(oldest->name);
      if (same_name != ids_by_name_.end() && same_name->second.erase(lost_.front()) &&
          same_name->second.empty()) {
        ids_by_name_.erase(same_name);
      }
      workers_.erase(lost_.front());
    }
    lost_.pop_front();
  }
  for (auto it = refused_names_.begin(); it != refused_names_.end();) {
    it = now - it->second > kRefusedNameRetentionMs ? refused_names_.erase(it) : std::next(it);
  }
}

int64_t WorkerRegistry::RetryAfterMs() const {
  return std::clamp<int64_t>(heartbeat_interval_ms(), 1'000, 60'000);
}

int64_t WorkerRegistry::RetryAfterOf(const absl::Status& status) {
  auto payload = status.GetPayload(kRetryAfterPayloadUrl);
  int64_t ms = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &ms) || ms < 0) return 0;
  return ms;
}

absl::Status WorkerRegistry::Refuse(const std::string& reason, const std::string& name,
                                    absl::Status status, int64_t now) {
  refused_totals_[reason] += 1;
  if (reason == "capacity") {
    if (refused_names_.size() < kMaxRefusedNamesTracked || refused_names_.count(name)) {
      refused_names_[name] = now;
    }
    last_refusal_ = absl::StrCat(name, ": ", status.message());
  }
  // A full coordinator may be asked thousands of times a second: one line a second, with a
  // count of what it stands for.
  if (now - last_refusal_logged_ms_ >= 1'000) {
    spdlog::warn("worker {} refused ({}): {}{}", name, reason, std::string(status.message()),
                 refusals_not_logged_ == 0
                     ? std::string()
                     : absl::StrCat(" (", refusals_not_logged_, " more refusals not logged)"));
    last_refusal_logged_ms_ = now;
    refusals_not_logged_ = 0;
  } else {
    ++refusals_not_logged_;
  }
  return status;
}

bool WorkerRegistry::FreeDrainingSlots(WorkerRecord* worker,
                                       const std::function<bool(const BusySlot&)>& is_current,
                                       const std::set<std::string>* running,
                                       const std::string& exited_key) {
  bool freed = false;
  for (auto it = worker->busy_slots.begin(); it != worker->busy_slots.end();) {
    const BusySlot& slot = it->second;
    const std::string key = AssignmentKey(slot.job_id, slot.rank, slot.attempt);
    const bool gone =
        !is_current(slot) && (key == exited_key || (running != nullptr && !running->count(key)));
    if (gone) {
      it = worker->busy_slots.erase(it);
      freed = true;
    } else {
      ++it;
    }
  }
  return freed;
}

void WorkerRegistry::ReleaseExited(const std::string& job_id, int attempt,
                                   const std::function<bool(int rank)>& exited) {
  for (auto& [id, worker] : workers_) {
    for (auto it = worker.busy_slots.begin(); it != worker.busy_slots.end();) {
      const BusySlot& slot = it->second;
      const bool gone = slot.job_id == job_id && slot.attempt == attempt && exited(slot.rank);
      it = gone ? worker.busy_slots.erase(it) : std::next(it);
    }
  }
}

std::vector<WorkerSlots> WorkerRegistry::Candidates(v1::DeviceKind device,
                                                    int64_t rank_memory_bytes) const {
  std::vector<WorkerSlots> candidates;
  for (const WorkerRecord* live : Live(device)) {
    const WorkerRecord& worker = *live;
    const std::string& id = worker.info.worker_id();
    if (worker.awaiting_first_poll) continue;
    WorkerSlots slots{id, {}, worker.machine()};
    for (int slot = 0; slot < worker.info.slots(); ++slot) {
      const int64_t capacity = worker.SlotMemory(slot);
      const bool fits = capacity == 0 || capacity >= rank_memory_bytes;
      if (fits && !worker.busy_slots.count(slot)) slots.free_slots.push_back(slot);
    }
    candidates.push_back(std::move(slots));
  }
  return candidates;
}

std::map<std::string, MachineUse> WorkerRegistry::CpuMachines() const {
  std::map<std::string, MachineUse> machines;
  for (const WorkerRecord* worker : Live(v1::CPU)) {
    MachineUse& machine = machines[worker->machine()];
    machine.capacity_bytes = std::max(machine.capacity_bytes, worker->info.memory_bytes());
    for (const auto& [slot, busy] : worker->busy_slots) machine.used_bytes += busy.memory_bytes;
    machine.worker_ids.push_back(worker->info.worker_id());
  }
  return machines;
}

MachineMemory WorkerRegistry::FreeMachineMemory(v1::DeviceKind device,
                                                int64_t rank_memory_bytes) const {
  MachineMemory memory;
  memory.rank_memory_bytes = rank_memory_bytes;
  if (device != v1::CPU) return memory;
  for (const auto& [id, machine] : CpuMachines()) {
    if (machine.capacity_bytes > 0) memory.free_bytes[id] = machine.free_bytes();
  }
  return memory;
}

std::map<v1::DeviceKind, int> WorkerRegistry::FreeSlotsByDevice() const {
  std::map<v1::DeviceKind, int> free;
  for (const auto& [id, worker] : workers_) {
    if (worker.alive() && !worker.awaiting_first_poll) {
      free[worker.info.device()] += worker.free_slots();
    }
  }
  return free;
}

int64_t WorkerRegistry::LargestSlotMemory(v1::DeviceKind device) const {
  int64_t largest = -1;
  for (const WorkerRecord* worker : Live(device)) {
    for (int slot = 0; slot < worker->info.slots(); ++slot) {
      const int64_t capacity = worker->SlotMemory(slot);
      largest = capacity == 0 ? std::numeric_limits<int64_t>::max() : std::max(largest, capacity);
    }
  }
  return largest;
}

std::string WorkerRegistry::PendingReason(v1::DeviceKind device, int world_size,
                                          int64_t rank_memory_bytes) const {
  std::string reason = SlotsReason(device, world_size, rank_memory_bytes);
  if (!refused_names_.empty()) {
    absl::StrAppend(&reason, "; ", refused_names_.size(),
                    refused_names_.size() >= kMaxRefusedNamesTracked ? " or more" : "",
                    refused_names_.size() == 1 ? " worker" : " workers",
                    " refused for capacity lately (--max_live_workers ", options_.max_live_workers,
                    ")");
  }
  return reason;
}

std::string WorkerRegistry::SlotsReason(v1::DeviceKind device, int world_size,
                                        int64_t rank_memory_bytes) const {
  const std::string kind = absl::AsciiStrToLower(v1::DeviceKind_Name(device));
  int total = 0, free = 0, too_small = 0, workers = 0;
  for (const WorkerRecord* worker : Live(device)) {
    ++workers;
    for (int slot = 0; slot < worker->info.slots(); ++slot) {
      const int64_t capacity = worker->SlotMemory(slot);
      if (capacity != 0 && capacity < rank_memory_bytes) {
        ++too_small;
        continue;
      }
      ++total;
      if (!worker->busy_slots.count(slot)) ++free;
    }
  }
  if (workers == 0) return absl::StrCat("no live ", kind, " worker");
  const std::string small =
      too_small == 0 ? ""
                     : absl::StrCat(" (", too_small, " more have less than the ",
                                    FormatBytes(rank_memory_bytes), " a rank needs)");
  if (total < world_size) {
    return absl::StrCat("needs ", world_size, " ", kind, " slots; ", total, " exist", small);
  }
  const std::string slots_reason = absl::StrCat("needs ", world_size, " free ", kind,
                                                " slots; ", free, " of ", total, " are free",
                                                small);
  if (free < world_size || device != v1::CPU || rank_memory_bytes <= 0) return slots_reason;
  // Enough free slots, but not enough memory on their machines: co-located workers share it.
  struct Room {
    std::string machine;
    const MachineUse* use;
    int ranks;
  };
  const std::map<std::string, MachineUse> machines = CpuMachines();
  std::vector<Room> rooms;
  int fit = 0;
  for (const auto& [id, machine] : machines) {
    int free_here = 0;
    for (const std::string& worker_id : machine.worker_ids) {
      const WorkerRecord* worker = Find(worker_id);
      for (int slot = 0; slot < worker->info.slots(); ++slot) {
        const int64_t capacity = worker->SlotMemory(slot);
        const bool big_enough = capacity == 0 || capacity >= rank_memory_bytes;
        if (big_enough && !worker->busy_slots.count(slot)) ++free_here;
      }
    }
    int ranks = free_here;
    if (machine.capacity_bytes > 0) {
      ranks = static_cast<int>(std::min<int64_t>(
          free_here, std::max<int64_t>(0, machine.free_bytes()) / rank_memory_bytes));
    }
    fit += ranks;
    if (machine.capacity_bytes > 0 && free_here > 0) rooms.push_back({id, &machine, ranks});
  }
  if (fit >= world_size) return slots_reason;  // Something else holds it back (rank 0's place).
  std::stable_sort(rooms.begin(), rooms.end(), [](const Room& a, const Room& b) {
    return a.use->free_bytes() > b.use->free_bytes();
  });
  std::string reason = absl::StrCat("needs ", world_size, " ", kind, " ranks of ",
                                    FormatBytes(rank_memory_bytes), " each; the free memory of "
                                    "their machines holds ", fit, ":");
  constexpr size_t kMachinesShown = 3;
  for (size_t i = 0; i < rooms.size() && i < kMachinesShown; ++i) {
    const Room& room = rooms[i];
    absl::StrAppend(&reason, i == 0 ? " " : "; ", "machine ", room.machine.substr(0, 12),
                    " (", absl::StrJoin(room.use->worker_ids, ", "), ") has ",
                    FormatBytes(std::max<int64_t>(0, room.use->free_bytes())), " free of ",
                    FormatBytes(room.use->capacity_bytes), ", room for ", room.ranks);
  }
  if (rooms.size() > kMachinesShown) {
    absl::StrAppend(&reason, "; ", rooms.size() - kMachinesShown, " more machines");
  }
  return absl::StrCat(reason, small);
}

std::vector<const WorkerRecord*> WorkerRegistry::Live(v1::DeviceKind device) const {
  std::vector<const WorkerRecord*> live;
  auto ids = live_by_device_.find(device);
  if (ids == live_by_device_.end()) return live;
  live.reserve(ids->second.size());
  for (const std::string& id : ids->second) live.push_back(Find(id));
  return live;
}

int WorkerRegistry::FreeSlots(v1::DeviceKind device) const {
  int free = 0;
  for (const WorkerRecord* worker : Live(device)) {
    if (!worker->awaiting_first_poll) free += worker->free_slots();
  }
  return free;
}

std::vector<v1::Worker> WorkerRegistry::List() const {
  std::vector<v1::Worker> workers;
  for (const auto& [id, worker] : workers_) {
    v1::Worker info = worker.info;
    info.set_free_slots(worker.alive() ? worker.free_slots() : 0);
    workers.push_back(info);
  }
  return workers;
}

std::string WorkerRegistry::NameOfId(const std::string& worker_id) {
  const size_t hash = worker_id.rfind('#');
  return hash == std::string::npos ? "" : worker_id.substr(0, hash);
}

}  // namespace mptrain
