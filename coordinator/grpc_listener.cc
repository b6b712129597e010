#include "coordinator/grpc_listener.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace mptrain {
namespace {

// The client's address, without its port: what the per-address cap counts. An IPv6 client
// counts by its /64 (one host usually holds a whole /64, and may pick any address of it); an
// IPv4-mapped IPv6 address counts as its IPv4 one.
std::string AddressKey(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    return std::string(reinterpret_cast<const char*>(&v4.sin_addr), 4);
  }
  if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    const auto* bytes = reinterpret_cast<const char*>(v6.sin6_addr.s6_addr);
    if (IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) return std::string(bytes + 12, 4);
    return std::string(bytes, 8);
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcListener>> GrpcListener::Bind(const std::string& listen,
                                                                  GrpcConnectionLimits limits) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen must be HOST:PORT (port 0 = any free), got ", listen));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints,
                  &resolved) != 0 ||
      resolved == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen: cannot resolve the host of ", listen));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(resolved, freeaddrinfo);
  bool any_ipv4 = false;
  for (const addrinfo* a = resolved; a != nullptr; a = a->ai_next) {
    any_ipv4 = any_ipv4 || a->ai_family == AF_INET;
  }

  auto listener = std::unique_ptr<GrpcListener>(new GrpcListener(limits));
  std::string why;
  for (const addrinfo* a = resolved; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // Not SO_REUSEPORT: a second coordinator on the same address must fail to start.
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    // The IPv6 socket takes IPv4 too unless an IPv4 one of its own is bound beside it.
    if (a->ai_family == AF_INET6 && any_ipv4) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on));
    }
    sockaddr_storage address{};
    std::memcpy(&address, a->ai_addr, a->ai_addrlen);
    if (listener->port_ != 0) {  // Every address on the port the first one got.
      auto* port_field = a->ai_family == AF_INET
                             ? &reinterpret_cast<sockaddr_in&>(address).sin_port
                             : &reinterpret_cast<sockaddr_in6&>(address).sin6_port;
      *port_field = htons(static_cast<uint16_t>(listener->port_));
    }
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), a->ai_addrlen) != 0 ||
        ::listen(fd, SOMAXCONN) != 0) {
      why = std::strerror(errno);
      close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
    listener->port_ = ntohs(bound.ss_family == AF_INET
                                ? reinterpret_cast<sockaddr_in&>(bound).sin_port
                                : reinterpret_cast<sockaddr_in6&>(bound).sin6_port);
    listener->listen_fds_.push_back(fd);
  }
  if (listener->listen_fds_.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, ": ", why));
  }
  listener->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (listener->wake_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen,
                                               ": eventfd: ", std::strerror(errno)));
  }
  return listener;
}

GrpcListener::~GrpcListener() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  for (int fd : listen_fds_) close(fd);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void GrpcListener::Start(grpc::experimental::ExternalConnectionAcceptor* acceptor) {
  thread_ = std::thread([this, acceptor] { Run(acceptor); });
}

size_t GrpcListener::open_connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return handed_.size();
}

void GrpcListener::Run(grpc::experimental::ExternalConnectionAcceptor* acceptor) {
  std::vector<pollfd> ready;
  for (int fd : listen_fds_) ready.push_back({fd, POLLIN, 0});
  ready.push_back({wake_fd_, POLLIN, 0});
  while (true) {
    const int n = poll(ready.data(), ready.size(), 100);
    if (ready.back().revents != 0) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (std::chrono::steady_clock::now() - last_sweep_ >= std::chrono::milliseconds(100)) {
        ForgetClosedLocked(kSweepBatch);
      }
    }
    if (n <= 0) continue;
    for (size_t i = 0; i + 1 < ready.size(); ++i) {
      if (ready[i].revents != 0) AcceptFrom(ready[i].fd, acceptor);
    }
  }
}

void GrpcListener::AcceptFrom(int listen_fd,
                              grpc::experimental::ExternalConnectionAcceptor* acceptor) {
  // A bounded batch, so that under a flood the loop still looks at its stop signal and for
  // closed connections.
  for (int batch = 0; batch < 256; ++batch) {
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &length,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: the waiting connections stay queued until some close.
        spdlog::warn("gRPC port: cannot accept a connection: {}", std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      return;  // EAGAIN: none left; anything else: the client gave up.
    }
    const std::string address = AddressKey(peer);
    struct stat socket_stat {};
    bool admitted = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto at_cap = [&] {
        return handed_.size() >= limits_.max_connections ||
               per_address_[address] >= limits_.max_connections_per_address;
      };
      // The count may be up to a tenth of a second old; under a flood of refusals, looked at
      // again at most every 10 ms (each look is a stat per connection).
      const auto now = std::chrono::steady_clock::now();
      if (at_cap() && now - last_sweep_ >= std::chrono::milliseconds(10)) {
        ForgetClosedLocked(kSweepBatch);
      }
      if (!at_cap() && fstat(fd, &socket_stat) == 0) {
        handed_.push_back({fd, socket_stat.st_dev, socket_stat.st_ino, address});
        ++per_address_[address];
        admitted = true;
      } else if (per_address_[address] == 0) {
        per_address_.erase(address);
      }
    }
    if (!admitted) {
      spdlog::debug("gRPC port: refused a connection: at the cap (--grpc_max_connections "
                    "or --grpc_max_connections_per_address)");
      close(fd);
      continue;
    }
    const int on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters handing;
    handing.listener_fd = listen_fd;
    handing.fd = fd;
    acceptor->HandleNewConnection(&handing);  // The fd is gRPC's from here on.
  }
}

void GrpcListener::ForgetClosedLocked(size_t batch) {
  last_sweep_ = std::chrono::steady_clock::now();
  if (sweep_cursor_ >= handed_.size()) sweep_cursor_ = 0;
  for (size_t looked = 0; looked < batch && sweep_cursor_ < handed_.size(); ++looked) {
    const Handed& handed = handed_[sweep_cursor_];
    struct stat now {};
    const bool same_socket = fstat(handed.fd, &now) == 0 && now.st_dev == handed.device &&
                             now.st_ino == handed.inode;
    if (same_socket) {
      ++sweep_cursor_;
      continue;
    }
    auto count = per_address_.find(handed.address);
    if (--count->second == 0) per_address_.erase(count);
    // The last one takes its place (the order does not matter) and is looked at next.
    if (sweep_cursor_ + 1 < handed_.size()) handed_[sweep_cursor_] = std::move(handed_.back());
    handed_.pop_back();
  }
}

}  // namespace mptrain
