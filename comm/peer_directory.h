#pragma once

// Where each rank of a job runs, so that a collective's error can say where: "collective
// allreduce timed out after 60 s: rank 0 on h1 (10.0.0.2) waited for rank 1 on h2 (10.0.0.3)".
//
// Each rank publishes its location at rendezvous through the job's key-value store (key
// "peers/<rank>", value "<host name>\n<address>"), next to the collective's own rendezvous
// data, and reads the locations of the peers it may wait for (its ring neighbours and the
// broadcast root) once every rank has joined. Any other rank is looked up when an error needs
// it, briefly; a rank whose location cannot be learnt is named by its number alone.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/key_value_store.h"

namespace mptrain {

struct PeerLocation {
  std::string host_name;  // The machine's host name.
  std::string address;    // The address its collective listens on (the worker's --host).
};

// This machine's host name with `address`.
PeerLocation LocalPeerLocation(const std::string& address);

class PeerDirectory {
 public:
  static constexpr size_t kMaxFieldBytes = 255;

  // `store` must outlive the directory; world of one: nothing is published or looked up.
  PeerDirectory(KeyValueStore* store, int rank, int world_size);

  // Publishes this rank's location (fields cut to kMaxFieldBytes, non-printable bytes as '?').
  // The store's errors.
  absl::Status Publish(const PeerLocation& self);
  // Reads these ranks' locations now, each waiting at most timeout_ms; a failure only leaves
  // that rank unknown.
  void Prefetch(const std::vector<int>& ranks, int64_t timeout_ms);
  // "rank 1 on h2 (10.0.0.3)", or "rank 1" when its location is not known and cannot be read
  // within lookup_timeout_ms. Thread-safe.
  std::string Describe(int rank, int64_t lookup_timeout_ms = 1'000);
  // The ranks (other than this one) whose address appears in `text` as "[ADDRESS]" — how gloo
  // names a peer it could not reach — described as Describe does, "; "-separated; "" when none
  // is known. Looks up at most max_ranks ranks, each within lookup_timeout_ms.
  std::string RanksNamedIn(const std::string& text, int max_ranks, int64_t lookup_timeout_ms);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // The stored form, and its strict reading: two printable fields of at most kMaxFieldBytes
  // separated by one newline (INVALID_ARGUMENT otherwise).
  static std::string Encode(const PeerLocation& location);
  static absl::StatusOr<PeerLocation> Decode(std::string_view value);

 private:
  bool Lookup(int rank, int64_t timeout_ms);  // Caches and returns whether it is known.

  KeyValueStore* store_;
  int rank_;
  int world_size_;
  std::mutex mu_;
  std::map<int, PeerLocation> known_;
};

// Ring neighbours of `rank`: who it receives from first and who it sends to, without itself
// and without duplicates (one peer in a world of two).
std::vector<int> RingNeighbours(int rank, int world_size);

// The text of a collective timeout: "collective <op> timed out after <s> s: <self> waited for
// <peers joined by ', '>" (+ " (<detail>)" when detail is not empty).
std::string CollectiveTimeoutMessage(const std::string& op, int64_t timeout_ms,
                                     PeerDirectory* peers, const std::vector<int>& waited_for,
                                     const std::string& detail = "");

}  // namespace mptrain
