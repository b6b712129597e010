#include "backends/cpu/gloo_collective.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "comm/peer_directory.h"
#include "comm/stop_token.h"
#include "gtest/gtest.h"
#include "tests/ci_skip.h"
#include "tests/fake_collectives.h"

namespace mptrain {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Connects `world` ranks on loopback in parallel; each gets `options` with its own rank.
std::vector<std::unique_ptr<GlooCollective>> ConnectAll(int world, GlooCollectiveOptions options,
                                                        KeyValueStore* store,
                                                        std::vector<StopToken*> tokens = {}) {
  std::vector<std::unique_ptr<GlooCollective>> collectives(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank, options]() mutable {
      options.rank = rank;
      options.world_size = world;
      options.store = store;
      if (rank < static_cast<int>(tokens.size())) options.stop_token = tokens[rank];
      auto collective = GlooCollective::Connect(options);
      ASSERT_TRUE(collective.ok()) << collective.status();
      collectives[rank] = std::move(*collective);
    });
  }
  for (auto& thread : threads) thread.join();
  return collectives;
}

TEST(GlooCollective, ThreeRanks_AllReduceMean) {
  InMemoryKeyValueStore store;
  std::vector<float> buffers[3] = {{1, 10}, {2, 20}, {6, 60}};
  absl::Status statuses[3];
  std::thread ranks[3];
  for (int rank = 0; rank < 3; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      auto collective = GlooCollective::Connect(rank, 3, "127.0.0.1", &store, 20'000);
      if (!collective.ok()) {
        statuses[rank] = collective.status();
        return;
      }
      Tensor tensor{buffers[rank].data(), DType::kF32, 1, 2, 4};
      statuses[rank] = (*collective)->AllReduceMean(tensor);
    });
  }
  for (auto& rank : ranks) rank.join();
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(statuses[rank].ok()) << statuses[rank];
    EXPECT_FLOAT_EQ(buffers[rank][0], 3.0f);
    EXPECT_FLOAT_EQ(buffers[rank][1], 30.0f);
  }
}

TEST(GlooCollective, MissingPeer_TimesOutWithAnError) {
  InMemoryKeyValueStore store;
  auto collective = GlooCollective::Connect(0, 2, "127.0.0.1", &store, 300);
  EXPECT_FALSE(collective.ok());
}

std::string Where(int rank) {
  return "rank " + std::to_string(rank) + " on " + LocalPeerLocation("127.0.0.1").host_name +
         " (127.0.0.1)";
}

TEST(GlooCollective, PeerNeverCalls_FailsWithinTheCollectiveTimeout_NamingThePair) {
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.rendezvous_timeout_ms = 20'000;
  options.collective_timeout_ms = 1'000;
  auto collectives = ConnectAll(2, options, &store);
  ASSERT_TRUE(collectives[0] && collectives[1]);
  std::vector<float> values = {1, 2, 3};
  const auto start = Clock::now();
  absl::Status status = collectives[0]->AllReduceMean({values.data(), DType::kF32, 1, 3, 4});
  const double waited = SecondsSince(start);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_EQ(status.message(), "collective allreduce timed out after 1 s: " + Where(0) +
                                  " waited for " + Where(1));
  EXPECT_GE(waited, 0.9);
  EXPECT_LT(waited, 5.0) << "the 1 s collective timeout was not applied";
}

TEST(GlooCollective, ThreeRanks_OneNeverCalls_ItsRingPredecessorNamesIt) {
  // gloo's ring: rank r receives from r + 1. Rank 2 never calls: rank 1 waits for it.
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.rendezvous_timeout_ms = 20'000;
  options.collective_timeout_ms = 1'000;
  auto collectives = ConnectAll(3, options, &store);
  ASSERT_TRUE(collectives[0] && collectives[1] && collectives[2]);
  absl::Status statuses[2];
  std::vector<float> values[2] = {{1, 2, 3}, {4, 5, 6}};
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      statuses[rank] =
          collectives[rank]->AllReduceMean({values[rank].data(), DType::kF32, 1, 3, 4});
    });
  }
  const auto start = Clock::now();
  for (auto& thread : ranks) thread.join();
  EXPECT_LT(SecondsSince(start), 5.0);
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kDeadlineExceeded) << statuses[1];
  EXPECT_EQ(statuses[1].message(), "collective allreduce timed out after 1 s: " + Where(1) +
                                       " waited for " + Where(2));
  // Rank 0 waited for rank 1: it times out naming rank 1, or sees rank 1 close its connection.
  EXPECT_FALSE(statuses[0].ok());
}

TEST(GlooCollective, ThreeRanks_Broadcast_CopiesTheRootsBitsExactly) {
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.rendezvous_timeout_ms = 20'000;
  auto collectives = ConnectAll(3, options, &store);
  ASSERT_TRUE(collectives[0] && collectives[1] && collectives[2]);
  const std::vector<float> root_values = {-0.0f, 1e-42f /* denormal */, std::nanf("7"), 3.5f};
  std::vector<float> buffers[3];
  for (int rank = 0; rank < 3; ++rank) {
    buffers[rank] = rank == 1 ? root_values : std::vector<float>(4, float(rank));
  }
  absl::Status statuses[3];
  std::thread ranks[3];
  for (int rank = 0; rank < 3; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      statuses[rank] =
          collectives[rank]->Broadcast({buffers[rank].data(), DType::kF32, 1, 4, 4}, /*root=*/1);
    });
  }
  for (auto& thread : ranks) thread.join();
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(statuses[rank].ok()) << statuses[rank];
    EXPECT_EQ(std::memcmp(buffers[rank].data(), root_values.data(), 4 * sizeof(float)), 0)
        << "rank " << rank;
  }
  float value = 0;
  EXPECT_EQ(collectives[0]->Broadcast({&value, DType::kF32, 1, 1, 4}, 3).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlooCollective, Broadcast_RootNeverCalls_TheReceiverNamesTheRoot) {
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.rendezvous_timeout_ms = 20'000;
  options.collective_timeout_ms = 1'000;
  auto collectives = ConnectAll(2, options, &store);
  ASSERT_TRUE(collectives[0] && collectives[1]);
  std::vector<float> values = {1, 2};
  absl::Status status = collectives[1]->Broadcast({values.data(), DType::kF32, 1, 2, 4}, 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_EQ(status.message(), "collective broadcast timed out after 1 s: " + Where(1) +
                                  " waited for " + Where(0));
}

TEST(GlooCollective, Broadcast_FourRanks_ARankNamesItsParentInTheTree) {
  // gloo's binomial tree from root 0 over 4 ranks: 0 -> 1, 0 -> 2, 1 -> 3. Rank 1 never calls:
  // rank 3 waits to receive from it.
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.rendezvous_timeout_ms = 20'000;
  options.collective_timeout_ms = 1'000;
  auto collectives = ConnectAll(4, options, &store);
  for (auto& collective : collectives) ASSERT_TRUE(collective);
  absl::Status statuses[4];
  std::vector<float> buffers[4];
  std::vector<std::thread> threads;
  for (int rank : {0, 2, 3}) {
    buffers[rank] = {float(rank)};
    threads.emplace_back([&, rank] {
      statuses[rank] = collectives[rank]->Broadcast({buffers[rank].data(), DType::kF32, 1, 1, 4}, 0);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(statuses[2].ok()) << statuses[2];
  EXPECT_EQ(statuses[3].code(), absl::StatusCode::kDeadlineExceeded) << statuses[3];
  EXPECT_EQ(statuses[3].message(), "collective broadcast timed out after 1 s: " + Where(3) +
                                       " waited for " + Where(1));
}

TEST(GlooCollective, StopToken_AbortsABlockedAllReduceAtOnce_AndItsPeerFails) {
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.rendezvous_timeout_ms = 20'000;
  options.collective_timeout_ms = 60'000;  // Far longer than the test may take.
  StopToken token0, token1;
  auto collectives = ConnectAll(2, options, &store, {&token0, &token1});
  ASSERT_TRUE(collectives[0] && collectives[1]);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    token0.RequestStop("signal 15 (Terminated): the worker stopped this rank");
  });
  std::vector<float> values = {1, 2, 3};
  const auto start = Clock::now();
  absl::Status status = collectives[0]->AllReduceMean({values.data(), DType::kF32, 1, 3, 4});
  const double waited = SecondsSince(start);
  stopper.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_NE(std::string(status.message()).find("signal 15 (Terminated)"), std::string::npos)
      << status;
  EXPECT_LT(waited, 5.0);
  // The aborted rank closed its connections: its peer fails now instead of waiting 60 s.
  const auto peer_start = Clock::now();
  absl::Status peer = collectives[1]->AllReduceMean({values.data(), DType::kF32, 1, 3, 4});
  EXPECT_FALSE(peer.ok());
  EXPECT_LT(SecondsSince(peer_start), 5.0) << peer;
  // Every later collective of the aborted rank fails at once, with the same reason.
  absl::Status again = collectives[0]->AllReduceMean({values.data(), DType::kF32, 1, 3, 4});
  EXPECT_EQ(again.code(), absl::StatusCode::kAborted) << again;
}

// gloo writes with writev, which raises SIGPIPE when the peer's socket is already gone (a peer
// that aborted or died, found by a write before gloo's event loop saw the close); SIGPIPE's
// default action would kill this rank's process, without a word, instead of failing its
// collective with an error naming the peer (seen once under load). Connecting a collective
// must leave the process immune: a SIGPIPE raised after Connect is harmless.
TEST(GlooCollective, AfterConnect_SigpipeFromAWriteToAGonePeerCannotKillTheProcess) {
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  auto collectives = ConnectAll(2, options, &store);
  ASSERT_TRUE(collectives[0] && collectives[1]);
  ASSERT_EQ(raise(SIGPIPE), 0);  // Kills the test binary unless SIGPIPE is ignored.
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  close(fds[1]);
  const char byte = 0;
  const iovec iov{const_cast<char*>(&byte), 1};
  EXPECT_EQ(writev(fds[0], &iov, 1), -1);  // As gloo's Pair::write, into a closed peer.
  EXPECT_EQ(errno, EPIPE);
  close(fds[0]);
}

TEST(GlooCollective, TokenTrippedBeforeConnect_AbortsTheFirstCollective) {
  InMemoryKeyValueStore store;
  StopToken token;
  token.RequestStop("the coordinator ended the job");
  GlooCollectiveOptions options;
  options.stop_token = &token;
  auto collective = GlooCollective::Connect(options);  // World of one.
  ASSERT_TRUE(collective.ok()) << collective.status();
  float value = 1;
  absl::Status status = (*collective)->AllReduceMean({&value, DType::kF32, 1, 1, 4});
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_NE(std::string(status.message()).find("the coordinator ended the job"),
            std::string::npos);
}

// --- Listening ports -----------------------------------------------------------------------

struct Listener {
  std::string address;
  int port = 0;
};

// The TCP sockets of this process that listen (IPv4): /proc/self/net/tcp lists the network
// namespace's sockets, /proc/self/fd names this process's by inode.
std::vector<Listener> OwnListeners() {
  std::set<std::string> own;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (!error && target.rfind("socket:[", 0) == 0) {
      own.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<Listener> listeners;
  std::ifstream table("/proc/self/net/tcp");
  std::string line;
  std::getline(table, line);  // Header.
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
        timeout >> inode;
    if (state != "0A" || own.count(inode) == 0) continue;  // 0A: TCP_LISTEN.
    in_addr address{};
    address.s_addr = static_cast<uint32_t>(std::stoul(local.substr(0, 8), nullptr, 16));
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &address, text, sizeof(text));
    listeners.push_back({text, std::stoi(local.substr(9), nullptr, 16)});
  }
  return listeners;
}

// A range of `size` ports below the kernel's ephemeral ones, different per test process.
PortRange TestPorts(int size) {
  const int lo = 20'000 + static_cast<int>(getpid() % 400) * 25;
  return PortRange{lo, lo + size - 1};
}

// Waits until this process listens on `count` sockets.
std::vector<Listener> WaitForListeners(size_t count) {
  std::vector<Listener> listeners;
  for (int i = 0; i < 500 && (listeners = OwnListeners()).size() < count; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return listeners;
}

TEST(GlooCollective, PortRange_ListensOnlyOnTheHostAddressInTheRange) {
  // Three ranks sharing one range, as the ranks of one worker do. Rank 0 joins first: while it
  // waits for its peers it listens on one socket per peer, each in the range, on 127.0.0.1.
  ASSERT_TRUE(OwnListeners().empty());
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.world_size = 3;
  options.store = &store;
  options.rendezvous_timeout_ms = 20'000;
  options.ports = TestPorts(6);
  std::unique_ptr<GlooCollective> collectives[3];
  std::thread ranks[3];
  auto start = [&](int rank) {
    ranks[rank] = std::thread([&, rank, options]() mutable {
      options.rank = rank;
      auto collective = GlooCollective::Connect(options);
      ASSERT_TRUE(collective.ok()) << collective.status();
      collectives[rank] = std::move(*collective);
    });
  };
  start(0);
  std::vector<Listener> listeners = WaitForListeners(2);
  ASSERT_EQ(listeners.size(), 2u);
  for (const Listener& listener : listeners) {
    EXPECT_EQ(listener.address, "127.0.0.1");
    EXPECT_TRUE(options.ports.Contains(listener.port))
        << listener.port << " is not in " << options.ports.ToString();
  }
  EXPECT_NE(listeners[0].port, listeners[1].port);
  start(1);
  start(2);
  for (auto& rank : ranks) rank.join();
  ASSERT_TRUE(collectives[0] && collectives[1] && collectives[2]);
  EXPECT_TRUE(OwnListeners().empty()) << "a socket still listens once every pair connected";
  std::vector<float> values[3] = {{3}, {6}, {9}};
  for (int rank = 0; rank < 3; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      Tensor value{values[rank].data(), DType::kF32, 1, 1, 4};
      EXPECT_TRUE(collectives[rank]->AllReduceMean(value).ok());
    });
  }
  for (auto& rank : ranks) rank.join();
  for (auto& value : values) EXPECT_FLOAT_EQ(value[0], 6.0f);
}

// An IPv4 address of this machine other than loopback ("" when it has none).
std::string NetworkAddress() {
  std::string found;
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return found;
  for (ifaddrs* entry = interfaces; entry != nullptr && found.empty(); entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET ||
        (entry->ifa_flags & IFF_LOOPBACK) != 0 || (entry->ifa_flags & IFF_UP) == 0) {
      continue;
    }
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr, text,
              sizeof(text));
    found = text;
  }
  freeifaddrs(interfaces);
  return found;
}

TEST(GlooCollective, PortRangeOnANetworkAddress_ListensThere) {
  // gloo finds a device's interface by its address (only 127/8 is special): not loopback here.
  const std::string host = NetworkAddress();
  if (host.empty()) {
    SKIP_OR_FAIL_UNDER_CI("this machine has no IPv4 address besides loopback (an interface "
                          "that is up, not loopback) to listen on");
  }
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.world_size = 2;
  options.host = host;
  options.store = &store;
  options.rendezvous_timeout_ms = 20'000;
  options.ports = TestPorts(2);
  // Rank 0's collective outlives its thread: closing it while rank 1 still finishes its side
  // of the handshake would fail rank 1 with "Connection closed by peer".
  absl::StatusOr<std::unique_ptr<GlooCollective>> collective0;
  std::thread rank0([options, &collective0] {
    collective0 = GlooCollective::Connect(options);
    EXPECT_TRUE(collective0.ok()) << collective0.status();
  });
  std::vector<Listener> listeners = WaitForListeners(1);
  ASSERT_EQ(listeners.size(), 1u);
  EXPECT_EQ(listeners[0].address, host);
  EXPECT_TRUE(options.ports.Contains(listeners[0].port)) << listeners[0].port;
  options.rank = 1;
  auto collective = GlooCollective::Connect(options);
  EXPECT_TRUE(collective.ok()) << collective.status();
  rank0.join();
}

TEST(GlooCollective, PortRangeFromTheEnvironment_IsUsed) {
  const PortRange ports = TestPorts(2);
  setenv(kGlooPortRangeVariable, ports.ToString().c_str(), 1);
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.world_size = 2;
  options.store = &store;
  options.rendezvous_timeout_ms = 20'000;
  // Rank 0's collective outlives its thread: closing it while rank 1 still finishes its side
  // of the handshake would fail rank 1 with "Connection closed by peer".
  absl::StatusOr<std::unique_ptr<GlooCollective>> collective0;
  std::thread rank0([options, &collective0] {
    collective0 = GlooCollective::Connect(options);
    EXPECT_TRUE(collective0.ok()) << collective0.status();
  });
  std::vector<Listener> listeners = WaitForListeners(1);
  ASSERT_EQ(listeners.size(), 1u);
  EXPECT_TRUE(ports.Contains(listeners[0].port)) << listeners[0].port;
  options.rank = 1;
  auto collective = GlooCollective::Connect(options);
  EXPECT_TRUE(collective.ok()) << collective.status();
  rank0.join();
  unsetenv(kGlooPortRangeVariable);
}

TEST(GlooCollective, MalformedPortRangeInTheEnvironment_InvalidArgumentNamingIt) {
  setenv(kGlooPortRangeVariable, "30000-20000", 1);
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.world_size = 2;
  options.store = &store;
  auto collective = GlooCollective::Connect(options);
  unsetenv(kGlooPortRangeVariable);
  ASSERT_FALSE(collective.ok());
  EXPECT_EQ(collective.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(collective.status().message().find("MPTRAIN_GLOO_PORT_RANGE"), std::string::npos)
      << collective.status();
}

TEST(GlooCollective, PortRangeAllTaken_UnavailableSayingSo) {
  // Something else listens on both ports of the range: the rank waits a little, then fails.
  const PortRange ports = TestPorts(2);
  std::vector<int> taken;
  for (int port = ports.lo; port <= ports.hi; ++port) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));  // Or taken already.
    listen(fd, 1);
    taken.push_back(fd);
  }
  InMemoryKeyValueStore store;
  GlooCollectiveOptions options;
  options.world_size = 2;
  options.store = &store;
  options.rendezvous_timeout_ms = 500;
  options.ports = ports;
  const auto start = Clock::now();
  auto collective = GlooCollective::Connect(options);
  for (int fd : taken) close(fd);
  ASSERT_FALSE(collective.ok());
  EXPECT_LT(SecondsSince(start), 5.0);
  EXPECT_EQ(collective.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(collective.status().message().find("no free port in the collective port range " +
                                               ports.ToString() + " (worker --port_range) on "
                                               "127.0.0.1 for the connection to rank 1: all 2 in use"),
            std::string::npos)
      << collective.status();
}

}  // namespace
}  // namespace mptrain
