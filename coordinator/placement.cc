#include "coordinator/placement.h"

#include <algorithm>

namespace mptrain {

std::optional<std::vector<RankSlot>> PlaceRanks(int world_size,
                                                const std::vector<WorkerSlots>& workers,
                                                const std::set<std::string>& rank0_workers,
                                                const MachineMemory& memory) {
  size_t free_total = 0;
  for (const WorkerSlots& worker : workers) free_total += worker.free_slots.size();
  if (world_size <= 0 || free_total < static_cast<size_t>(world_size)) return std::nullopt;

  std::map<std::string, int64_t> machine_free = memory.free_bytes;  // Taken from as ranks go.
  auto room_for_rank = [&](const WorkerSlots& worker) {
    auto machine = machine_free.find(worker.machine_id);
    return machine == machine_free.end() || machine->second >= memory.rank_memory_bytes;
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

  std::vector<RankSlot> placement;
  for (const WorkerSlots* worker : order) {
    std::vector<int> slots = worker->free_slots;
    std::sort(slots.begin(), slots.end());
    for (int slot : slots) {
      if (static_cast<int>(placement.size()) == world_size) return placement;
      if (!room_for_rank(*worker)) break;
      auto machine = machine_free.find(worker->machine_id);
      if (machine != machine_free.end()) machine->second -= memory.rank_memory_bytes;
      placement.push_back({static_cast<int>(placement.size()), worker->worker_id, slot});
    }
  }
  if (static_cast<int>(placement.size()) < world_size) return std::nullopt;
  return placement;
}

}  // namespace mptrain
