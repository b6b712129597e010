#include "coordinator/http_connections.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "spdlog/spdlog.h"

namespace mptrain {

std::string AddressRange(const sockaddr* address, socklen_t length) {
  if (address == nullptr) return "";
  if (address->sa_family == AF_INET && length >= sizeof(sockaddr_in)) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    const auto* bytes = reinterpret_cast<const char*>(&v4->sin_addr.s_addr);
    return std::string("4:") + std::string(bytes, 3);
  }
  if (address->sa_family == AF_INET6 && length >= sizeof(sockaddr_in6)) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    const auto* bytes = reinterpret_cast<const char*>(v6->sin6_addr.s6_addr);
    if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) return std::string("4:") + std::string(bytes + 12, 3);
    return std::string("6:") + std::string(bytes, 8);
  }
  return "";
}

HttpConnectionTable::HttpConnectionTable(HttpConnectionLimits limits)
    : limits_(limits), thread_([this] { Run(); }) {}

HttpConnectionTable::~HttpConnectionTable() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

bool HttpConnectionTable::MayOpen(const sockaddr* address, socklen_t length) {
  const std::string range = AddressRange(address, length);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranges_.find(range);
  if (it != ranges_.end() && it->second.open >= limits_.max_connections_per_range) {
    spdlog::debug("http: refused a connection: its address range holds {} already",
                  it->second.open);
    return false;
  }
  if (counted_ < limits_.max_connections) return true;
  if (EvictOneLocked()) return true;
  spdlog::debug("http: refused a connection: {} admitted connections are open", counted_);
  return false;
}

void HttpConnectionTable::Opened(MHD_Connection* connection, int fd, const sockaddr* address,
                                 socklen_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  Tracked tracked{fd, AddressRange(address, length), Clock::now()};
  RangeCount& count = ranges_[tracked.range];
  ++count.open;
  ++count.waiting;
  ++counted_;
  open_[connection] = std::move(tracked);
}

void HttpConnectionTable::Admitted(MHD_Connection* connection) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(connection);
  if (it == open_.end() || it->second.admitted || it->second.shut) return;
  it->second.admitted = true;
  --ranges_[it->second.range].waiting;
}

void HttpConnectionTable::Closed(MHD_Connection* connection) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(connection);
  if (it == open_.end()) return;
  Tracked& tracked = it->second;
  if (!tracked.shut) {
    auto range = ranges_.find(tracked.range);
    --range->second.open;
    if (!tracked.admitted) --range->second.waiting;
    --counted_;
    if (range->second.open == 0) ranges_.erase(range);
  }
  open_.erase(it);
}

size_t HttpConnectionTable::open_connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counted_;
}

void HttpConnectionTable::ShutLocked(Tracked& tracked, const char* why) {
  spdlog::debug("http: closing a connection {}", why);
  shutdown(tracked.fd, SHUT_RDWR);
  tracked.shut = true;
  auto range = ranges_.find(tracked.range);
  --range->second.open;
  if (!tracked.admitted) --range->second.waiting;
  --counted_;
  if (range->second.open == 0) ranges_.erase(range);
}

bool HttpConnectionTable::EvictOneLocked() {
  const std::string* busiest = nullptr;
  size_t most = 0;
  for (const auto& [range, count] : ranges_) {
    if (count.waiting > most) {
      most = count.waiting;
      busiest = &range;
    }
  }
  if (busiest == nullptr) return false;
  const std::string range = *busiest;  // ShutLocked may erase the entry.
  Tracked* oldest = nullptr;
  for (auto& [connection, tracked] : open_) {
    if (tracked.shut || tracked.admitted || tracked.range != range) continue;
    if (oldest == nullptr || tracked.opened < oldest->opened) oldest = &tracked;
  }
  if (oldest == nullptr) return false;
  ShutLocked(*oldest, "to make room: the table is full and its range holds the most waiting");
  return true;
}

void HttpConnectionTable::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping_; })) {
    const Clock::time_point now = Clock::now();
    for (auto& [connection, tracked] : open_) {
      if (tracked.shut) continue;
      const auto age = now - tracked.opened;
      if (age >= limits_.max_age) {
        ShutLocked(tracked, "past its maximum age");
      } else if (!tracked.admitted && age >= limits_.admission_deadline) {
        ShutLocked(tracked, "on which no request was admitted in time");
      }
    }
  }
}

}  // namespace mptrain
