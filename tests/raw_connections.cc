#include "tests/raw_connections.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace mptrain::testing {
namespace {

using Clock = std::chrono::steady_clock;

// A socket bound to `source` and connecting to 127.0.0.1:`port`; -1 when it cannot.
int ConnectFrom(int port, const std::string& source, bool nonblocking) {
  const int fd = socket(AF_INET, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || inet_pton(AF_INET, source.c_str(), &from.sin_addr) != 1 ||
      bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0 &&
       !(nonblocking && errno == EINPROGRESS))) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::vector<std::string> LoopbackSources(int first_range, int ranges, int hosts) {
  std::vector<std::string> sources;
  for (int range = first_range; range < first_range + ranges; ++range) {
    for (int host = 1; host <= hosts; ++host) {
      sources.push_back(absl::StrCat("127.0.", range, ".", host));
    }
  }
  return sources;
}

RawConnection::RawConnection(int port, const std::string& source)
    : fd_(ConnectFrom(port, source, /*nonblocking=*/false)), connected_(fd_ >= 0) {}

RawConnection::~RawConnection() {
  if (fd_ >= 0) close(fd_);
}

bool RawConnection::ClosedByServer(int timeout_ms, size_t* received) {
  const auto give_up = Clock::now() + std::chrono::milliseconds(timeout_ms);
  size_t got = 0;
  bool closed = false;
  while (!closed && fd_ >= 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now()).count();
    pollfd ready{fd_, POLLIN, 0};
    if (left <= 0 || poll(&ready, 1, static_cast<int>(left)) != 1) break;
    char buffer[256];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else {
      closed = true;
    }
  }
  if (received != nullptr) *received = got;
  return closed;
}

IdleFlood::IdleFlood(int port, std::vector<std::string> sources)
    : port_(port), sources_(std::move(sources)), thread_([this] { Run(); }) {}

IdleFlood::~IdleFlood() {
  stop_ = true;
  thread_.join();
}

void IdleFlood::Run() {
  std::vector<int> fds(sources_.size(), -1);
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  while (!stop_ && Clock::now() < give_up) {
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i] >= 0) continue;
      fds[i] = ConnectFrom(port_, sources_[i], /*nonblocking=*/true);
      if (fds[i] >= 0) ++opened_;
    }
    std::vector<pollfd> ready;
    for (int fd : fds) ready.push_back({fd, POLLIN, 0});
    if (poll(ready.data(), ready.size(), 50) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      char byte;
      if (ready[i].revents != 0 && recv(fds[i], &byte, 1, MSG_DONTWAIT) <= 0) {
        close(fds[i]);
        fds[i] = -1;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // Spares the shared CPUs.
  }
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
}

}  // namespace mptrain::testing
