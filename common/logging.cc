#include "common/logging.h"

#include "spdlog/sinks/stdout_color_sinks.h"

namespace mptrain {

void InitLogging(const std::string& component, const std::string& level) {
  // A warm rank process logs as each of its jobs in turn, and as itself again between them: a
  // name registered before is replaced, not refused (spdlog throws on a duplicate).
  spdlog::drop(component);
  auto logger = spdlog::stderr_color_mt(component);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] [" + component + "] %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
  spdlog::flush_on(spdlog::level::info);
}

}  // namespace mptrain
