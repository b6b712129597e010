#include "common/secrets.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace mptrain {

std::string RandomSecret() {
  uint8_t bytes[16];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      // No entropy source means no security at all: refuse to run rather than hand out
      // guessable capabilities.
      std::abort();
    }
    filled += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string secret;
  secret.reserve(2 * sizeof(bytes));
  for (uint8_t byte : bytes) {
    secret.push_back(kHex[byte >> 4]);
    secret.push_back(kHex[byte & 0xf]);
  }
  return secret;
}

bool SecretsEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  volatile uint8_t difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference |= static_cast<uint8_t>(a[i]) ^ static_cast<uint8_t>(b[i]);
  }
  return difference == 0 && !a.empty();
}

}  // namespace mptrain
