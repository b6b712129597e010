#include "coordinator/placement.h"

#include <algorithm>

namespace mptrain {

std::optional<std::vector<RankSlot>> PlaceRanksInOrder(
    int world_size, const std::function<const WorkerSlots*()>& next, int64_t rank_memory_bytes,
    const std::function<std::optional<int64_t>(const std::string& machine_id)>&
        machine_free_bytes) {
  if (world_size <= 0) return std::nullopt;
  // What each machine met so far still holds, taken from as ranks go (absent: no bound).
  std::map<std::string, std::optional<int64_t>> machine_free;
  auto room_of = [&](const WorkerSlots& worker) -> std::optional<int64_t>& {
    auto it = machine_free.find(worker.machine_id);
    if (it == machine_free.end()) {
      it = machine_free.emplace(worker.machine_id, machine_free_bytes(worker.machine_id)).first;
    }
    return it->second;
  };
  std::vector<RankSlot> placement;
  while (static_cast<int>(placement.size()) < world_size) {
    const WorkerSlots* worker = next();
    if (worker == nullptr) return std::nullopt;
    std::vector<int> slots = worker->free_slots;
    std::sort(slots.begin(), slots.end());
    for (int slot : slots) {
      if (static_cast<int>(placement.size()) == world_size) break;
      std::optional<int64_t>& room = room_of(*worker);
      if (room && *room < rank_memory_bytes) break;
      if (room) *room -= rank_memory_bytes;
      placement.push_back({static_cast<int>(placement.size()), worker->worker_id, slot});
    }
  }
  return placement;
}

std::optional<std::vector<RankSlot>> PlaceRanks(int world_size,
                                                const std::vector<WorkerSlots>& workers,
                                                const std::set<std::string>& rank0_workers,
                                                const MachineMemory& memory) {
  size_t free_total = 0;
  for (const WorkerSlots& worker : workers) free_total += worker.free_slots.size();
  if (world_size <= 0 || free_total < static_cast<size_t>(world_size)) return std::nullopt;

  auto machine_free_bytes = [&](const std::string& machine_id) -> std::optional<int64_t> {
    auto machine = memory.free_bytes.find(machine_id);
    if (machine == memory.free_bytes.end()) return std::nullopt;
    return machine->second;
  };
  auto room_for_rank = [&](const WorkerSlots& worker) {
    std::optional<int64_t> room = machine_free_bytes(worker.machine_id);
    return !room || *room >= memory.rank_memory_bytes;
  };

  std::vector<const WorkerSlots*> order;
  for (const WorkerSlots& worker : workers) order.push_back(&worker);
  std::stable_sort(order.begin(), order.end(), [](const WorkerSlots* a, const WorkerSlots* b) {
    return a->free_slots.size() > b->free_slots.size();
  });
  if (!rank0_workers.empty()) {
    auto first = std::find_if(order.begin(), order.end(), [&](const WorkerSlots* worker) {
      return !worker->free_slots.empty() && rank0_workers.count(worker->worker_id) > 0 &&
             room_for_rank(*worker);
    });
    if (first == order.end()) return std::nullopt;
    std::rotate(order.begin(), first, first + 1);  // It goes first; the others keep their order.
  }
  size_t next = 0;
  return PlaceRanksInOrder(
      world_size, [&]() { return next < order.size() ? order[next++] : nullptr; },
      memory.rank_memory_bytes, machine_free_bytes);
}

}  // namespace mptrain
