#include "worker/register_backoff.h"

#include <algorithm>

namespace mptrain {

int64_t RegisterBackoff::AfterRefusal(int64_t retry_after_ms, double unit) {
  const int64_t asked = std::clamp<int64_t>(retry_after_ms, 0, kMaxRefusedBaseMs);
  base_ms = std::min(kMaxRefusedBaseMs, std::max(asked, base_ms * 2));
  if (base_ms == 0) base_ms = kMaxRetryMs;  // A refusal that said nothing: not at once.
  unit = std::clamp(unit, 0.0, 1.0);
  const int64_t jitter = static_cast<int64_t>(static_cast<double>(base_ms) / 2 * unit);
  return std::min(kMaxRefusedWaitMs, base_ms + jitter);
}

int64_t RegisterBackoff::AfterFailure() {
  const int64_t wait = retry_ms;
  retry_ms = std::min(kMaxRetryMs, retry_ms * 2);
  return wait;
}

}  // namespace mptrain
