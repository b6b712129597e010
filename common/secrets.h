#pragma once

// Random capabilities (worker and rank secrets, generated tokens) and their comparison.

#include <string>
#include "absl/strings/string_view.h"

namespace mptrain {

// 128 random bits from the kernel (getrandom), as 32 lowercase hex digits.
std::string RandomSecret();

// Compares in time that depends only on the lengths, so a guess learns nothing from timing.
bool SecretsEqual(absl::string_view a, absl::string_view b);

}  // namespace mptrain
