#pragma once

// A range of TCP ports for the collectives' listening sockets (worker --port_range LO-HI), so
// that a firewall can admit exactly those between the workers.

#include <string>

#include "absl/status/statusor.h"

namespace mptrain {

struct PortRange {
  int lo = 0;  // 0: no range (the kernel picks an ephemeral port).
  int hi = 0;

  bool empty() const { return lo == 0; }
  int size() const { return empty() ? 0 : hi - lo + 1; }
  bool Contains(int port) const { return !empty() && port >= lo && port <= hi; }
  std::string ToString() const;  // "LO-HI"
};

// The environment variable that carries the worker's --port_range to its ranks' gloo
// collective (backends/cpu/gloo_collective.h), "LO-HI".
inline constexpr char kGlooPortRangeVariable[] = "MPTRAIN_GLOO_PORT_RANGE";

inline constexpr int kMinRangePort = 1024;  // Below: privileged ports.
inline constexpr int kMaxRangePort = 65535;

// "LO-HI" (decimal, LO <= HI, both in [1024, 65535]); "PORT" alone is the range PORT-PORT.
// INVALID_ARGUMENT naming `what` (the flag or variable it came from) and saying what is wrong.
absl::StatusOr<PortRange> ParsePortRange(const std::string& text, const std::string& what);

}  // namespace mptrain
