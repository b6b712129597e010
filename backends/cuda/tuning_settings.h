#pragma once

// The CUDA backend's A/B settings from the process's environment (benchmarks' variants: a
// worker passes its environment to its ranks), read where each is first used.

#include <algorithm>
#include <cstdlib>
#include <string>

namespace mptrain::cuda {

// On unless the variable is "0".
inline bool SwitchedOn(const char* variable) {
  const char* value = std::getenv(variable);
  return value == nullptr || std::string(value) != "0";
}

// A count in [1, most]: `fallback` when unset; a value that is not a number reads as 0, then 1.
inline int CountSetting(const char* variable, int fallback, int most) {
  const char* value = std::getenv(variable);
  const int asked = value == nullptr ? fallback : std::atoi(value);
  return std::clamp(asked, 1, most);
}

}  // namespace mptrain::cuda
