#pragma once

// Placement of a job's ranks on free worker slots: a pure function, so that the scheduling
// policy is tested without a coordinator.

#include <optional>
#include <set>
#include <string>
#include <vector>

namespace mptrain {

struct WorkerSlots {
  std::string worker_id;
  std::vector<int> free_slots;  // Slot index == device index on that worker.
};

struct RankSlot {
  int rank = 0;
  std::string worker_id;
  int slot = 0;
};

// Places `world_size` ranks, or returns nullopt when fewer slots are free. Workers with the most
// free slots are used first (ties keep the given order), so that a job spans as few workers as
// possible; consecutive ranks share a worker and its slots are taken in increasing order.
// `rank0_workers`, when not empty, are the only workers rank 0 may go to (those that hold the
// checkpoint a restart resumes from); of them, the one with the most free slots takes rank 0
// and the ranks after it.
std::optional<std::vector<RankSlot>> PlaceRanks(int world_size,
                                                const std::vector<WorkerSlots>& workers,
                                                const std::set<std::string>& rank0_workers = {});

}  // namespace mptrain
