#pragma once

// What a worker checks of an assignment its coordinator hands it before starting a rank: the
// coordinator is trusted to place ranks, but a corrupt or impersonating one must not make the
// daemon write outside its work directory or run more ranks than it has slots.

#include <vector>

#include "absl/status/status.h"
#include "proto/mptrain.pb.h"

namespace mptrain {

// OK: start it. ALREADY_EXISTS: that rank of that attempt runs here already (a repeated start:
// ignore it). UNAVAILABLE: its slot is still held by another rank (one being stopped, e.g. a
// rank a restarted coordinator did not adopt, asked to stop in the same answer): not now — the
// coordinator asks again with its next poll answer, as long as this worker does not list the
// rank as running. INVALID_ARGUMENT: a job id outside [A-Za-z0-9_-]{1,64} (it names files) or a
// device index outside [0, slots) (refuse: the rank fails to start).
absl::Status CheckStart(const v1::Assignment& start, int slots,
                        const std::vector<const v1::Assignment*>& running);

}  // namespace mptrain
