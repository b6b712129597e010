#pragma once

// How long a worker daemon waits before asking to register again. A coordinator full of live
// workers (RESOURCE_EXHAUSTED) says how long to wait at least; refusals in a row double it, up
// to a cap, and each wait is drawn at random above it so that thousands of refused daemons do
// not come back in step. Other failures (no coordinator yet, a deadline) retry quickly.
// A pure function: the caller owns the random number.

#include <cstdint>

namespace mptrain {

struct RegisterBackoff {
  static constexpr int64_t kFirstRetryMs = 200;    // After a failure that is no refusal.
  static constexpr int64_t kMaxRetryMs = 2'000;    // Of those.
  static constexpr int64_t kMaxRefusedBaseMs = 40'000;  // A refusal's base, doubled up to it.
  static constexpr int64_t kMaxRefusedWaitMs = 60'000;  // Base + jitter of up to a half.

  int64_t base_ms = 0;  // 0: no refusal yet in this run of retries.
  int64_t retry_ms = kFirstRetryMs;

  // The wait after a refusal that asked for `retry_after_ms`; `unit` in [0, 1) draws the
  // jitter. At least retry_after_ms (capped), at most kMaxRefusedWaitMs.
  int64_t AfterRefusal(int64_t retry_after_ms, double unit);
  // The wait after any other failure: kFirstRetryMs, doubled up to kMaxRetryMs.
  int64_t AfterFailure();
};

}  // namespace mptrain
