#include "coordinator/metrics_process.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace mptrain {
namespace {

// Taken when the binary's static objects are built, i.e. at process start (as close as the
// process itself can tell without /proc/stat, which ProcSubset=pid hides).
const double kProcessStartUnixSeconds =
    std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();

// /proc/self/statm: sizes in pages, "virtual resident ...".
bool ReadMemory(double* virtual_bytes, double* resident_bytes) {
  FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return false;
  unsigned long long virtual_pages = 0, resident_pages = 0;
  const bool read = std::fscanf(statm, "%llu %llu", &virtual_pages, &resident_pages) == 2;
  std::fclose(statm);
  if (!read) return false;
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  *virtual_bytes = virtual_pages * page;
  *resident_bytes = resident_pages * page;
  return true;
}

// Entries of /proc/self/fd, less the one opendir holds while counting.
bool CountOpenFds(double* open) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return false;
  long entries = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++entries;
  }
  closedir(dir);
  *open = static_cast<double>(entries - 1);
  return true;
}

}  // namespace

void AppendProcessMetrics(PrometheusText& text) {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    const double cpu = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 +
                       usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6;
    text.Family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                "counter");
    text.Sample({}, cpu);
  }
  double virtual_bytes = 0, resident_bytes = 0;
  if (ReadMemory(&virtual_bytes, &resident_bytes)) {
    text.Family("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge");
    text.Sample({}, resident_bytes);
    text.Family("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge");
    text.Sample({}, virtual_bytes);
  }
  double open_fds = 0;
  if (CountOpenFds(&open_fds)) {
    text.Family("process_open_fds", "Number of open file descriptors.", "gauge");
    text.Sample({}, open_fds);
  }
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    text.Family("process_max_fds", "Maximum number of open file descriptors.", "gauge");
    text.Sample({}, static_cast<double>(files.rlim_cur));
  }
  text.Family("process_start_time_seconds",
              "Start time of the process since unix epoch in seconds.", "gauge");
  text.Sample({}, kProcessStartUnixSeconds);
}

}  // namespace mptrain
