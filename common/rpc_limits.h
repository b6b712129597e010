#pragma once

// What both sides of the coordinator's RPCs must agree on: limits the coordinator refuses past
// (INVALID_ARGUMENT naming the limit) and the worker and the ranks send within, and keepalive.

#include <cstddef>
#include <cstdint>

namespace mptrain {

// Telemetry records in one ReportTelemetry (a rank keeps at most this many while the
// coordinator cannot be reached, and sends them in reports of at most this many).
inline constexpr int kMaxTelemetryRecordsPerReport = 10'000;

// Notes (warnings, samples: RankNote) in one ReportTelemetry, the bytes of one note's text (the
// coordinator cuts a longer one), and the notes one attempt of a job keeps in its events (the
// coordinator drops further ones, saying so once).
inline constexpr int kMaxNotesPerReport = 16;
inline constexpr size_t kMaxNoteBytes = 4096;
inline constexpr int kMaxNotesPerAttempt = 256;

// RegisterWorker: the worker's nonce (it sends 16 random bytes, hex) and each device name.
inline constexpr size_t kMaxRegistrationNonceBytes = 64;
inline constexpr size_t kMaxDeviceNameBytes = 256;
inline constexpr size_t kMaxMachineIdBytes = 64;

// Heartbeat usage (WorkerUsage): device readings in one heartbeat (a worker with more devices
// reports its first ones), and how old a reading may be when it is sent (an older one is not
// sent: the coordinator keeps the last it had, with the time it was read).
inline constexpr int kMaxUsageDevices = 64;
inline constexpr int64_t kMaxUsageAgeMs = 60'000;

// Keepalive: clients ping a connection with open calls this often (and give it up when a ping
// is not answered in 10 s); the coordinator accepts pings at most this often (more often is
// gRPC's "too many pings", which closes the connection).
inline constexpr int kClientKeepaliveMs = 20'000;
inline constexpr int kServerMinPingIntervalMs = 10'000;

}  // namespace mptrain
