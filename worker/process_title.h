#pragma once

// What `ps`, `pgrep -f` and /proc/PID/cmdline show for this process, replaced in place (as
// PostgreSQL and nginx do): a warm rank process started as `worker --standby_slot=N ...` shows
// `worker --run_rank=FILE ...` once it has a job, like a rank started for it, so operators and
// scripts find a job's ranks by their assignment file either way.

#include <string>
#include <vector>

namespace mptrain {

// Overwrites the memory of argv's strings (contiguous from argv[0] on Linux) with `args`,
// separated by NULs. Returns false when they do not fit in that space; the title is then
// truncated (still NUL-terminated). `argv` must be main's own argument vector, untouched
// before the first call. Not thread-safe: call it from one thread.
bool SetProcessTitle(int argc, char** argv, const std::vector<std::string>& args);

}  // namespace mptrain
