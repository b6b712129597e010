#include "backends/cpu/gloo_collective.h"

#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/tcp/pair.h"

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

// gloo fails every pending operation of a pair, and closes its socket (so the peer fails too),
// through tcp::Pair::signalExceptionExternal, which is protected: this is what gloo itself does
// when one operation times out. A pointer to the member, taken through a derived class, calls
// it without touching gloo's sources.
struct TcpPairAccess : gloo::transport::tcp::Pair {
  static void Fail(gloo::transport::tcp::Pair* pair, const std::string& message) {
    auto signal = &TcpPairAccess::signalExceptionExternal;
    (pair->*signal)(message);
  }
};

// Every rank has published its location before the rendezvous completes: reading the
// neighbours' takes one round trip each.
constexpr int64_t kPrefetchTimeoutMs = 5'000;

// gloo's broadcast (broadcast.cc) in virtual ranks v = (rank - root) mod n: v receives from v
// without its highest set bit, and sends to v | 2^i for every i above it (all i for v = 0).
struct TreePeers {
  std::vector<int> parent;
  std::vector<int> children;
};

TreePeers BroadcastTree(int rank, int root, int n) {
  TreePeers peers;
  const int v = (rank - root + n) % n;
  int high = -1;
  for (int bit = 0; (1 << bit) <= v; ++bit) {
    if (v & (1 << bit)) high = bit;
  }
  if (v != 0) peers.parent.push_back(((v ^ (1 << high)) + root) % n);
  for (int bit = high + 1; (v | (1 << bit)) < n; ++bit) {
    peers.children.push_back(((v | (1 << bit)) + root) % n);
  }
  return peers;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCollective>> GlooCollective::Connect(
    int rank, int world_size, const std::string& host, KeyValueStore* store,
    int64_t timeout_ms) {
  GlooCollectiveOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.host = host;
  options.store = store;
  options.rendezvous_timeout_ms = timeout_ms;
  options.collective_timeout_ms = timeout_ms;
  return Connect(options);
}

absl::StatusOr<std::unique_ptr<GlooCollective>> GlooCollective::Connect(
    const GlooCollectiveOptions& options) {
  const int rank = options.rank;
  const int world_size = options.world_size;
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: rank ", rank, " is not in a world of ", world_size));
  }
  if (options.rendezvous_timeout_ms <= 0 || options.collective_timeout_ms <= 0) {
    return absl::InvalidArgumentError("gloo: timeouts must be > 0 ms");
  }
  std::unique_ptr<GlooCollective> collective(new GlooCollective(options));
  collective->peers_ = std::make_unique<PeerDirectory>(options.store, rank, world_size);
  if (world_size > 1) {
    // Where this rank runs, for its peers' errors; published before joining, so once every
    // rank has joined every location is there.
    if (absl::Status published = collective->peers_->Publish(LocalPeerLocation(options.host));
        !published.ok()) {
      return absl::UnavailableError(absl::StrCat("rank ", rank, " cannot publish its location: ",
                                                 published.message()));
    }
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = options.host;
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
      context->setTimeout(std::chrono::milliseconds(options.rendezvous_timeout_ms));
      GlooStoreAdapter adapter(options.store, options.rendezvous_timeout_ms);
      context->connectFullMesh(adapter, device);
      // From here on the context's timeout is the default of every operation.
      context->setTimeout(std::chrono::milliseconds(options.collective_timeout_ms));
      collective->context_ = context;
    } catch (const std::exception& error) {
      return absl::UnavailableError(absl::StrCat("gloo rendezvous of rank ", rank, " of ",
                                                 world_size, " failed: ", error.what()));
    }
    // The peers this rank may wait for: its ring neighbours (allreduce) and rank 0 (broadcast).
    std::vector<int> waited = RingNeighbours(rank, world_size);
    if (rank != 0) waited.push_back(0);
    collective->peers_->Prefetch(waited, kPrefetchTimeoutMs);
  }
  if (options.stop_token != nullptr) {
    GlooCollective* self = collective.get();
    collective->stop_registration_ =
        options.stop_token->OnStop([self](const std::string& reason) { self->Abort(reason); });
  }
  return collective;
}

GlooCollective::~GlooCollective() { stop_registration_.reset(); }

void GlooCollective::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_.load()) return;
    abort_reason_ = reason;
    aborted_.store(true);
  }
  if (context_ == nullptr) return;
  for (int peer = 0; peer < options_.world_size; ++peer) {
    if (peer == options_.rank) continue;
    auto* pair = dynamic_cast<gloo::transport::tcp::Pair*>(context_->getPair(peer).get());
    if (pair != nullptr) TcpPairAccess::Fail(pair, absl::StrCat("aborted: ", reason));
  }
}

absl::Status GlooCollective::Failure(const char* op, const std::string& what,
                                     const std::vector<int>& recv_from,
                                     const std::vector<int>& send_to) {
  if (aborted_.load()) {
    std::lock_guard<std::mutex> lock(abort_mu_);
    return absl::AbortedError(absl::StrCat("collective ", op, " on rank ", options_.rank,
                                           " aborted: ", abort_reason_));
  }
  // gloo's own timeout: "Timed out waiting 60000ms for recv operation to complete" (or send).
  if (what.find("Timed out waiting") != std::string::npos) {
    const bool send = what.find("for send operation") != std::string::npos;
    return absl::DeadlineExceededError(CollectiveTimeoutMessage(
        op, options_.collective_timeout_ms, peers_.get(), send ? send_to : recv_from));
  }
  return absl::UnavailableError(absl::StrCat("collective ", op, " failed on ",
                                             peers_->Describe(options_.rank), ": gloo: ", what));
}

absl::Status GlooCollective::AllReduceMean(Tensor buffer) {
  float* values = static_cast<float*>(buffer.data);
  const size_t count = static_cast<size_t>(buffer.numel());
  const float inverse = 1.0f / static_cast<float>(options_.world_size);
  for (size_t i = 0; i < count; ++i) values[i] *= inverse;
  if (aborted_.load()) return Failure("allreduce", "");
  if (options_.world_size == 1) return absl::OkStatus();
  try {
    gloo::AllreduceOptions gloo_options(context_);
    gloo_options.setOutput(values, count);
    gloo_options.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    gloo_options.setTag(next_tag_++);
    gloo_options.setTimeout(std::chrono::milliseconds(options_.collective_timeout_ms));
    gloo::allreduce(gloo_options);
  } catch (const std::exception& error) {
    // gloo's ring (allreduce.cc) receives from rank + 1 and sends to rank - 1.
    const int n = options_.world_size;
    return Failure("allreduce", error.what(), {(options_.rank + 1) % n},
                   {(options_.rank + n - 1) % n});
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::Broadcast(Tensor buffer, int root) {
  const int n = options_.world_size;
  if (root < 0 || root >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is not a rank of a world of ", n));
  }
  if (aborted_.load()) return Failure("broadcast", "");
  if (n == 1) return absl::OkStatus();
  try {
    gloo::BroadcastOptions gloo_options(context_);
    gloo_options.setOutput(static_cast<float*>(buffer.data), static_cast<size_t>(buffer.numel()));
    gloo_options.setRoot(root);
    gloo_options.setTag(next_tag_++);
    gloo_options.setTimeout(std::chrono::milliseconds(options_.collective_timeout_ms));
    gloo::broadcast(gloo_options);
  } catch (const std::exception& error) {
    const TreePeers peers = BroadcastTree(options_.rank, root, n);
    return Failure("broadcast", error.what(), peers.parent, peers.children);
  }
  return absl::OkStatus();
}

}  // namespace mptrain
