#include "backends/cpu/gloo_collective.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace mptrain {
namespace {

// gloo's Store interface over our KeyValueStore. gloo reports errors by exception, so failures
// of the store are thrown here and caught in GlooCollective::Connect.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(KeyValueStore* store, int64_t timeout_ms)
      : store_(store), timeout_ms_(timeout_ms) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status status = store_->Set("gloo/" + key, std::string(data.begin(), data.end()));
    if (!status.ok()) throw std::runtime_error(status.ToString());
  }

  std::vector<char> get(const std::string& key) override {
    auto value = store_->Get("gloo/" + key, timeout_ms_);
    if (!value.ok()) throw std::runtime_error(value.status().ToString());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    for (const std::string& key : keys) get(key);
  }

 private:
  KeyValueStore* store_;
  int64_t timeout_ms_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCollective>> GlooCollective::Connect(
    int rank, int world_size, const std::string& host, KeyValueStore* store,
    int64_t timeout_ms) {
  std::unique_ptr<GlooCollective> collective(new GlooCollective(rank, world_size));
  if (world_size == 1) return collective;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    context->setTimeout(std::chrono::milliseconds(timeout_ms));
    GlooStoreAdapter adapter(store, timeout_ms);
    context->connectFullMesh(adapter, device);
    collective->context_ = context;
  } catch (const std::exception& error) {
    return absl::UnavailableError(absl::StrCat("gloo rendezvous of rank ", rank, " of ",
                                               world_size, " failed: ", error.what()));
  }
  return collective;
}

absl::Status GlooCollective::AllReduceMean(Tensor buffer) {
  float* values = static_cast<float*>(buffer.data);
  const size_t count = static_cast<size_t>(buffer.numel());
  const float inverse = 1.0f / static_cast<float>(world_size_);
  for (size_t i = 0; i < count; ++i) values[i] *= inverse;
  if (world_size_ == 1) return absl::OkStatus();
  try {
    gloo::AllreduceOptions options(context_);
    options.setOutput(values, count);
    options.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    options.setTag(next_tag_++);
    gloo::allreduce(options);
  } catch (const std::exception& error) {
    return absl::UnavailableError(
        absl::StrCat("gloo allreduce on rank ", rank_, " failed: ", error.what()));
  }
  return absl::OkStatus();
}

}  // namespace mptrain
