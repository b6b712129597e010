#include "coordinator/worker_registry.h"

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
  worker->busy_slots[0] = BusySlot{"job-0001", 0, 1};
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
  worker->busy_slots[0] = BusySlot{"job-0001", 0, 1};
  worker->busy_slots[1] = BusySlot{"job-0002", 0, 1};
  const std::set<std::string> running = {AssignmentKey("job-0001", 0, 1)};
  // job-0002's rank is not running any more and its attempt is over: its slot frees.
  EXPECT_TRUE(registry.FreeDrainingSlots(worker, kNothingCurrent, &running, ""));
  EXPECT_EQ(worker->busy_slots.size(), 1u);
  // A current rank's slot never frees this way.
  EXPECT_FALSE(registry.FreeDrainingSlots(worker, kAllCurrent, nullptr,
                                          AssignmentKey("job-0001", 0, 1)));
  EXPECT_TRUE(registry.FreeDrainingSlots(worker, kNothingCurrent, nullptr,
                                         AssignmentKey("job-0001", 0, 1)));
  EXPECT_TRUE(worker->busy_slots.empty());
}

TEST(WorkerRegistry, Candidates_SkipFullSlotsAndWorkersAwaitingTheirFirstPoll) {
  WorkerRegistry registry(Options());
  v1::RegisterWorkerRequest big = Request("big");
  big.set_memory_bytes(int64_t{8} << 30);  // 4 GiB a slot.
  registry.Register(big, "p", false, 0).IgnoreError();
  registry.Register(Request("fresh"), "p", /*awaiting_first_poll=*/true, 0).IgnoreError();
  registry.Find("big#1")->busy_slots[1] = BusySlot{"job-0001", 0, 1};
  auto candidates = registry.Candidates(v1::CPU, int64_t{1} << 30);
  ASSERT_EQ(candidates.size(), 1u);
  EXPECT_EQ(candidates[0].worker_id, "big#1");
  EXPECT_EQ(candidates[0].free_slots, std::vector<int>{0});
  EXPECT_TRUE(registry.Candidates(v1::CPU, int64_t{5} << 30)[0].free_slots.empty());
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
  ASSERT_EQ(machines.size(), 2u);
  EXPECT_EQ(machines.at("m1").capacity_bytes, 23 * kGiB);
  EXPECT_EQ(machines.at("m1").worker_ids, (std::vector<std::string>{"a#1", "b#2"}));
  EXPECT_EQ(machines.at("worker/c#3").capacity_bytes, 4 * kGiB);

  registry.Find("a#1")->busy_slots[0] = BusySlot{"job-0001", 0, 1, 18 * kGiB};
  const MachineMemory memory = registry.FreeMachineMemory(v1::CPU, 18 * kGiB);
  EXPECT_EQ(memory.free_bytes.at("m1"), 5 * kGiB);
  EXPECT_TRUE(registry.FreeMachineMemory(v1::CUDA, 18 * kGiB).free_bytes.empty());
  // b's slot is free and big enough, but its machine holds 5 GiB more.
  EXPECT_FALSE(PlaceRanks(1, registry.Candidates(v1::CPU, 18 * kGiB), {}, memory).has_value());
  EXPECT_EQ(registry.PendingReason(v1::CPU, 1, 18 * kGiB),
            "needs 1 cpu ranks of 18.0 GiB each; the free memory of their machines holds 0: "
            "machine m1 (a#1, b#2) has 5.0 GiB free of 23.0 GiB, room for 0 (1 more have less "
            "than the 18.0 GiB a rank needs)");
  // Small ranks still fit beside it.
  EXPECT_TRUE(PlaceRanks(2, registry.Candidates(v1::CPU, 2 * kGiB), {},
                         registry.FreeMachineMemory(v1::CPU, 2 * kGiB))
                  .has_value());
}

}  // namespace
}  // namespace mptrain
