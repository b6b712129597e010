#pragma once

// The HTTP server's connections, as far as libmicrohttpd does not bound them: who may open one
// (a cap in all and one per client address range, an IPv4 /24 or an IPv6 /64, as one host or
// one small network holds many addresses), how long one may take to be admitted (its TLS
// handshake, a whole request head and its credentials) and how old one may grow.
//
// libmicrohttpd asks MayOpen before it takes a connection (its accept policy), says Opened and
// Closed, and the server says Admitted once a request on it passed the gate with credentials.
// A thread looks every tenth of a second and shuts down the socket of a connection past a
// deadline; libmicrohttpd then sees it end and closes it, its own way.
//
// When the cap in all is reached, a newcomer from a range under its own cap still gets in: the
// oldest not yet admitted connection of the range that holds the most such connections is
// shut down to make room. So connections that only wait (idle, or never finishing their
// handshake) cannot lock out a client from another range, and admitted ones are never pushed
// out.

#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

struct MHD_Connection;

namespace mptrain {

struct HttpConnectionLimits {
  size_t max_connections = 256;           // In all, admitted or not.
  size_t max_connections_per_range = 64;  // Per IPv4 /24 or IPv6 /64.
  // A connection on which no request was admitted this long after it opened is closed.
  std::chrono::milliseconds admission_deadline{3'000};
  std::chrono::milliseconds max_age{120'000};  // Any connection, admitted or not.
};

// The range a client address counts in: "4:" and the first 3 bytes of an IPv4 address (an
// IPv4-mapped IPv6 address counts as its IPv4 one), "6:" and the first 8 of an IPv6 one; ""
// for anything else (one range for all of them).
std::string AddressRange(const sockaddr* address, socklen_t length);

class HttpConnectionTable {
 public:
  explicit HttpConnectionTable(HttpConnectionLimits limits);
  ~HttpConnectionTable();  // Stops the thread; shuts nothing down.
  HttpConnectionTable(const HttpConnectionTable&) = delete;
  HttpConnectionTable& operator=(const HttpConnectionTable&) = delete;

  // The accept policy: false when the address's range holds its cap, or when the table is full
  // of admitted connections. Checked here and counted at Opened, so a few connections accepted
  // at the same moment by different event threads may pass a cap by one each.
  bool MayOpen(const sockaddr* address, socklen_t length);
  void Opened(MHD_Connection* connection, int fd, const sockaddr* address, socklen_t length);
  void Admitted(MHD_Connection* connection);
  // Called by libmicrohttpd before it closes the socket: from then on the fd is not touched.
  void Closed(MHD_Connection* connection);

  // Connections counted now (open, not yet shut down by this table), for tests.
  size_t open_connections() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Tracked {
    int fd = -1;
    std::string range;
    Clock::time_point opened;
    bool admitted = false;
    bool shut = false;  // Shut down by this table: no longer counted.
  };
  struct RangeCount {
    size_t open = 0;        // Not shut.
    size_t waiting = 0;     // Not shut, not admitted.
  };

  void Run();
  void ShutLocked(Tracked& tracked, const char* why);
  // Makes room for one more: shuts down the oldest waiting connection of the range with the
  // most waiting ones. False when no connection is waiting.
  bool EvictOneLocked();

  const HttpConnectionLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::map<MHD_Connection*, Tracked> open_;
  std::map<std::string, RangeCount> ranges_;
  size_t counted_ = 0;  // Not shut.
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace mptrain
