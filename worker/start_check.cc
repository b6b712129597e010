#include "worker/start_check.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace mptrain {

absl::Status CheckStart(const v1::Assignment& start, int slots,
                        const std::vector<const v1::Assignment*>& running) {
  const std::string& job_id = start.job_id();
  const bool plain_id = !job_id.empty() && job_id.size() <= 64 &&
                        std::all_of(job_id.begin(), job_id.end(), [](char c) {
                          return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' ||
                                 c == '_';
                        });
  if (!plain_id) {
    return absl::InvalidArgumentError("the job id is not [A-Za-z0-9_-]{1,64}");
  }
  for (const v1::Assignment* other : running) {
    if (other->job_id() == job_id && other->rank() == start.rank() &&
        other->attempt() == start.attempt()) {
      return absl::AlreadyExistsError(absl::StrCat("rank ", start.rank(), " of ", job_id,
                                                   " attempt ", start.attempt(),
                                                   " runs here already"));
    }
  }
  if (start.device_index() < 0 || start.device_index() >= slots) {
    return absl::InvalidArgumentError(absl::StrCat("device index ", start.device_index(),
                                                   " is not a slot of this worker (", slots,
                                                   " slots)"));
  }
  for (const v1::Assignment* other : running) {
    if (other->device_index() == start.device_index()) {
      return absl::UnavailableError(absl::StrCat(
          "slot ", start.device_index(), " is held by rank ", other->rank(), " of ",
          other->job_id(), " attempt ", other->attempt(), " until it exits"));
    }
  }
  return absl::OkStatus();
}

}  // namespace mptrain
