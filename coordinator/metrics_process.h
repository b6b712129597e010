#pragma once

// The process_* metrics every Prometheus client library exports, for the coordinator itself:
// CPU seconds, resident and virtual memory, open and maximum file descriptors, start time.
// Read from getrusage/getrlimit and /proc/self (statm, fd) only, which the systemd unit's
// ProcSubset=pid and ProtectProc=invisible leave visible.

#include "coordinator/prometheus_text.h"

namespace mptrain {

// Appends the families; one that cannot be read (no /proc) is left out, not reported as 0.
void AppendProcessMetrics(PrometheusText& text);

}  // namespace mptrain
