#include "worker/address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mptrain {
namespace {

// Splits HOST:PORT (and [V6]:PORT).
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  if (!address.empty() && address[0] == '[') {
    const size_t end = address.find(']');
    if (end == std::string::npos || end + 1 >= address.size() || address[end + 1] != ':') {
      return false;
    }
    *host = address.substr(1, end - 1);
    *port = address.substr(end + 2);
    return true;
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  return !host->empty();
}

bool IsLoopback(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    return (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    return IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr);
  }
  return false;
}

bool SameAddress(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    return IN6_ARE_ADDR_EQUAL(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                              &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr);
  }
  return false;
}

bool InEnvironment(char** env, const std::string& name) {
  for (char** entry = env; env != nullptr && *entry != nullptr; ++entry) {
    if (absl::StartsWith(*entry, name + "=")) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::string> LocalAddressTowards(const std::string& coordinator) {
  std::string host, port;
  if (!SplitHostPort(coordinator, &host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator must be HOST:PORT, got \"", coordinator, "\""));
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve the coordinator's host ", host, ": ", gai_strerror(error)));
  }
  std::string last_error = "no address";
  for (addrinfo* candidate = found; candidate != nullptr; candidate = candidate->ai_next) {
    const int fd = socket(candidate->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (connect(fd, candidate->ai_addr, candidate->ai_addrlen) != 0) {
      last_error = strerror(errno);
      close(fd);
      continue;
    }
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    char text[INET6_ADDRSTRLEN] = {};
    const bool named = getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
    close(fd);
    if (!named) continue;
    const void* raw = local.ss_family == AF_INET
                          ? static_cast<const void*>(
                                &reinterpret_cast<const sockaddr_in*>(&local)->sin_addr)
                          : static_cast<const void*>(
                                &reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr);
    if (inet_ntop(local.ss_family, raw, text, sizeof(text)) == nullptr) continue;
    freeaddrinfo(found);
    return std::string(text);
  }
  freeaddrinfo(found);
  return absl::UnavailableError(
      absl::StrCat("no route to the coordinator's host ", host, ": ", last_error));
}

bool ResolvesToLoopback(const std::string& address) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(address.c_str(), nullptr, &hints, &found) != 0) return false;
  bool all_loopback = found != nullptr;
  for (addrinfo* candidate = found; candidate != nullptr; candidate = candidate->ai_next) {
    all_loopback &= IsLoopback(candidate->ai_addr);
  }
  freeaddrinfo(found);
  return all_loopback;
}

absl::StatusOr<std::string> ChooseAdvertisedHost(const std::string& host_flag,
                                                 const std::string& coordinator) {
  absl::StatusOr<std::string> towards = LocalAddressTowards(coordinator);
  if (host_flag.empty()) return towards;
  // A coordinator reached over loopback means a one-machine cluster: loopback is fine.
  if (towards.ok() && !ResolvesToLoopback(*towards) && ResolvesToLoopback(host_flag)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--host ", host_flag, " is a loopback address (", host_flag,
        " resolves to 127.x or ::1 here), but the coordinator is reached from ", *towards,
        ": ranks on other machines could not connect to this worker's ranks. Leave --host out "
        "(this worker would use ", *towards, ") or pass an address other machines reach"));
  }
  return host_flag;
}

absl::StatusOr<std::string> InterfaceForAddress(const std::string& address) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int error = getaddrinfo(address.c_str(), nullptr, &hints, &found); error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", address, ": ", gai_strerror(error)));
  }
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) {
    const int error = errno;
    freeaddrinfo(found);
    return absl::UnavailableError(
        absl::StrCat("cannot list this machine's interfaces: ", strerror(error)));
  }
  std::string name;
  for (addrinfo* candidate = found; candidate != nullptr && name.empty();
       candidate = candidate->ai_next) {
    const bool loopback = IsLoopback(candidate->ai_addr);
    for (ifaddrs* entry = interfaces; entry != nullptr; entry = entry->ifa_next) {
      if (entry->ifa_addr == nullptr) continue;
      // 127.0.1.1 is on no interface's list, yet the loopback interface holds all of 127/8.
      const bool match = SameAddress(candidate->ai_addr, entry->ifa_addr) ||
                         (loopback && (entry->ifa_flags & IFF_LOOPBACK) != 0);
      if (match) {
        name = entry->ifa_name;
        break;
      }
    }
  }
  freeifaddrs(interfaces);
  freeaddrinfo(found);
  if (name.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no network interface of this machine holds ", address));
  }
  return name;
}

std::vector<std::string> NcclInterfaceEnvironment(const std::string& address,
                                                  const std::string& interface,
                                                  char** user_env) {
  std::vector<std::string> env;
  if (!InEnvironment(user_env, "NCCL_SOCKET_IFNAME")) {
    env.push_back("NCCL_SOCKET_IFNAME==" + interface);  // "=NAME": exactly NAME, no prefix.
  }
  if (!InEnvironment(user_env, "NCCL_SOCKET_FAMILY")) {
    addrinfo hints{};
    hints.ai_flags = AI_NUMERICHOST;
    addrinfo* found = nullptr;
    if (getaddrinfo(address.c_str(), nullptr, &hints, &found) == 0) {
      if (found->ai_family == AF_INET) env.push_back("NCCL_SOCKET_FAMILY=AF_INET");
      if (found->ai_family == AF_INET6) env.push_back("NCCL_SOCKET_FAMILY=AF_INET6");
      freeaddrinfo(found);
    }
  }
  return env;
}

absl::StatusOr<PortRange> PortRangeForSlots(const std::string& text, int slots) {
  if (text.empty()) return PortRange{};
  absl::StatusOr<PortRange> range = ParsePortRange(text, "--port_range");
  if (!range.ok()) return range.status();
  if (range->size() < slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--port_range ", text, " has ", range->size(), range->size() == 1 ? " port" : " ports",
        " but this worker runs ", slots, " ranks at once (--slots): give it at least ", slots,
        " (a rank listens on one port per peer while it connects: slots x (largest world size "
        "- 1) ports never run short)"));
  }
  return range;
}

}  // namespace mptrain
