#pragma once

// What a worker checks of an assignment its coordinator hands it before starting a rank: the
// coordinator is trusted to place ranks, but a corrupt or impersonating one must not make the
// daemon write outside its work directory or run more ranks than it has slots.

#include <vector>

#include "absl/status/status.h"
#include "proto/mptrain.pb.h"

namespace mptrain {

// OK: start it. ALREADY_EXISTS: that rank of that attempt runs here already (a repeated start:
// ignore it). INVALID_ARGUMENT: a job id outside [A-Za-z0-9_-]{1,64} (it names files), a device
// index outside [0, slots), or a slot a running rank holds (refuse: the rank fails to start).
absl::Status CheckStart(const v1::Assignment& start, int slots,
                        const std::vector<const v1::Assignment*>& running);

}  // namespace mptrain
