#include "backends/cpu/gloo_collective.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/tcp/pair.h"
#include "gloo/types.h"
#include "trainer/precision.h"

namespace mptrain {
namespace {

float Bf16BitsToFloat(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

uint16_t FloatToBf16Bits(float value) {  // `value` already rounded to bf16: exact.
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

// gloo's reduce function for bf16 (gloo has no bf16 type): c = round_bf16(a + b).
void SumBf16(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(c);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    out[i] = FloatToBf16Bits(RoundToBF16(Bf16BitsToFloat(x[i]) + Bf16BitsToFloat(y[i])));
  }
}

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

// gloo's tcp::Pair sends with writev, not send(MSG_NOSIGNAL): a write into a peer whose socket
// is already gone (it aborted or its process died, and gloo's event loop has not yet seen the
// close) raises SIGPIPE, whose default action kills this process without a word instead of
// failing the collective with an error that names the peer. Python (hence PyTorch's gloo) runs
// with SIGPIPE ignored for the same reason; so does every process that connects a collective
// here. Writes then fail with EPIPE, which gloo turns into an exception on the pair.
void IgnoreSigpipeOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = SIG_IGN;
    sigemptyset(&action.sa_mask);
    sigaction(SIGPIPE, &action, nullptr);
  });
}

// --- Listening ports from a range -------------------------------------------------------------
//
// gloo's tcp::Pair (Debian 12's gloo, 2022) listens in its constructor on the address of the
// device it is given, port included (CreateDevice leaves the port 0: the kernel's choice), and
// every pair of a context gets the context's device. So the listening socket of each pair is
// placed in the range by giving that pair a device of its own whose address carries a free
// port of the range (PortDevice): a tcp::Device whose contexts (RangedContext) create their
// pairs that way. Each such device runs its own event loop thread for its pair.

constexpr int64_t kMaxPortWaitMs = 10'000;  // For a port of the range to become free.

void SetPort(gloo::transport::tcp::attr* attr, int port) {
  if (attr->ai_addr.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&attr->ai_addr)->sin6_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in*>(&attr->ai_addr)->sin_port = htons(port);
  }
}

// Whether a socket could listen at the address: a bind with SO_REUSEADDR, as gloo's own, fails
// only while another socket listens there (or one bound without it). A cheap first filter; the
// pair's own bind and listen decide.
bool PortLooksFree(const gloo::transport::tcp::attr& attr) {
  const int fd = socket(attr.ai_addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;  // Let the pair say what is wrong.
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  const bool bound =
      bind(fd, reinterpret_cast<const sockaddr*>(&attr.ai_addr), attr.ai_addrlen) == 0;
  close(fd);
  return bound;
}

// A device whose pairs listen on `port`. tcp::Device's constructor finds the interface of its
// address by comparing socket addresses byte for byte, port included, so it must see port 0;
// the port goes into its attributes right after, before anything reads them (Pair::listen binds
// device_->attr_). They are const in gloo only because gloo never changes them.
class PortDevice final : public gloo::transport::tcp::Device {
 public:
  PortDevice(const gloo::transport::tcp::attr& attr, int port)
      : gloo::transport::tcp::Device(attr) {
    SetPort(&const_cast<gloo::transport::tcp::attr&>(attr_), port);
  }
};

class RangedContext final : public gloo::transport::tcp::Context {
 public:
  RangedContext(std::shared_ptr<gloo::transport::tcp::Device> device,
                const gloo::transport::tcp::attr& attr, const PortRange& ports, int64_t wait_ms,
                int rank, int size)
      : gloo::transport::tcp::Context(std::move(device), rank, size),
        host_(attr.hostname),
        attr_(attr),
        ports_(ports),
        wait_ms_(wait_ms) {}

  // The pairs use their devices: they go first (tcp::Context's destructor would clear them
  // only after these members are gone).
  ~RangedContext() override { pairs_.clear(); }

  std::unique_ptr<gloo::transport::Pair>& createPair(int peer) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms_);
    while (true) {
      for (int port = ports_.lo; port <= ports_.hi; ++port) {
        gloo::transport::tcp::attr attr = attr_;
        SetPort(&attr, port);
        if (!PortLooksFree(attr)) continue;
        auto device = std::make_shared<PortDevice>(attr_, port);
        try {
          pairs_[peer].reset(new gloo::transport::tcp::Pair(this, device.get(), peer,
                                                            getTimeout()));
        } catch (const std::exception& error) {
          // Taken between the check and the pair's own bind or listen: try the next one.
          if (std::strstr(error.what(), std::strerror(EADDRINUSE)) != nullptr) continue;
          throw;
        }
        devices_.push_back(std::move(device));
        return pairs_[peer];
      }
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw std::runtime_error(absl::StrCat(
        "no free port in the collective port range ", ports_.ToString(),
        " (worker --port_range) on ", host_, " for the connection to rank ", peer, ": all ",
        ports_.size(), " in use for ", wait_ms_ / 1000.0,
        " s. While connecting, a rank listens on one port per peer: a worker needs up to "
        "slots x (world size - 1) ports"));
  }

 private:
  const std::string host_;
  const gloo::transport::tcp::attr attr_;  // The device's address, port 0.
  const PortRange ports_;
  const int64_t wait_ms_;
  std::vector<std::shared_ptr<PortDevice>> devices_;  // One per pair.
};

class RangedDevice final : public gloo::transport::tcp::Device {
 public:
  RangedDevice(const gloo::transport::tcp::attr& attr, const PortRange& ports, int64_t wait_ms)
      : gloo::transport::tcp::Device(attr), ports_(ports), wait_ms_(wait_ms) {}

  std::shared_ptr<gloo::transport::Context> createContext(int rank, int size) override {
    return std::make_shared<RangedContext>(shared_from_this(), attr_, ports_, wait_ms_, rank,
                                           size);
  }

 private:
  const PortRange ports_;
  const int64_t wait_ms_;
};

// gloo's device for the address `host`: listening sockets on kernel-chosen ports, or on ports
// of `ports` when it is not empty.
std::shared_ptr<gloo::transport::Device> CreateDevice(const std::string& host,
                                                      const PortRange& ports, int64_t wait_ms) {
  gloo::transport::tcp::attr attr;
  attr.hostname = host;
  if (ports.empty()) return gloo::transport::tcp::CreateDevice(attr);
  return std::make_shared<RangedDevice>(gloo::transport::tcp::CreateDeviceAttr(attr), ports,
                                        wait_ms);
}

// The range of the options, else of the environment (the worker daemon's --port_range).
absl::StatusOr<PortRange> ChoosePorts(const GlooCollectiveOptions& options) {
  if (!options.ports.empty()) return options.ports;
  const char* variable = std::getenv(kGlooPortRangeVariable);
  if (variable == nullptr || *variable == '\0') return PortRange{};
  return ParsePortRange(variable, kGlooPortRangeVariable);
}

// Every rank has published its location before the rendezvous completes: reading the
// neighbours' takes one round trip each.
constexpr int64_t kPrefetchTimeoutMs = 5'000;
// A failed rendezvous names the ranks behind the addresses gloo reports: among the first this
// many ranks, each looked up this briefly (a rank that never started has no location).
constexpr int kMaxPeersNamedOnFailure = 64;
constexpr int64_t kPeerLookupMs = 500;

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
  absl::StatusOr<PortRange> ports = ChoosePorts(options);
  if (!ports.ok()) return ports.status();
  std::unique_ptr<GlooCollective> collective(new GlooCollective(options));
  collective->peers_ = std::make_unique<PeerDirectory>(options.store, rank, world_size);
  if (world_size > 1) {
    IgnoreSigpipeOnce();
    // Where this rank runs, for its peers' errors; published before joining, so once every
    // rank has joined every location is there.
    if (absl::Status published = collective->peers_->Publish(LocalPeerLocation(options.host));
        !published.ok()) {
      return absl::UnavailableError(absl::StrCat("rank ", rank, " cannot publish its location: ",
                                                 published.message()));
    }
    try {
      auto device = CreateDevice(
          options.host, *ports, std::min(options.rendezvous_timeout_ms, kMaxPortWaitMs));
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
      context->setTimeout(std::chrono::milliseconds(options.rendezvous_timeout_ms));
      GlooStoreAdapter adapter(options.store, options.rendezvous_timeout_ms);
      context->connectFullMesh(adapter, device);
      // From here on the context's timeout is the default of every operation.
      context->setTimeout(std::chrono::milliseconds(options.collective_timeout_ms));
      collective->context_ = context;
    } catch (const std::exception& error) {
      // gloo names an unreachable peer by its address alone ("connect [10.0.0.5]:59792:
      // Connection timed out"): say whose it is (its locations were published before joining).
      const std::string what = error.what();
      const std::string whose =
          collective->peers_->RanksNamedIn(what, kMaxPeersNamedOnFailure, kPeerLookupMs);
      return absl::UnavailableError(
          absl::StrCat("gloo rendezvous of rank ", rank, " of ", world_size, " failed: ", what,
                       whose.empty() ? "" : absl::StrCat(" (that address is ", whose, ")")));
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

template <typename T>
absl::Status GlooCollective::RingAllreduce(T* values, size_t count,
                                           void (*reduce)(void*, const void*, const void*,
                                                          size_t)) {
  try {
    gloo::AllreduceOptions gloo_options(context_);
    gloo_options.setOutput(values, count);
    gloo_options.setReduceFunction(reduce);
    gloo_options.setTag(next_tag_++);
    gloo_options.setTimeout(std::chrono::milliseconds(options_.collective_timeout_ms));
    gloo::allreduce(gloo_options);
  } catch (const std::exception& error) {
    const int n = options_.world_size;
    return Failure("allreduce", error.what(), {(options_.rank + 1) % n},
                   {(options_.rank + n - 1) % n});
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::AllReduceMean(Tensor buffer) {
  float* values = static_cast<float*>(buffer.data);
  const size_t count = static_cast<size_t>(buffer.numel());
  const float inverse = 1.0f / static_cast<float>(options_.world_size);
  for (size_t i = 0; i < count; ++i) values[i] *= inverse;
  if (aborted_.load()) return Failure("allreduce", "");
  if (options_.world_size == 1) return absl::OkStatus();
  return RingAllreduce(values, count, &gloo::sum<float>);
}

absl::Status GlooCollective::AllReduceSumCompressedAsync(Tensor buffer) {
  if (buffer.dtype != DType::kF16 && buffer.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("compressed allreduce: the buffer must be f16 or bf16");
  }
  if (aborted_.load()) return Failure("allreduce", "");
  if (options_.world_size == 1) return absl::OkStatus();
  float* values = static_cast<float*>(buffer.data);
  const size_t count = static_cast<size_t>(buffer.numel());
  const bool f16 = buffer.dtype == DType::kF16;
  wire_.resize(count);
  for (size_t i = 0; i < count; ++i) {
    wire_[i] = f16 ? gloo::cpu_float2half_rn(values[i]).x : FloatToBf16Bits(values[i]);
  }
  absl::Status reduced =
      f16 ? RingAllreduce(reinterpret_cast<gloo::float16*>(wire_.data()), count,
                          &gloo::sum<gloo::float16>)
          : RingAllreduce(wire_.data(), count, &SumBf16);
  if (!reduced.ok()) return reduced;
  for (size_t i = 0; i < count; ++i) {
    gloo::float16 half;  // (Its constructors convert numbers; the bits are set directly.)
    half.x = wire_[i];
    values[i] = f16 ? gloo::cpu_half2float(half) : Bf16BitsToFloat(wire_[i]);
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

absl::Status GlooCollective::AllGather(Tensor send, Tensor recv) {
  const int n = options_.world_size;
  const size_t count = static_cast<size_t>(send.numel());
  if (recv.numel() != send.numel() * n || send.dtype != DType::kF32 ||
      recv.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("allgather: f32 [1, k] into [", n,
                                                   ", k] expected, got ", send.numel(), " into ",
                                                   recv.numel()));
  }
  if (aborted_.load()) return Failure("allgather", "");
  float* out = static_cast<float*>(recv.data);
  if (n == 1) {
    std::memmove(out, send.data, count * sizeof(float));
    return absl::OkStatus();
  }
  try {
    gloo::AllgatherOptions gloo_options(context_);
    gloo_options.setInput(static_cast<float*>(send.data), count);
    gloo_options.setOutput(out, count * n);
    gloo_options.setTag(next_tag_++);
    gloo_options.setTimeout(std::chrono::milliseconds(options_.collective_timeout_ms));
    gloo::allgather(gloo_options);
  } catch (const std::exception& error) {
    // gloo's ring allgather receives from rank - 1 and sends to rank + 1.
    return Failure("allgather", error.what(), {(options_.rank + n - 1) % n},
                   {(options_.rank + 1) % n});
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::AllReduceSum(Tensor buffer) {
  if (aborted_.load()) return Failure("allreduce", "");
  if (options_.world_size == 1) return absl::OkStatus();
  return RingAllreduce(static_cast<float*>(buffer.data), static_cast<size_t>(buffer.numel()),
                       &gloo::sum<float>);
}

}  // namespace mptrain
