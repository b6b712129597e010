#pragma once
// Striping the gradient allreduce over several communicators ("lanes"). Between nodes NCCL's
// socket transport moves a bucket through one proxy thread and, by default, one socket per
// peer, which leaves most of a link idle; several communicators, each with its own proxy thread,
// sockets and stream, carry the slices of one bucket side by side. Within a node (NVLink, PCIe,
// shared memory) one communicator already saturates the link, so one lane is the default there.
//
// The decision is pure and made by rank 0 alone (the others read it with the unique ids), so
// every rank stripes the same way.

#include <cstdint>
#include <string>
#include <vector>

namespace mptrain {

inline constexpr int kMaxLanes = 8;
// Lanes when the ranks span nodes and the job did not say (JobSpec.grad_comm_lanes = 0).
inline constexpr int kCrossNodeLanes = 4;

// This machine's node identity as NCCL defines it: NCCL_HOSTID when set (how two GPUs of one
// machine are made to act as two nodes), else the host name.
std::string LocalNodeId();

// `requested` (1..kMaxLanes) when > 0; else 1 when every rank's node id is the same and
// kCrossNodeLanes when they differ.
int ResolveLanes(int requested, const std::vector<std::string>& node_ids);

struct Stripe {
  int64_t offset = 0;  // In elements.
  int64_t count = 0;
};

// Contiguous slices of a buffer of `count` elements, at most `lanes` of them: as many as keep
// each slice at least `min_slice` elements (a small bucket goes whole on one lane, where
// splitting would only add launches), every boundary a multiple of `align` elements. Empty for
// count 0; otherwise the slices cover [0, count) exactly, in order.
std::vector<Stripe> PlanStripes(int64_t count, int lanes, int64_t min_slice, int64_t align);

}  // namespace mptrain
