#pragma once

// Raw TCP clients for tests of what a port does with connections that send nothing: from
// any loopback source address (all of 127.0.0.0/8 is loopback on Linux), one at a time or as a
// flood that reopens whatever the server closes.

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace mptrain::testing {

// "127.0.R.H" for `ranges` ranges from `first_range` on, hosts 1..`hosts` of each.
std::vector<std::string> LoopbackSources(int first_range, int ranges, int hosts);

// A TCP connection to 127.0.0.1:`port` from `source`, that sends nothing.
class RawConnection {
 public:
  RawConnection(int port, const std::string& source);
  ~RawConnection();
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }
  // True when the server closed it within `timeout_ms`, whatever it sent before (an HTTP/2
  // server sends its settings first). `received`: the bytes it sent.
  bool ClosedByServer(int timeout_ms, size_t* received = nullptr);

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// One idle connection per source address, each opened again as soon as the server closes it
// (as an attacker would), from a thread of its own until destroyed (at most 30 s).
class IdleFlood {
 public:
  IdleFlood(int port, std::vector<std::string> sources);
  ~IdleFlood();
  IdleFlood(const IdleFlood&) = delete;
  IdleFlood& operator=(const IdleFlood&) = delete;

  int opened() const { return opened_.load(); }  // Connections opened so far.

 private:
  void Run();

  const int port_;
  const std::vector<std::string> sources_;
  std::atomic<bool> stop_{false};
  std::atomic<int> opened_{0};
  std::thread thread_;
};

}  // namespace mptrain::testing
