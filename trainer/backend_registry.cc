#include "trainer/backend_registry.h"

#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace mptrain {
namespace {

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}

std::map<v1::DeviceKind, BackendEntry>& Registry() {
  static auto* registry = new std::map<v1::DeviceKind, BackendEntry>();
  return *registry;
}

}  // namespace

void RegisterBackend(v1::DeviceKind kind, BackendEntry entry) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry()[kind] = std::move(entry);
}

absl::StatusOr<const BackendEntry*> FindBackend(v1::DeviceKind kind) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(kind);
  if (it == Registry().end()) {
    return absl::UnimplementedError(
        absl::StrCat("this build has no ", v1::DeviceKind_Name(kind),
                     " backend (CUDA parts are built only where /usr/local/cuda exists)"));
  }
  return &it->second;
}

}  // namespace mptrain
