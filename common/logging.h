#pragma once

// One logger per process, with a pattern that carries who is speaking (coordinator, worker
// name, or job and rank) so that interleaved logs from several processes stay readable.

#include <string>

#include "spdlog/spdlog.h"

namespace mptrain {

// Sets the default spdlog logger to stderr with the pattern
// "[time] [level] [<component>] message". `level` is one of spdlog's names ("info", "debug").
void InitLogging(const std::string& component, const std::string& level = "info");

}  // namespace mptrain
