// pending_queue_memory: what queued jobs cost the coordinator in memory, and whether it gets
// that memory back once they are cancelled (issue 27, item 6). One CoordinatorState in this
// process (no gRPC: the queue is what is measured), with its SQLite job store in a fresh
// directory as the coordinator keeps one, no workers (every job stays PENDING). It submits
// --jobs jobs of --world_size ranks, cancels them all, and prints the process's RSS at each
// stage (/proc/self/status VmRSS) beside the baseline figures of issue 27 (the coordinator
// process before the fix: 1.48 GB with 10,000 jobs of 1,024 ranks queued, 1.46 GB after).
//
//   pending_queue_memory [--jobs 10000] [--world_size 1024] [--store=true|false]

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cli_flags.h"
#include "coordinator/coordinator_state.h"
#include "coordinator/store/sqlite_job_store.h"

ABSL_FLAG(int32_t, jobs, 10'000, "Jobs to queue");
ABSL_FLAG(int32_t, world_size, 1024, "Ranks of each job");
ABSL_FLAG(bool, store, true, "Keep a SQLite job store (in a fresh temporary directory)");

namespace {

double RssMiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return -1;
}

// The smallest valid spec (a 4 -> 2 linear model), but for its world size.
mptrain::v1::JobSpec QueuedSpec(int world_size) {
  mptrain::v1::JobSpec spec;
  spec.set_name("queued");
  spec.set_world_size(world_size);
  spec.set_device(mptrain::v1::CPU);
  spec.mutable_model()->set_input_dim(4);
  spec.mutable_model()->set_output_dim(2);
  spec.mutable_data()->mutable_synthetic()->set_seed(0);
  spec.set_micro_batch_size(2);
  spec.set_accumulation_steps(1);
  spec.set_steps(1);
  spec.mutable_optimizer()->set_lr(0.1);
  return spec;
}

}  // namespace

int main(int argc, char** argv) {
  mptrain::ParseFlags(argc, argv, "pending_queue_memory [--jobs N] [--world_size N] [--store=B]");
  const int jobs = absl::GetFlag(FLAGS_jobs);
  const int world_size = absl::GetFlag(FLAGS_world_size);

  std::unique_ptr<mptrain::SqliteJobStore> store;
  std::string dir;
  if (absl::GetFlag(FLAGS_store)) {
    char pattern[] = "/tmp/pending_queue_memory.XXXXXX";
    dir = mkdtemp(pattern);
    auto opened = mptrain::SqliteJobStore::Open(dir);
    if (!opened.ok()) {
      std::fprintf(stderr, "%s\n", opened.status().ToString().c_str());
      return 1;
    }
    store = std::move(*opened);
  }
  mptrain::CoordinatorOptions options;
  options.store = store.get();
  options.max_pending_jobs = jobs;
  options.max_pending_jobs_per_owner = jobs;
  options.max_pending_bytes = options.max_pending_bytes_per_owner = int64_t{1} << 40;
  auto state = std::make_unique<mptrain::CoordinatorState>(options);
  if (absl::Status restored = state->Restore(); !restored.ok()) {
    std::fprintf(stderr, "%s\n", restored.ToString().c_str());
    return 1;
  }
  const double before = RssMiB();

  mptrain::v1::SubmitJobRequest request;
  *request.mutable_spec() = QueuedSpec(world_size);
  std::vector<std::string> ids;
  for (int i = 0; i < jobs; ++i) {
    // Names are unique among an owner's live jobs (the same length for every job).
    request.mutable_spec()->set_name(absl::StrFormat("queued-%08d", i));
    auto submitted = state->SubmitJob(request, absl::StrCat("user", i % 10));
    if (!submitted.ok()) {
      std::fprintf(stderr, "submit %d: %s\n", i, submitted.status().ToString().c_str());
      return 1;
    }
    ids.push_back(submitted->job_id());
  }
  const double queued = RssMiB();
  const int64_t queued_bytes = state->GetOverview().queued_bytes;
  for (const std::string& id : ids) {
    if (!state->CancelJob(id).ok()) return 1;
  }
  const double cancelled = RssMiB();
  const int64_t charged = queued_bytes;
  // The housekeeping pass the coordinator runs every 200 ms: ended jobs past
  // --max_finished_jobs (1,000) are forgotten, and the memory handed back.
  state->CheckLiveness();
  const double housekept = RssMiB();

  std::printf("%d pending jobs of world_size %d%s\n", jobs, world_size,
              store ? " (SQLite job store)" : " (no store)");
  std::printf("%-34s %10s %14s\n", "stage", "RSS MiB", "issue 27 MB");
  std::printf("%-34s %10.1f %14s\n", "before submitting", before, "-");
  std::printf("%-34s %10.1f %14s\n", "all queued", queued, "1480");
  std::printf("%-34s %10.1f %14s\n", "all cancelled", cancelled, "1460");
  std::printf("%-34s %10.1f %14s\n", "after the housekeeping pass", housekept, "-");
  std::printf("%-34s %10.1f %14s\n", "per queued job, KiB", (queued - before) * 1024 / jobs,
              "~150");
  std::printf("%-34s %10.1f %14s\n", "charged per queued job, KiB",
              static_cast<double>(charged) / 1024 / jobs, "-");
  state.reset();
  store.reset();
  if (!dir.empty()) std::system(("rm -rf " + dir).c_str());
  return 0;
}
