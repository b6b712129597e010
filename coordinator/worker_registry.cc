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

absl::Status ValidateWorkerUsage(const v1::WorkerUsage& usage, int64_t age_ms,
                                 const v1::Worker& worker) {
  if (age_ms < 0 || age_ms > kMaxUsageAgeMs) {
    return absl::InvalidArgumentError(absl::StrCat("usage_age_ms must be in [0, ",
                                                   kMaxUsageAgeMs, "], got ", age_ms));
  }
  if (usage.memory_available_bytes() < 0 || usage.memory_total_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "usage.memory_", usage.memory_available_bytes() < 0 ? "available" : "total",
        "_bytes must be >= 0 (0: not read), got ",
        std::min(usage.memory_available_bytes(), usage.memory_total_bytes())));
  }
  if (usage.memory_total_bytes() > 0 &&
      usage.memory_available_bytes() > usage.memory_total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "usage.memory_available_bytes must be <= usage.memory_total_bytes (",
        usage.memory_total_bytes(), "), got ", usage.memory_available_bytes()));
  }
  if (usage.devices_size() > kMaxUsageDevices) {
    return absl::InvalidArgumentError(absl::StrCat("usage.devices may list at most ",
                                                   kMaxUsageDevices, " devices, got ",
                                                   usage.devices_size()));
  }
  for (int i = 0; i < usage.devices_size(); ++i) {
    const v1::DeviceUsage& device = usage.devices(i);
    const std::string field = absl::StrCat("usage.devices[", i, "]");
    const bool registered =
        std::any_of(worker.devices().begin(), worker.devices().end(),
                    [&](const v1::DeviceInfo& info) { return info.index() == device.index(); });
    if (!registered) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".index must be one of the ", worker.devices_size(),
                       " device(s) this worker registered, got ", device.index()));
    }
    for (int j = 0; j < i; ++j) {
      if (usage.devices(j).index() == device.index()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".index ", device.index(),
                                                       " repeats usage.devices[", j, "]'s"));
      }
    }
    if (device.memory_used_bytes() < 0 || device.memory_total_bytes() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".memory_", device.memory_used_bytes() < 0 ? "used" : "total",
          "_bytes must be >= 0, got ",
          std::min(device.memory_used_bytes(), device.memory_total_bytes())));
    }
    if (device.memory_total_bytes() > 0 &&
        device.memory_used_bytes() > device.memory_total_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".memory_used_bytes must be <= ", field, ".memory_total_bytes (",
          device.memory_total_bytes(), "), got ", device.memory_used_bytes()));
    }
    if (device.utilization_percent() < 0 || device.utilization_percent() > 100) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".utilization_percent must be in [0, 100], got ", device.utilization_percent()));
    }
    if (!device.available() && (device.memory_used_bytes() != 0 ||
                                device.memory_total_bytes() != 0 ||
                                device.utilization_percent() != 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " is not available: its figures must be 0"));
    }
  }
  return absl::OkStatus();
}

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
  worker.awaiting_first_poll_ = awaiting_first_poll;
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
  by_heartbeat_.emplace(now, worker_id);
  Index(stored);
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
    Unindex(*worker);
    --live_workers_;
    live_by_device_[worker->info.device()].erase(worker->info.worker_id());
    by_heartbeat_.erase({worker->info.last_heartbeat_unix_ms(), worker->info.worker_id()});
  }
  worker->info.set_state(v1::LOST);
  // Live data: a lost worker's last reading says nothing of now.
  worker->info.clear_usage();
  worker->info.set_usage_unix_ms(0);
  worker->lost_at_ms = now;
  lost_.push_back(worker->info.worker_id());
  std::map<std::string, std::vector<int>> affected;
  for (const auto& [index, slot] : worker->busy_slots_) {
    if (is_current(slot)) affected[slot.job_id].push_back(slot.rank);
  }
  worker->busy_slots_.clear();
  return affected;
}

std::vector<std::pair<WorkerRecord*, int64_t>> WorkerRegistry::Silent(int64_t now) {
  std::vector<std::pair<WorkerRecord*, int64_t>> silent;
  // Oldest heartbeat first: the walk stops at the first worker heard from lately.
  for (const auto& [last_heartbeat_ms, id] : by_heartbeat_) {
    const int64_t silent_ms = now - last_heartbeat_ms;
    if (silent_ms <= options_.heartbeat_timeout_ms) break;
    silent.emplace_back(Find(id), silent_ms);
  }
  // In id order, as a walk of the table gave them (the order they are declared lost in).
  std::sort(silent.begin(), silent.end(), [](const auto& a, const auto& b) {
    return a.first->info.worker_id() < b.first->info.worker_id();
  });
  return silent;
}

void WorkerRegistry::Touch(WorkerRecord* worker, int64_t now) {
  if (!worker->alive()) {
    worker->info.set_last_heartbeat_unix_ms(now);
    return;
  }
  const std::string& id = worker->info.worker_id();
  by_heartbeat_.erase({worker->info.last_heartbeat_unix_ms(), id});
  worker->info.set_last_heartbeat_unix_ms(now);
  by_heartbeat_.emplace(now, id);
}

void WorkerRegistry::RecordUsage(WorkerRecord* worker, const v1::WorkerUsage& usage,
                                 int64_t read_unix_ms) {
  if (!worker->alive()) return;
  *worker->info.mutable_usage() = usage;
  worker->info.set_usage_unix_ms(read_unix_ms);
}

void WorkerRegistry::FirstPollDone(WorkerRecord* worker) {
  Unindex(*worker);
  worker->awaiting_first_poll_ = false;
  Index(*worker);
}

bool WorkerRegistry::Occupy(WorkerRecord* worker, int slot, const BusySlot& busy) {
  if (!worker->alive() || slot < 0 || slot >= worker->info.slots() || worker->busy_slots_.count(slot)) return false;
  Unindex(*worker);
  worker->busy_slots_[slot] = busy;
  Index(*worker);
  return true;
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
  std::vector<int> gone;
  for (const auto& [index, slot] : worker->busy_slots_) {
    const std::string key = AssignmentKey(slot.job_id, slot.rank, slot.attempt);
    if (!is_current(slot) &&
        (key == exited_key || (running != nullptr && !running->count(key)))) {
      gone.push_back(index);
    }
  }
  if (gone.empty()) return false;
  Unindex(*worker);
  for (int index : gone) worker->busy_slots_.erase(index);
  Index(*worker);
  return true;
}

void WorkerRegistry::ReleaseExited(const std::string& job_id, int attempt,
                                   const std::function<bool(int rank)>& exited) {
  auto holders = workers_by_job_.find(job_id);
  if (holders == workers_by_job_.end()) return;
  std::vector<std::string> worker_ids;  // Copied: freeing a slot changes the index.
  for (const auto& [worker_id, slots] : holders->second) worker_ids.push_back(worker_id);
  for (const std::string& worker_id : worker_ids) {
    WorkerRecord* worker = Find(worker_id);
    std::vector<int> gone;
    for (const auto& [index, slot] : worker->busy_slots_) {
      if (slot.job_id == job_id && slot.attempt == attempt && exited(slot.rank)) {
        gone.push_back(index);
      }
    }
    if (gone.empty()) continue;
    Unindex(*worker);
    for (int index : gone) worker->busy_slots_.erase(index);
    Index(*worker);
  }
}

void WorkerRegistry::Index(const WorkerRecord& worker, int sign) {
  if (!worker.alive()) return;  // A lost worker holds no slots and counts nowhere.
  const std::string& id = worker.info.worker_id();
  DeviceIndex& device = devices_[worker.info.device()];
  const int free = worker.free_slots();
  if (!worker.awaiting_first_poll_) {
    device.free_slots += sign * free;
    if (free > 0) {
      if (sign > 0) {
        device.by_free.emplace(-free, id);
      } else {
        device.by_free.erase({-free, id});
      }
    }
  }
  for (int slot = 0; slot < worker.info.slots(); ++slot) {
    const int64_t capacity = worker.SlotMemory(slot);
    SlotCounts& counts = device.capacities[capacity];
    counts.slots += sign;
    if (!worker.busy_slots_.count(slot)) counts.free += sign;
    if (counts.slots == 0) device.capacities.erase(capacity);
  }
  for (const auto& [slot, busy] : worker.busy_slots_) {
    int& held = workers_by_job_[busy.job_id][id];
    held += sign;
    if (held == 0) {
      auto job = workers_by_job_.find(busy.job_id);
      job->second.erase(id);
      if (job->second.empty()) workers_by_job_.erase(job);
    }
  }
  if (worker.info.device() != v1::CPU) return;
  const std::string machine_id = worker.machine();
  MachineIndex& machine = cpu_machines_[machine_id];
  int64_t used = 0;
  for (const auto& [slot, busy] : worker.busy_slots_) used += busy.memory_bytes;
  machine.used_bytes += sign * used;
  if (sign > 0) {
    machine.memory_bytes.insert(worker.info.memory_bytes());
    machine.worker_ids.insert(id);
  } else {
    machine.memory_bytes.erase(machine.memory_bytes.find(worker.info.memory_bytes()));
    machine.worker_ids.erase(id);
    if (machine.worker_ids.empty()) cpu_machines_.erase(machine_id);
  }
}

WorkerSlots WorkerRegistry::FittingSlots(const WorkerRecord& worker, int64_t rank_memory_bytes) {
  WorkerSlots slots{worker.info.worker_id(), {}, worker.machine()};
  for (int slot = 0; slot < worker.info.slots(); ++slot) {
    const int64_t capacity = worker.SlotMemory(slot);
    const bool fits = capacity == 0 || capacity >= rank_memory_bytes;
    if (fits && !worker.busy_slots_.count(slot)) slots.free_slots.push_back(slot);
  }
  return slots;
}

std::optional<int64_t> WorkerRegistry::MachineFreeBytes(const std::string& machine_id) const {
  auto machine = cpu_machines_.find(machine_id);
  if (machine == cpu_machines_.end() || machine->second.memory_bytes.empty()) return std::nullopt;
  const int64_t capacity = *machine->second.memory_bytes.rbegin();
  if (capacity <= 0) return std::nullopt;  // None of its workers says: no bound.
  return capacity - machine->second.used_bytes;
}

std::optional<std::vector<RankSlot>> WorkerRegistry::Place(
    v1::DeviceKind device, int world_size, int64_t rank_memory_bytes,
    const std::set<std::string>& rank0_workers) const {
  auto index = devices_.find(device);
  if (world_size <= 0 || index == devices_.end() || index->second.free_slots < world_size) {
    return std::nullopt;
  }
  auto machine_free_bytes = [&](const std::string& machine_id) -> std::optional<int64_t> {
    if (device != v1::CPU) return std::nullopt;  // A GPU rank's estimate is of its device.
    return MachineFreeBytes(machine_id);
  };
  // PlaceRanks' order is by free slots that fit the job, the index's by free slots. A worker
  // with `fit` fitting slots is handed out once no worker not yet read can have more, i.e. once
  // the next in the index has fewer free slots than `fit`; ties go by id, as PlaceRanks' stable
  // sort of an id-ordered list gives them. For workers whose slots are all alike (every CPU
  // worker; GPUs of one model) `fit` is the free count or 0 and nothing waits.
  struct Ready {
    int fit;
    WorkerSlots slots;
  };
  auto later = [](const Ready& a, const Ready& b) {
    return a.fit != b.fit ? a.fit < b.fit : a.slots.worker_id > b.slots.worker_id;
  };
  std::vector<Ready> ready;  // A heap: the next to hand out on top.
  auto cursor = index->second.by_free.begin();
  const auto end = index->second.by_free.end();

  // Rank 0 first when it is bound to some workers: of them, the first in placement order
  // with a slot that fits and room in its machine.
  std::optional<WorkerSlots> first;
  if (!rank0_workers.empty()) {
    for (const std::string& id : rank0_workers) {
      const WorkerRecord* worker = Find(id);
      if (worker == nullptr || !worker->alive() || worker->awaiting_first_poll_ ||
          worker->info.device() != device) {
        continue;
      }
      WorkerSlots slots = FittingSlots(*worker, rank_memory_bytes);
      if (slots.free_slots.empty()) continue;
      std::optional<int64_t> room = machine_free_bytes(slots.machine_id);
      if (room && *room < rank_memory_bytes) continue;
      if (!first || slots.free_slots.size() > first->free_slots.size() ||
          (slots.free_slots.size() == first->free_slots.size() &&
           slots.worker_id < first->worker_id)) {
        first = std::move(slots);
      }
    }
    if (!first) return std::nullopt;
  }
  bool first_handed = false;
  WorkerSlots current;
  auto next = [&]() -> const WorkerSlots* {
    if (first && !first_handed) {
      first_handed = true;
      return &*first;
    }
    while (true) {
      const int next_free = cursor == end ? -1 : -cursor->first;
      if (!ready.empty() && ready.front().fit > next_free) {
        std::pop_heap(ready.begin(), ready.end(), later);
        current = std::move(ready.back().slots);
        ready.pop_back();
        return &current;
      }
      if (cursor == end) return nullptr;
      const WorkerRecord* worker = Find(cursor->second);
      ++cursor;
      if (first && worker->info.worker_id() == first->worker_id) continue;
      WorkerSlots slots = FittingSlots(*worker, rank_memory_bytes);
      if (slots.free_slots.empty()) continue;
      const int fit = static_cast<int>(slots.free_slots.size());
      ready.push_back({fit, std::move(slots)});
      std::push_heap(ready.begin(), ready.end(), later);
    }
  };
  return PlaceRanksInOrder(world_size, next, rank_memory_bytes, machine_free_bytes);
}

std::map<std::string, MachineUse> WorkerRegistry::CpuMachines() const {
  std::map<std::string, MachineUse> machines;
  for (const auto& [id, index] : cpu_machines_) {
    MachineUse& machine = machines[id];
    machine.capacity_bytes = std::max<int64_t>(0, *index.memory_bytes.rbegin());
    machine.used_bytes = index.used_bytes;
    machine.worker_ids.assign(index.worker_ids.begin(), index.worker_ids.end());
  }
  return machines;
}

int WorkerRegistry::FreeSlots(v1::DeviceKind device) const {
  auto index = devices_.find(device);
  return index == devices_.end() ? 0 : index->second.free_slots;
}

int64_t WorkerRegistry::LargestSlotMemory(v1::DeviceKind device) const {
  auto index = devices_.find(device);
  if (index == devices_.end() || index->second.capacities.empty()) return -1;
  const auto& capacities = index->second.capacities;
  // A slot that does not say its memory bounds nothing.
  if (capacities.count(0)) return std::numeric_limits<int64_t>::max();
  return std::max<int64_t>(-1, capacities.rbegin()->first);
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
  int total = 0, free = 0, too_small = 0;
  auto live = live_by_device_.find(device);
  const size_t workers = live == live_by_device_.end() ? 0 : live->second.size();
  if (auto index = devices_.find(device); index != devices_.end()) {
    for (const auto& [capacity, counts] : index->second.capacities) {
      if (capacity != 0 && capacity < rank_memory_bytes) {
        too_small += counts.slots;
        continue;
      }
      total += counts.slots;
      free += counts.free;
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
        if (big_enough && !worker->busy_slots_.count(slot)) ++free_here;
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

const std::set<std::string>& WorkerRegistry::IdsOfName(const std::string& name) const {
  static const std::set<std::string>* const kNone = new std::set<std::string>();
  auto ids = ids_by_name_.find(name);
  return ids == ids_by_name_.end() ? *kNone : ids->second;
}

absl::Status WorkerRegistry::CheckIndexes() const {
  // The indexes as a fresh registry holding these records would build them.
  WorkerRegistry fresh(options_);
  int live = 0;
  std::map<v1::DeviceKind, std::set<std::string>> live_by_device;
  std::map<std::string, std::set<std::string>> ids_by_name;
  for (const auto& [id, worker] : workers_) {
    if (id != worker.info.worker_id()) {
      return absl::InternalError(absl::StrCat("worker ", id, " is stored as ", worker.info.worker_id()));
    }
    ids_by_name[worker.name].insert(id);
    if (!worker.alive()) {
      if (!worker.busy_slots_.empty()) {
        return absl::InternalError(absl::StrCat("lost worker ", id, " holds slots"));
      }
      continue;
    }
    ++live;
    live_by_device[worker.info.device()].insert(id);
    fresh.by_heartbeat_.emplace(worker.info.last_heartbeat_unix_ms(), id);
    fresh.Index(worker);
  }
  auto same_live = [&]() {
    for (const auto& [device, ids] : live_by_device_) {
      if (!ids.empty() && live_by_device[device] != ids) return false;
    }
    for (const auto& [device, ids] : live_by_device) {
      auto it = live_by_device_.find(device);
      if (it == live_by_device_.end() || it->second != ids) return false;
    }
    return true;
  };
  if (live != live_workers_) {
    return absl::InternalError(absl::StrCat("live_workers ", live_workers_, ", counted ", live));
  }
  if (!same_live()) return absl::InternalError("live workers by device differ");
  if (ids_by_name != ids_by_name_) return absl::InternalError("ids by name differ");
  if (fresh.by_heartbeat_ != by_heartbeat_) {
    return absl::InternalError(absl::StrCat("heartbeat order differs: ", by_heartbeat_.size(),
                                            " entries, ", fresh.by_heartbeat_.size(), " expected"));
  }
  for (const auto& [device, expected] : fresh.devices_) {
    auto it = devices_.find(device);
    const DeviceIndex empty;
    const DeviceIndex& index = it == devices_.end() ? empty : it->second;
    if (index.free_slots != expected.free_slots) {
      return absl::InternalError(absl::StrCat(v1::DeviceKind_Name(device), " free slots ",
                                              index.free_slots, ", counted ",
                                              expected.free_slots));
    }
    if (index.by_free != expected.by_free) {
      return absl::InternalError(absl::StrCat(v1::DeviceKind_Name(device),
                                              " placement order differs"));
    }
    if (index.capacities.size() != expected.capacities.size()) {
      return absl::InternalError(absl::StrCat(v1::DeviceKind_Name(device),
                                              " slot capacities differ"));
    }
    for (const auto& [capacity, counts] : expected.capacities) {
      auto found = index.capacities.find(capacity);
      if (found == index.capacities.end() || found->second.slots != counts.slots ||
          found->second.free != counts.free) {
        return absl::InternalError(absl::StrCat(v1::DeviceKind_Name(device),
                                                " slots of capacity ", capacity, " differ"));
      }
    }
  }
  for (const auto& [device, index] : devices_) {
    if (fresh.devices_.count(device)) continue;
    if (index.free_slots != 0 || !index.by_free.empty() || !index.capacities.empty()) {
      return absl::InternalError(absl::StrCat(v1::DeviceKind_Name(device),
                                              " has index entries but no live worker"));
    }
  }
  if (fresh.cpu_machines_.size() != cpu_machines_.size()) {
    return absl::InternalError("cpu machines differ");
  }
  for (const auto& [id, expected] : fresh.cpu_machines_) {
    auto found = cpu_machines_.find(id);
    if (found == cpu_machines_.end() || found->second.memory_bytes != expected.memory_bytes ||
        found->second.used_bytes != expected.used_bytes ||
        found->second.worker_ids != expected.worker_ids) {
      return absl::InternalError(absl::StrCat("machine ", id, " differs"));
    }
  }
  if (fresh.workers_by_job_ != workers_by_job_) {
    return absl::InternalError("workers by job differ");
  }
  return absl::OkStatus();
}

std::vector<v1::Worker> WorkerRegistry::List() const {
  std::vector<v1::Worker> workers;
  for (const auto& [id, worker] : workers_) {
    v1::Worker info = worker.info;
    info.set_free_slots(worker.alive() ? worker.free_slots() : 0);
    info.mutable_usage();  // Present, zeros, until the worker sends one: one shape for clients.
    workers.push_back(info);
  }
  return workers;
}

std::string WorkerRegistry::NameOfId(const std::string& worker_id) {
  const size_t hash = worker_id.rfind('#');
  return hash == std::string::npos ? "" : worker_id.substr(0, hash);
}

}  // namespace mptrain
