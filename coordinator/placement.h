#pragma once

// Placement of a job's ranks on free worker slots: a pure function, so that the scheduling
// policy is tested without a coordinator.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace mptrain {

struct WorkerSlots {
  std::string worker_id;
  std::vector<int> free_slots;  // Slot index == device index on that worker.
  // The machine whose memory its ranks share with the ranks of its co-located workers (see
  // MachineMemory); "" or a machine not listed there: no shared bound.
  std::string machine_id;
};

// What the job's ranks may still take of each machine's memory: co-located workers each see
// the whole machine, so a rank placed on one of them leaves less for the others.
struct MachineMemory {
  int64_t rank_memory_bytes = 0;  // What one rank of the job takes.
  std::map<std::string, int64_t> free_bytes;  // Machine id -> memory not taken by ranks yet.
};

struct RankSlot {
  int rank = 0;
  std::string worker_id;
  int slot = 0;
};

// Places `world_size` ranks, or returns nullopt when fewer slots are free (or fit in their
// machines' free memory). Workers with the most free slots are used first (ties keep the given
// order), so that a job spans as few workers as possible; consecutive ranks share a worker and
// its slots are taken in increasing order, as long as its machine's memory holds another rank.
// `rank0_workers`, when not empty, are the only workers rank 0 may go to (those that hold the
// checkpoint a restart resumes from); of them, the one with the most free slots (and room for
// a rank) takes rank 0 and the ranks after it.
std::optional<std::vector<RankSlot>> PlaceRanks(int world_size,
                                                const std::vector<WorkerSlots>& workers,
                                                const std::set<std::string>& rank0_workers = {},
                                                const MachineMemory& memory = {});

}  // namespace mptrain
