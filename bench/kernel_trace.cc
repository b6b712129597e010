// A kernel timeline of a running program, without a profiler's serialization: preloaded
// (LD_PRELOAD=libkernel_trace.so), it records every kernel's start and end through CUPTI's
// activity API (concurrent kernels) and, at exit, prints per device, over the middle half of the
// span between the first and the last GEMM (the steady state of a benchmark): each kernel name's
// total time and count, how much of the window the GPU ran no kernel at all, and how much GEMM
// time overlapped an NCCL kernel. Where a step's time goes on the GPU machine, 2 GPUs included
// (scripts/device_run.sh trace; built there with g++, see that step).
#include <cupti.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Kernel {
  uint64_t start, end;
  uint32_t device;
  std::string name;
};

std::mutex g_mutex;
std::vector<Kernel>* g_kernels = new std::vector<Kernel>;  // Never freed: used at exit.

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    auto* kernel = reinterpret_cast<CUpti_ActivityKernel10*>(record);
    g_kernels->push_back({kernel->start, kernel->end, kernel->deviceId,
                          kernel->name != nullptr ? kernel->name : "?"});
  }
  free(buffer);
}

bool IsGemm(const std::string& name) {
  return name.find("nvjet") != std::string::npos || name.find("gemm") != std::string::npos ||
         name.find("Kernel2") != std::string::npos;
}
bool IsNccl(const std::string& name) { return name.find("nccl") != std::string::npos ||
                                              name.find("Reduce") != std::string::npos; }

void Report() {
  cuptiActivityFlushAll(0);
  std::lock_guard<std::mutex> lock(g_mutex);
  const char* path = std::getenv("KERNEL_TRACE_OUT");
  FILE* out = path != nullptr ? std::fopen(path, "a") : stderr;
  if (out == nullptr) out = stderr;
  std::map<uint32_t, std::vector<const Kernel*>> by_device;
  for (const Kernel& k : *g_kernels) by_device[k.device].push_back(&k);
  for (auto& [device, kernels] : by_device) {
    uint64_t first = UINT64_MAX, last = 0;
    for (const Kernel* k : kernels) {
      if (!IsGemm(k->name)) continue;
      first = std::min(first, k->start);
      last = std::max(last, k->end);
    }
    if (first >= last) continue;
    const uint64_t from = first + (last - first) / 4, to = last - (last - first) / 4;
    std::vector<const Kernel*> window;
    for (const Kernel* k : kernels) {
      if (k->end > from && k->start < to) window.push_back(k);
    }
    std::sort(window.begin(), window.end(),
              [](const Kernel* a, const Kernel* b) { return a->start < b->start; });
    std::map<std::string, std::pair<double, int>> totals;
    uint64_t busy = 0, cursor = from;
    std::vector<std::pair<uint64_t, uint64_t>> nccl;
    for (const Kernel* k : window) {
      const uint64_t s = std::max(k->start, from), e = std::min(k->end, to);
      auto& [ms, count] = totals[k->name.substr(0, 80)];
      ms += (e - s) / 1e6;
      ++count;
      if (e > cursor) {
        busy += e - std::max(s, cursor);
        cursor = e;
      }
      if (IsNccl(k->name)) nccl.push_back({s, e});
    }
    double gemm_under_nccl = 0;
    for (const Kernel* k : window) {
      if (!IsGemm(k->name)) continue;
      for (auto [s, e] : nccl) {
        const uint64_t a = std::max(s, k->start), b = std::min(e, k->end);
        if (b > a) gemm_under_nccl += (b - a) / 1e6;
      }
    }
    const double span = (to - from) / 1e6;
    std::fprintf(out, "device %u: window %.1f ms (middle half of the GEMMs' span), GPU idle %.2f ms "
                 "(%.1f%%), GEMM time overlapping NCCL kernels %.2f ms\n",
                 device, span, span - busy / 1e6, 100.0 * (span - busy / 1e6) / span,
                 gemm_under_nccl);
    std::vector<std::pair<std::string, std::pair<double, int>>> sorted(totals.begin(),
                                                                      totals.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    for (const auto& [name, value] : sorted) {
      std::fprintf(out, "  %9.3f ms %6d  %7.4f ms/call  %s\n", value.first, value.second,
                   value.first / value.second, name.c_str());
    }
  }
  if (out != stderr) std::fclose(out);
}

__attribute__((constructor)) void Start() {
  if (cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI could not be enabled\n");
    return;
  }
  std::atexit(Report);
  // Records are collected as the program runs: at exit the CUDA runtime may be gone already.
  std::thread([] {
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      cuptiActivityFlushAll(0);
    }
  }).detach();
}

}  // namespace
