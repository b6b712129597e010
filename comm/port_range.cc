#include "comm/port_range.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace mptrain {
namespace {

bool ParsePort(const std::string& text, int* port) {
  if (text.empty() || text.size() > 5) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(text, port);
}

}  // namespace

std::string PortRange::ToString() const { return absl::StrCat(lo, "-", hi); }

absl::StatusOr<PortRange> ParsePortRange(const std::string& text, const std::string& what) {
  const size_t dash = text.find('-');
  const std::string lo_text = text.substr(0, dash);
  const std::string hi_text = dash == std::string::npos ? lo_text : text.substr(dash + 1);
  PortRange range;
  if (!ParsePort(lo_text, &range.lo) || !ParsePort(hi_text, &range.hi)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be LO-HI (two port numbers, e.g. 29500-29599), got \"", text, "\""));
  }
  if (range.lo < kMinRangePort || range.hi > kMaxRangePort) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", text, ": ports must be in [",
                                                   kMinRangePort, ", ", kMaxRangePort, "]"));
  }
  if (range.lo > range.hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", text, ": LO must be <= HI (", range.lo, " > ", range.hi, ")"));
  }
  return range;
}

}  // namespace mptrain
