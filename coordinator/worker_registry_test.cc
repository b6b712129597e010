#include "coordinator/worker_registry.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/resource_estimate.h"
#include "common/rpc_limits.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

v1::RegisterWorkerRequest Request(const std::string& name, uint64_t incarnation = 1) {
  v1::RegisterWorkerRequest request;
  request.set_name(name);
  request.set_host(name + ".example");
  request.set_device(v1::CPU);
  request.set_slots(2);
  request.set_incarnation(incarnation);
  request.set_registration_nonce("nonce-" + std::to_string(incarnation));
  return request;
}

WorkerRegistry::Options Options() {
  WorkerRegistry::Options options;
  options.heartbeat_timeout_ms = 1'000;
  options.lost_worker_retention_ms = 60'000;
  options.max_lost_workers = 2;
  return options;
}

const auto kNothingCurrent = [](const BusySlot&) { return false; };
const auto kAllCurrent = [](const BusySlot&) { return true; };

// The registry as it answered before its indexes (issue 33): walks of every record. The
// randomized test below holds the indexed answers to these.
std::vector<WorkerSlots> ScanCandidates(const WorkerRegistry& registry, v1::DeviceKind device,
                                        int64_t rank_memory_bytes) {
  std::vector<WorkerSlots> candidates;
  for (const auto& [id, worker] : registry.all()) {
    if (!worker.alive() || worker.info.device() != device || worker.awaiting_first_poll()) {
      continue;
    }
    WorkerSlots slots{id, {}, worker.machine()};
    for (int slot = 0; slot < worker.info.slots(); ++slot) {
      const int64_t capacity = worker.SlotMemory(slot);
      const bool fits = capacity == 0 || capacity >= rank_memory_bytes;
      if (fits && !worker.busy_slots().count(slot)) slots.free_slots.push_back(slot);
    }
    candidates.push_back(std::move(slots));
  }
  return candidates;
}

std::map<std::string, MachineUse> ScanCpuMachines(const WorkerRegistry& registry) {
  std::map<std::string, MachineUse> machines;
  for (const auto& [id, worker] : registry.all()) {
    if (!worker.alive() || worker.info.device() != v1::CPU) continue;
    MachineUse& machine = machines[worker.machine()];
    machine.capacity_bytes = std::max(machine.capacity_bytes, worker.info.memory_bytes());
    for (const auto& [slot, busy] : worker.busy_slots()) machine.used_bytes += busy.memory_bytes;
    machine.worker_ids.push_back(id);
  }
  return machines;
}

MachineMemory ScanFreeMachineMemory(const WorkerRegistry& registry, v1::DeviceKind device,
                                    int64_t rank_memory_bytes) {
  MachineMemory memory;
  memory.rank_memory_bytes = rank_memory_bytes;
  if (device != v1::CPU) return memory;
  for (const auto& [id, machine] : ScanCpuMachines(registry)) {
    if (machine.capacity_bytes > 0) memory.free_bytes[id] = machine.free_bytes();
  }
  return memory;
}

std::optional<std::vector<RankSlot>> ScanPlace(const WorkerRegistry& registry,
                                               v1::DeviceKind device, int world_size,
                                               int64_t rank_memory_bytes,
                                               const std::set<std::string>& rank0 = {}) {
  return PlaceRanks(world_size, ScanCandidates(registry, device, rank_memory_bytes), rank0,
                    ScanFreeMachineMemory(registry, device, rank_memory_bytes));
}

std::vector<std::pair<std::string, int64_t>> ScanSilent(const WorkerRegistry& registry,
                                                        int64_t timeout_ms, int64_t now) {
  std::vector<std::pair<std::string, int64_t>> silent;
  for (const auto& [id, worker] : registry.all()) {
    if (!worker.alive()) continue;
    const int64_t silent_ms = now - worker.info.last_heartbeat_unix_ms();
    if (silent_ms > timeout_ms) silent.emplace_back(id, silent_ms);
  }
  return silent;
}

int ScanFreeSlots(const WorkerRegistry& registry, v1::DeviceKind device) {
  int free = 0;
  for (const auto& [id, worker] : registry.all()) {
    if (worker.alive() && worker.info.device() == device && !worker.awaiting_first_poll()) {
      free += worker.free_slots();
    }
  }
  return free;
}

int64_t ScanLargestSlotMemory(const WorkerRegistry& registry, v1::DeviceKind device) {
  int64_t largest = -1;
  for (const auto& [id, worker] : registry.all()) {
    if (!worker.alive() || worker.info.device() != device) continue;
    for (int slot = 0; slot < worker.info.slots(); ++slot) {
      const int64_t capacity = worker.SlotMemory(slot);
      largest = capacity == 0 ? std::numeric_limits<int64_t>::max() : std::max(largest, capacity);
    }
  }
  return largest;
}

// The slot counts PendingReason's first sentence is made of, counted by a walk.
std::string ScanSlotsSentence(const WorkerRegistry& registry, v1::DeviceKind device,
                              int world_size, int64_t rank_memory_bytes) {
  const std::string kind = absl::AsciiStrToLower(v1::DeviceKind_Name(device));
  int total = 0, free = 0, too_small = 0, workers = 0;
  for (const auto& [id, worker] : registry.all()) {
    if (!worker.alive() || worker.info.device() != device) continue;
    ++workers;
    for (int slot = 0; slot < worker.info.slots(); ++slot) {
      const int64_t capacity = worker.SlotMemory(slot);
      if (capacity != 0 && capacity < rank_memory_bytes) {
        ++too_small;
        continue;
      }
      ++total;
      if (!worker.busy_slots().count(slot)) ++free;
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
  return absl::StrCat("needs ", world_size, " free ", kind, " slots; ", free, " of ", total,
                      " are free", small);
}

TEST(WorkerRegistry, Register_AnswersSecretAndTimeouts) {
  WorkerRegistry registry(Options());
  auto response = registry.Register(Request("w"), "alice", false, 0);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->worker_id(), "w#1");
  EXPECT_FALSE(response->worker_secret().empty());
  EXPECT_EQ(response->heartbeat_timeout_ms(), 1'000);
  EXPECT_EQ(response->heartbeat_interval_ms(), 200);
}

// What a registration stores is bounded field by field, not only in number of workers.
TEST(WorkerRegistry, Register_LongNonceOrDeviceName_InvalidArgumentNamingTheField) {
  WorkerRegistry registry(Options());
  v1::RegisterWorkerRequest nonce = Request("w");
  nonce.set_registration_nonce(std::string(65, 'n'));
  auto refused = registry.Register(nonce, "alice", false, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("registration_nonce"), std::string::npos)
      << refused.status();
  v1::RegisterWorkerRequest device = Request("w");
  device.add_devices()->set_name(std::string(257, 'd'));
  refused = registry.Register(device, "alice", false, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("devices[].name"), std::string::npos)
      << refused.status();
  device.mutable_devices(0)->set_name("NVIDIA H200");
  EXPECT_TRUE(registry.Register(device, "alice", false, 0).ok());
}

// A CUDA worker of `devices` GPUs, indices 0..devices-1.
v1::Worker GpuWorker(int devices) {
  v1::Worker worker;
  worker.set_device(v1::CUDA);
  for (int i = 0; i < devices; ++i) {
    v1::DeviceInfo* device = worker.add_devices();
    device->set_index(i);
    device->set_memory_bytes(int64_t{80} << 30);
  }
  return worker;
}

// What a GPU worker sends: host memory, then each device read (80 GiB, 30 used, 75 % busy).
v1::WorkerUsage GpuUsage(int devices) {
  v1::WorkerUsage usage;
  usage.set_memory_available_bytes(int64_t{40} << 30);
  usage.set_memory_total_bytes(int64_t{64} << 30);
  for (int i = 0; i < devices; ++i) {
    v1::DeviceUsage* device = usage.add_devices();
    device->set_index(i);
    device->set_available(true);
    device->set_memory_used_bytes(int64_t{30} << 30);
    device->set_memory_total_bytes(int64_t{80} << 30);
    device->set_utilization_percent(75);
  }
  return usage;
}

TEST(ValidateWorkerUsage, WhatAWorkerSends_Passes) {
  EXPECT_TRUE(ValidateWorkerUsage(GpuUsage(8), 0, GpuWorker(8)).ok());
  EXPECT_TRUE(ValidateWorkerUsage(GpuUsage(0), kMaxUsageAgeMs, v1::Worker()).ok()) << "CPU";
  v1::WorkerUsage unread = GpuUsage(2);
  unread.mutable_devices(1)->Clear();
  unread.mutable_devices(1)->set_index(1);  // No NVML: unavailable, no figures.
  unread.set_memory_available_bytes(0);     // Host memory not read.
  unread.set_memory_total_bytes(0);
  EXPECT_TRUE(ValidateWorkerUsage(unread, 5, GpuWorker(2)).ok());
  v1::WorkerUsage full = GpuUsage(1);  // Every byte used, every cycle busy.
  full.mutable_devices(0)->set_memory_used_bytes(int64_t{80} << 30);
  full.mutable_devices(0)->set_utilization_percent(100);
  full.set_memory_available_bytes(full.memory_total_bytes());
  EXPECT_TRUE(ValidateWorkerUsage(full, 5, GpuWorker(1)).ok());
}

// Each hostile value is refused with INVALID_ARGUMENT naming its field and the bound.
TEST(ValidateWorkerUsage, HostileValues_InvalidArgumentNamingTheFieldAndTheBound) {
  struct Case {
    std::function<void(v1::WorkerUsage*, int64_t* age_ms)> spoil;
    const char* message;
  };
  const Case cases[] = {
      {[](v1::WorkerUsage*, int64_t* age) { *age = -1; }, "usage_age_ms must be in [0, 60000], got -1"},
      {[](v1::WorkerUsage*, int64_t* age) { *age = kMaxUsageAgeMs + 1; }, "usage_age_ms must be in [0, 60000]"},
      {[](v1::WorkerUsage* u, int64_t*) { u->set_memory_available_bytes(-5); },
       "usage.memory_available_bytes must be >= 0 (0: not read), got -5"},
      {[](v1::WorkerUsage* u, int64_t*) { u->set_memory_total_bytes(std::numeric_limits<int64_t>::min()); },
       "usage.memory_total_bytes must be >= 0"},
      {[](v1::WorkerUsage* u, int64_t*) { u->set_memory_available_bytes(u->memory_total_bytes() + 1); },
       "usage.memory_available_bytes must be <= usage.memory_total_bytes (68719476736)"},
      {[](v1::WorkerUsage* u, int64_t*) {
         for (int i = 0; i < 60; ++i) *u->add_devices() = u->devices(0);
       },
       "usage.devices may list at most 64 devices, got 68"},
      {[](v1::WorkerUsage* u, int64_t*) { u->mutable_devices(2)->set_index(8); },
       "usage.devices[2].index must be one of the 8 device(s) this worker registered, got 8"},
      {[](v1::WorkerUsage* u, int64_t*) { u->mutable_devices(3)->set_index(-1); },
       "usage.devices[3].index must be one of the 8 device(s) this worker registered, got -1"},
      {[](v1::WorkerUsage* u, int64_t*) { u->mutable_devices(5)->set_index(1); },
       "usage.devices[5].index 1 repeats usage.devices[1]'s"},
      {[](v1::WorkerUsage* u, int64_t*) { u->mutable_devices(0)->set_memory_used_bytes(-1); },
       "usage.devices[0].memory_used_bytes must be >= 0, got -1"},
      {[](v1::WorkerUsage* u, int64_t*) { u->mutable_devices(1)->set_memory_total_bytes(-7); },
       "usage.devices[1].memory_total_bytes must be >= 0, got -7"},
      {[](v1::WorkerUsage* u, int64_t*) {
         u->mutable_devices(4)->set_memory_used_bytes(std::numeric_limits<int64_t>::max());
       },
       "usage.devices[4].memory_used_bytes must be <= usage.devices[4].memory_total_bytes "
       "(85899345920), got 9223372036854775807"},
      {[](v1::WorkerUsage* u, int64_t*) { u->mutable_devices(6)->set_utilization_percent(101); },
       "usage.devices[6].utilization_percent must be in [0, 100], got 101"},
      {[](v1::WorkerUsage* u, int64_t*) { u->mutable_devices(7)->set_utilization_percent(-3); },
       "usage.devices[7].utilization_percent must be in [0, 100], got -3"},
      {[](v1::WorkerUsage* u, int64_t*) { u->mutable_devices(0)->set_available(false); },
       "usage.devices[0] is not available: its figures must be 0"},
  };
  for (const Case& c : cases) {
    v1::WorkerUsage usage = GpuUsage(8);
    int64_t age_ms = 100;
    c.spoil(&usage, &age_ms);
    absl::Status status = ValidateWorkerUsage(usage, age_ms, GpuWorker(8));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_TRUE(absl::StrContains(status.message(), c.message))
        << "expected: " << c.message << "\n     got: " << status.message();
  }
  // A CPU worker registered no device: any reading of one is refused.
  absl::Status cpu = ValidateWorkerUsage(GpuUsage(1), 0, v1::Worker());
  EXPECT_TRUE(absl::StrContains(cpu.message(), "usage.devices[0].index must be one of the 0"))
      << cpu;
}

// The latest usage replaces the last; a worker that is lost has none; a listing always holds a
// usage (zeros, time 0, until one came).
TEST(WorkerRegistry, RecordUsage_TheLatestReplacesTheLast_ALostWorkerHasNone) {
  WorkerRegistry registry(Options());
  v1::RegisterWorkerRequest request = Request("g");
  request.set_device(v1::CUDA);
  request.add_devices()->set_index(0);
  request.add_devices()->set_index(1);
  ASSERT_TRUE(registry.Register(request, "p", false, 0).ok());
  WorkerRecord* worker = registry.Find("g#1");
  ASSERT_EQ(registry.List().size(), 1u);
  EXPECT_TRUE(registry.List()[0].has_usage()) << "a listing without its usage";
  EXPECT_EQ(registry.List()[0].usage_unix_ms(), 0);

  registry.RecordUsage(worker, GpuUsage(2), 900);
  EXPECT_EQ(registry.List()[0].usage_unix_ms(), 900);
  EXPECT_EQ(registry.List()[0].usage().devices(1).utilization_percent(), 75);
  v1::WorkerUsage next = GpuUsage(1);
  next.mutable_devices(0)->set_utilization_percent(5);
  registry.RecordUsage(worker, next, 1'100);
  const v1::Worker listed = registry.List()[0];
  EXPECT_EQ(listed.usage_unix_ms(), 1'100);
  ASSERT_EQ(listed.usage().devices_size(), 1) << "the last reading's devices linger";
  EXPECT_EQ(listed.usage().devices(0).utilization_percent(), 5);

  registry.MarkLost(worker, kNothingCurrent, 2'000);
  EXPECT_EQ(registry.List()[0].usage_unix_ms(), 0);
  EXPECT_EQ(registry.List()[0].usage().devices_size(), 0) << "a lost worker shows old figures";
  registry.RecordUsage(worker, GpuUsage(2), 2'100);  // A late heartbeat's: not kept.
  EXPECT_EQ(registry.List()[0].usage_unix_ms(), 0);
}

TEST(WorkerRegistry, LiveName_IsRefused_ButRetryGetsTheSameAnswer) {
  WorkerRegistry registry(Options());
  auto first = registry.Register(Request("w"), "p", false, 0);
  ASSERT_TRUE(first.ok());
  auto retry = registry.Register(Request("w"), "p", false, 1);
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ(retry->worker_id(), first->worker_id());
  EXPECT_EQ(retry->worker_secret(), first->worker_secret());
  auto other = registry.Register(Request("w", /*incarnation=*/2), "p", false, 2);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(WorkerRegistry, LostWorkerRegisteringAgain_ReplacesItsLostEntry) {
  WorkerRegistry registry(Options());
  auto first = registry.Register(Request("w"), "p", false, 0);
  WorkerRecord* worker = registry.Find(first->worker_id());
  ASSERT_TRUE(registry.Occupy(worker, 0, BusySlot{"job-0001", 0, 1}));
  auto affected = registry.MarkLost(worker, kAllCurrent, 5);
  ASSERT_EQ(affected.size(), 1u);
  EXPECT_EQ(affected["job-0001"], std::vector<int>{0});
  ASSERT_EQ(registry.List().size(), 1u);
  EXPECT_EQ(registry.List()[0].state(), v1::LOST);
  auto again = registry.Register(Request("w", 2), "p", false, 10);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(registry.List().size(), 1u);
  EXPECT_EQ(registry.List()[0].worker_id(), again->worker_id());
  EXPECT_EQ(registry.List()[0].state(), v1::ALIVE);
}

TEST(WorkerRegistry, LostWorkers_ArePrunedByAgeAndCount) {
  WorkerRegistry registry(Options());
  for (const char* name : {"a", "b", "c"}) {
    auto response = registry.Register(Request(name), "p", false, 0);
    registry.MarkLost(registry.Find(response->worker_id()), kNothingCurrent, 0);
  }
  registry.PruneLost(1);  // Three lost, two kept: the oldest goes.
  EXPECT_EQ(registry.List().size(), 2u);
  EXPECT_EQ(registry.Find("a#1"), nullptr);
  registry.PruneLost(60'000);  // Not older than the retention yet.
  EXPECT_EQ(registry.List().size(), 2u);
  registry.PruneLost(60'001);
  EXPECT_TRUE(registry.List().empty());
}

TEST(WorkerRegistry, Silent_ListsWorkersPastTheTimeout) {
  WorkerRegistry registry(Options());
  registry.Register(Request("a"), "p", false, 0).IgnoreError();
  registry.Register(Request("b"), "p", false, 900).IgnoreError();
  auto silent = registry.Silent(1'500);
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0].first->name, "a");
  EXPECT_EQ(silent[0].second, 1'500);
}

TEST(WorkerRegistry, FindLive_ChecksSecretBeforeAnythingElse) {
  WorkerRegistry registry(Options());
  auto response = registry.Register(Request("w"), "p", false, 0);
  EXPECT_EQ(registry.FindLive("w#1", 99, "wrong").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry.FindLive("w#1", 99, response->worker_secret()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry.FindLive("w#1", 1, response->worker_secret()).ok());
  EXPECT_EQ(registry.FindLive("nobody", 1, "").status().code(), absl::StatusCode::kNotFound);
}

TEST(WorkerRegistry, DrainingSlot_FreesWhenItsRankIsGone) {
  WorkerRegistry registry(Options());
  registry.Register(Request("w"), "p", false, 0).IgnoreError();
  WorkerRecord* worker = registry.Find("w#1");
  ASSERT_TRUE(registry.Occupy(worker, 0, BusySlot{"job-0001", 0, 1}));
  ASSERT_TRUE(registry.Occupy(worker, 1, BusySlot{"job-0002", 0, 1}));
  const std::set<std::string> running = {AssignmentKey("job-0001", 0, 1)};
  // job-0002's rank is not running any more and its attempt is over: its slot frees.
  EXPECT_TRUE(registry.FreeDrainingSlots(worker, kNothingCurrent, &running, ""));
  EXPECT_EQ(worker->busy_slots().size(), 1u);
  // A current rank's slot never frees this way.
  EXPECT_FALSE(registry.FreeDrainingSlots(worker, kAllCurrent, nullptr,
                                          AssignmentKey("job-0001", 0, 1)));
  EXPECT_TRUE(registry.FreeDrainingSlots(worker, kNothingCurrent, nullptr,
                                         AssignmentKey("job-0001", 0, 1)));
  EXPECT_TRUE(worker->busy_slots().empty());
}

TEST(WorkerRegistry, Place_SkipsFullSlotsAndWorkersAwaitingTheirFirstPoll) {
  WorkerRegistry registry(Options());
  v1::RegisterWorkerRequest big = Request("big");
  big.set_memory_bytes(int64_t{8} << 30);  // 4 GiB a slot.
  registry.Register(big, "p", false, 0).IgnoreError();
  registry.Register(Request("fresh"), "p", /*awaiting_first_poll=*/true, 0).IgnoreError();
  ASSERT_TRUE(registry.Occupy(registry.Find("big#1"), 1, BusySlot{"job-0001", 0, 1}));
  // Only big#1's free slot 0 may take a rank: "fresh" has not polled yet.
  auto placed = registry.Place(v1::CPU, 1, int64_t{1} << 30, {});
  ASSERT_TRUE(placed.has_value());
  ASSERT_EQ(placed->size(), 1u);
  EXPECT_EQ((*placed)[0].worker_id, "big#1");
  EXPECT_EQ((*placed)[0].slot, 0);
  EXPECT_FALSE(registry.Place(v1::CPU, 2, int64_t{1} << 30, {}).has_value());
  EXPECT_FALSE(registry.Place(v1::CPU, 1, int64_t{5} << 30, {}).has_value());  // Too small.
  EXPECT_EQ(registry.FreeSlots(v1::CPU), 1);
  registry.FirstPollDone(registry.Find("fresh#2"));
  EXPECT_EQ(registry.FreeSlots(v1::CPU), 3);
  placed = registry.Place(v1::CPU, 2, int64_t{1} << 30, {});
  ASSERT_TRUE(placed.has_value());
  EXPECT_EQ((*placed)[0].worker_id, "fresh#2");  // The most free slots first.
  EXPECT_TRUE(registry.CheckIndexes().ok()) << registry.CheckIndexes();
  EXPECT_EQ(registry.PendingReason(v1::CPU, 5, int64_t{1} << 30), "needs 5 cpu slots; 4 exist");
  EXPECT_EQ(registry.PendingReason(v1::CPU, 4, int64_t{1} << 30),
            "needs 4 free cpu slots; 3 of 4 are free");
  EXPECT_EQ(registry.PendingReason(v1::CUDA, 1, 0), "no live cuda worker");
}

TEST(WorkerRegistry, Register_RefusesMalformedMachineIdAndNegativeMemory) {
  WorkerRegistry registry(Options());
  v1::RegisterWorkerRequest request = Request("w");
  request.set_machine_id(std::string(65, 'a'));
  auto refused = registry.Register(request, "p", false, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("machine_id must be at most 64"), std::string::npos)
      << refused.status();
  request.set_machine_id("worker/x");  // Another worker's own machine.
  EXPECT_EQ(registry.Register(request, "p", false, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  request.set_machine_id("m1");
  request.set_memory_bytes(-1);
  EXPECT_EQ(registry.Register(request, "p", false, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  request.set_memory_bytes(1 << 30);
  ASSERT_TRUE(registry.Register(request, "p", false, 0).ok());
  EXPECT_EQ(registry.List()[0].machine_id(), "m1");
}

// Two CPU workers of one machine each advertise the whole machine: its memory is counted once.
TEST(WorkerRegistry, CoLocatedWorkers_ShareOneMachineMemory) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  WorkerRegistry registry(Options());
  for (const char* name : {"a", "b"}) {
    v1::RegisterWorkerRequest request = Request(name);
    request.set_slots(1);
    request.set_machine_id("m1");
    request.set_memory_bytes(23 * kGiB);
    ASSERT_TRUE(registry.Register(request, "p", false, 0).ok());
  }
  v1::RegisterWorkerRequest alone = Request("c");
  alone.set_slots(1);
  alone.set_memory_bytes(4 * kGiB);  // No machine id: a machine of its own.
  ASSERT_TRUE(registry.Register(alone, "p", false, 0).ok());

  const std::map<std::string, MachineUse> machines = registry.CpuMachines();
  EXPECT_EQ(machines.size(), ScanCpuMachines(registry).size());
  ASSERT_EQ(machines.size(), 2u);
  EXPECT_EQ(machines.at("m1").capacity_bytes, 23 * kGiB);
  EXPECT_EQ(machines.at("m1").worker_ids, (std::vector<std::string>{"a#1", "b#2"}));
  EXPECT_EQ(machines.at("worker/c#3").capacity_bytes, 4 * kGiB);

  ASSERT_TRUE(registry.Occupy(registry.Find("a#1"), 0, BusySlot{"job-0001", 0, 1, 18 * kGiB}));
  EXPECT_EQ(registry.CpuMachines().at("m1").free_bytes(), 5 * kGiB);
  // b's slot is free and big enough, but its machine holds 5 GiB more.
  EXPECT_FALSE(registry.Place(v1::CPU, 1, 18 * kGiB, {}).has_value());
  EXPECT_EQ(registry.PendingReason(v1::CPU, 1, 18 * kGiB),
            "needs 1 cpu ranks of 18.0 GiB each; the free memory of their machines holds 0: "
            "machine m1 (a#1, b#2) has 5.0 GiB free of 23.0 GiB, room for 0 (1 more have less "
            "than the 18.0 GiB a rank needs)");
  // Small ranks still fit beside it.
  EXPECT_TRUE(registry.Place(v1::CPU, 2, 2 * kGiB, {}).has_value());
}

// The indexes answer what the walks of every record answered, after any sequence of
// registrations, heartbeats, expiries, placements, exits and drains: random sequences on
// CPU workers sharing machines and GPU workers whose devices differ in memory (so that the
// placement order by fitting slots differs from the index's order by free slots).
TEST(WorkerRegistry, Indexes_AgreeWithWalksOfEveryRecord_OnRandomSequences) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  const std::vector<int64_t> kMemories = {0, 2 * kGiB, 8 * kGiB, 16 * kGiB, 80 * kGiB};
  const std::vector<int64_t> kRankMemories = {0, kGiB, 3 * kGiB, 8 * kGiB, 20 * kGiB};
  int placements = 0, placed = 0, expired = 0;
  for (uint32_t seed = 1; seed <= 150; ++seed) {
    std::mt19937 random(seed);
    auto pick = [&](int n) { return static_cast<int>(random() % static_cast<uint32_t>(n)); };
    WorkerRegistry::Options options = Options();
    options.max_lost_workers = 8;
    options.max_live_workers = 12 + pick(12);
    WorkerRegistry registry(options);
    int64_t now = 0;
    uint64_t incarnation = 1;
    int jobs = 0;
    std::map<std::string, bool> current_jobs;  // Job id -> its attempt is current.
    auto is_current = [&](const BusySlot& slot) { return current_jobs[slot.job_id]; };
    auto random_worker = [&](bool live_only) -> WorkerRecord* {
      std::vector<WorkerRecord*> all;
      for (auto& [id, worker] : registry.all()) {
        if (!live_only || worker.alive()) all.push_back(&worker);
      }
      return all.empty() ? nullptr : all[pick(static_cast<int>(all.size()))];
    };
    for (int step = 0; step < 300; ++step) {
      SCOPED_TRACE(absl::StrCat("seed ", seed, " step ", step));
      now += pick(400);
      const int op = pick(10);
      if (op <= 1) {  // A registration.
        v1::RegisterWorkerRequest request = Request(absl::StrCat("w", pick(30)), ++incarnation);
        request.set_slots(1 + pick(4));
        if (pick(3) == 0) {
          request.set_device(v1::CUDA);
          const int devices = pick(request.slots() + 1);
          for (int d = 0; d < devices; ++d) {
            v1::DeviceInfo* device = request.add_devices();
            device->set_index(pick(request.slots()));
            device->set_memory_bytes(kMemories[pick(static_cast<int>(kMemories.size()))]);
          }
        } else {
          request.set_memory_bytes(kMemories[pick(static_cast<int>(kMemories.size()))] * 2);
          if (pick(2) == 0) request.set_machine_id(absl::StrCat("m", pick(4)));
        }
        registry.Register(request, "p", /*awaiting_first_poll=*/pick(4) == 0, now).IgnoreError();
      } else if (op == 2) {  // A heartbeat, a poll or an exit report.
        if (WorkerRecord* worker = random_worker(true)) registry.Touch(worker, now);
        if (WorkerRecord* worker = random_worker(true)) {
          if (worker->awaiting_first_poll()) registry.FirstPollDone(worker);
        }
      } else if (op == 3) {  // The liveness tick.
        now += pick(3) == 0 ? 1'500 : 0;
        const auto expected = ScanSilent(registry, options.heartbeat_timeout_ms, now);
        const auto silent = registry.Silent(now);
        ASSERT_EQ(silent.size(), expected.size());
        for (size_t i = 0; i < silent.size(); ++i) {
          EXPECT_EQ(silent[i].first->info.worker_id(), expected[i].first);
          EXPECT_EQ(silent[i].second, expected[i].second);
        }
        for (const auto& [worker, silent_ms] : silent) {
          registry.MarkLost(worker, is_current, now);
          ++expired;
        }
        registry.PruneLost(now);
      } else if (op <= 6) {  // A placement, taken as TrySchedule takes it.
        const v1::DeviceKind device = pick(3) == 0 ? v1::CUDA : v1::CPU;
        const int world_size = 1 + pick(6);
        const int64_t memory = kRankMemories[pick(static_cast<int>(kRankMemories.size()))];
        std::set<std::string> rank0;
        if (pick(4) == 0) rank0 = registry.IdsOfName(absl::StrCat("w", pick(30)));
        const auto expected = ScanPlace(registry, device, world_size, memory, rank0);
        const auto got = registry.Place(device, world_size, memory, rank0);
        ++placements;
        ASSERT_EQ(got.has_value(), expected.has_value());
        if (got) {
          ++placed;
          ASSERT_EQ(got->size(), expected->size());
          const std::string job = absl::StrCat("job-", ++jobs);
          current_jobs[job] = true;
          for (size_t r = 0; r < got->size(); ++r) {
            EXPECT_EQ((*got)[r].worker_id, (*expected)[r].worker_id) << "rank " << r;
            EXPECT_EQ((*got)[r].slot, (*expected)[r].slot) << "rank " << r;
            ASSERT_TRUE(registry.Occupy(registry.Find((*got)[r].worker_id), (*got)[r].slot,
                                        BusySlot{job, static_cast<int>(r), 1, memory}));
          }
        }
      } else if (op == 7) {  // A job ends: its exited ranks' slots free, the others drain.
        if (jobs > 0) {
          const std::string job = absl::StrCat("job-", 1 + pick(jobs));
          current_jobs[job] = false;
          const int parity = pick(2);
          registry.ReleaseExited(job, 1, [&](int rank) { return rank % 2 == parity; });
        }
      } else if (op == 8) {  // A poll lists what still runs.
        if (WorkerRecord* worker = random_worker(true)) {
          std::set<std::string> running;
          for (const auto& [slot, busy] : worker->busy_slots()) {
            if (pick(2)) running.insert(AssignmentKey(busy.job_id, busy.rank, busy.attempt));
          }
          registry.FreeDrainingSlots(worker, is_current, &running, "");
        }
      } else {  // A daemon leaves.
        if (WorkerRecord* worker = random_worker(true)) registry.MarkLost(worker, is_current, now);
      }
      ASSERT_TRUE(registry.CheckIndexes().ok()) << registry.CheckIndexes();
      for (v1::DeviceKind device : {v1::CPU, v1::CUDA}) {
        EXPECT_EQ(registry.FreeSlots(device), ScanFreeSlots(registry, device));
        EXPECT_EQ(registry.LargestSlotMemory(device), ScanLargestSlotMemory(registry, device));
        const int world_size = 1 + pick(6);
        const int64_t memory = kRankMemories[pick(static_cast<int>(kRankMemories.size()))];
        const std::string sentence = ScanSlotsSentence(registry, device, world_size, memory);
        const std::string reason = registry.PendingReason(device, world_size, memory);
        // The rest (machines' memory, refusals) is made of CpuMachines, compared below.
        if (!absl::StrContains(reason, "the free memory of their machines")) {
          EXPECT_EQ(reason.substr(0, sentence.size()), sentence);
        }
      }
      const auto machines = registry.CpuMachines();
      const auto expected_machines = ScanCpuMachines(registry);
      ASSERT_EQ(machines.size(), expected_machines.size());
      for (const auto& [id, machine] : expected_machines) {
        ASSERT_TRUE(machines.count(id)) << id;
        EXPECT_EQ(machines.at(id).capacity_bytes, machine.capacity_bytes) << id;
        EXPECT_EQ(machines.at(id).used_bytes, machine.used_bytes) << id;
        EXPECT_EQ(machines.at(id).worker_ids, machine.worker_ids) << id;
      }
    }
  }
  // The sequences reached what they are meant to compare.
  EXPECT_GT(placed, 1'000);
  EXPECT_GT(placements - placed, 1'000);
  EXPECT_GT(expired, 100);
}

}  // namespace
}  // namespace mptrain
