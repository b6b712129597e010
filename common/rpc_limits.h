#pragma once

// Limits of the worker and rank RPCs that both sides must know: the coordinator refuses past
// them (INVALID_ARGUMENT naming the limit), the worker and the ranks send within them.

#include <cstddef>

namespace mptrain {

// Telemetry records in one ReportTelemetry (a rank keeps at most this many while the
// coordinator cannot be reached, and sends them in reports of at most this many).
inline constexpr int kMaxTelemetryRecordsPerReport = 10'000;

// RegisterWorker: the worker's nonce (it sends 16 random bytes, hex) and each device name.
inline constexpr size_t kMaxRegistrationNonceBytes = 64;
inline constexpr size_t kMaxDeviceNameBytes = 256;

}  // namespace mptrain
