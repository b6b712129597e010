#pragma once

// Placement of a job's ranks on free worker slots: a pure function, so that the scheduling
// policy is tested without a coordinator.

#include <cstdint>
#include <functional>
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

// PlaceRanks once the order is known, for callers that keep their workers in that order (the
// coordinator's registry): `next` hands out the workers one at a time in placement order, the
// one taking rank 0 first (null after the last), and is not called again once the job is
// placed; `machine_free_bytes` says what a machine's memory still holds (nullopt: no bound).
// PlaceRanks is this over its sorted list.
std::optional<std::vector<RankSlot>> PlaceRanksInOrder(
    int world_size, const std::function<const WorkerSlots*()>& next, int64_t rank_memory_bytes,
    const std::function<std::optional<int64_t>(const std::string& machine_id)>&
        machine_free_bytes);

}  // namespace mptrain
