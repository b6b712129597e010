#include "comm/lane_plan.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>

namespace mptrain {

std::string LocalNodeId() {
  if (const char* host_id = std::getenv("NCCL_HOSTID"); host_id != nullptr && *host_id != '\0') {
    return std::string("hostid:") + host_id;
  }
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "unknown-host";
  return name;
}

int ResolveLanes(int requested, const std::vector<std::string>& node_ids) {
  if (requested > 0) return std::min(requested, kMaxLanes);
  for (const std::string& id : node_ids) {
    if (id != node_ids.front()) return kCrossNodeLanes;
  }
  return 1;
}

std::vector<Stripe> PlanStripes(int64_t count, int lanes, int64_t min_slice, int64_t align) {
  std::vector<Stripe> stripes;
  if (count <= 0) return stripes;
  align = std::max<int64_t>(align, 1);
  min_slice = std::max<int64_t>(min_slice, 1);
  const int64_t fits = std::max<int64_t>(count / min_slice, 1);
  const int64_t slices = std::clamp<int64_t>(fits, 1, std::max(lanes, 1));
  // Equal shares rounded up to the alignment; the last slice takes what remains.
  const int64_t share = ((count + slices - 1) / slices + align - 1) / align * align;
  for (int64_t offset = 0; offset < count; offset += share) {
    stripes.push_back({offset, std::min(share, count - offset)});
  }
  return stripes;
}

}  // namespace mptrain
