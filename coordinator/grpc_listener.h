#pragma once

// The gRPC port's listening socket, accepted here rather than by gRPC, because gRPC 1.51 caps
// neither connections in all nor per client (GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS came
// later): a connection past a cap is closed at once; the others are handed to the server
// through its external connection acceptor, where the TLS handshake, the handshake deadline
// (GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, set by the caller) and everything after are gRPC's.
//
// gRPC does not say when it closes a connection it was handed: the listener notes each one's
// socket (fd, device, inode) and finds it gone when that fd no longer names that socket. It
// looks at up to kSweepBatch of them every tenth of a second, in turn (a look is a syscall:
// all 50,000 connections of a large pool ten times a second would take a sixth of a core), so
// a closed connection's place is free again within a tenth of a second per kSweepBatch held.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/server_builder.h"

namespace mptrain {

struct GrpcConnectionLimits {
  size_t max_connections = 8192;
  // One host's (an IPv4 address, an IPv6 /64): a worker of the most slots (1,024) and its
  // ranks fit twice.
  size_t max_connections_per_address = 2048;
};

class GrpcListener {
 public:
  // Binds every address HOST resolves to (one port; port 0: any free) and listens.
  // INVALID_ARGUMENT: not HOST:PORT, or HOST does not resolve. UNAVAILABLE: cannot bind.
  static absl::StatusOr<std::unique_ptr<GrpcListener>> Bind(const std::string& listen,
                                                            GrpcConnectionLimits limits);
  ~GrpcListener();  // Stops accepting; connections already handed over stay the server's.
  GrpcListener(const GrpcListener&) = delete;
  GrpcListener& operator=(const GrpcListener&) = delete;

  int port() const { return port_; }

  // Accepts from now on, handing each connection within the caps to `acceptor`, whose server
  // must be started (and outlive this listener's accepting: destroy the listener first).
  void Start(grpc::experimental::ExternalConnectionAcceptor* acceptor);

  // Connections handed over and not yet found closed (tests await a flood's with it).
  size_t open_connections() const;

  // How many handed connections one sweep looks at.
  static constexpr size_t kSweepBatch = 4096;

 private:
  struct Handed {
    int fd = -1;
    dev_t device = 0;
    ino_t inode = 0;
    std::string address;
  };

  GrpcListener(GrpcConnectionLimits limits) : limits_(limits) {}
  void Run(grpc::experimental::ExternalConnectionAcceptor* acceptor);
  void AcceptFrom(int listen_fd, grpc::experimental::ExternalConnectionAcceptor* acceptor);
  // Looks at up to `batch` handed connections from the cursor on, forgetting the closed ones.
  void ForgetClosedLocked(size_t batch);

  const GrpcConnectionLimits limits_;
  std::vector<int> listen_fds_;
  int wake_fd_ = -1;  // An eventfd: written to stop.
  int port_ = 0;
  mutable std::mutex mu_;
  std::vector<Handed> handed_;
  size_t sweep_cursor_ = 0;  // Where the next ForgetClosedLocked starts in handed_.
  std::map<std::string, size_t> per_address_;
  std::chrono::steady_clock::time_point last_sweep_;  // Of ForgetClosedLocked.
  std::thread thread_;
};

}  // namespace mptrain
