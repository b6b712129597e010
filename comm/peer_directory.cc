#include "comm/peer_directory.h"

#include <unistd.h>

#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace mptrain {
namespace {

std::string Key(int rank) { return absl::StrCat("peers/", rank); }

bool Printable(char c) { return c >= 0x20 && c < 0x7f; }

std::string Clean(const std::string& field) {
  std::string cleaned = field.substr(0, PeerDirectory::kMaxFieldBytes);
  for (char& c : cleaned) {
    if (!Printable(c)) c = '?';
  }
  return cleaned;
}

bool ValidField(std::string_view field) {
  if (field.size() > PeerDirectory::kMaxFieldBytes) return false;
  for (char c : field) {
    if (!Printable(c)) return false;
  }
  return true;
}

}  // namespace

PeerLocation LocalPeerLocation(const std::string& address) {
  char name[HOST_NAME_MAX + 1] = {};
  PeerLocation location;
  if (gethostname(name, sizeof(name) - 1) == 0) location.host_name = name;
  if (location.host_name.empty()) location.host_name = "unknown-host";
  location.address = address;
  return location;
}

PeerDirectory::PeerDirectory(KeyValueStore* store, int rank, int world_size)
    : store_(store), rank_(rank), world_size_(world_size) {}

std::string PeerDirectory::Encode(const PeerLocation& location) {
  return absl::StrCat(Clean(location.host_name), "\n", Clean(location.address));
}

absl::StatusOr<PeerLocation> PeerDirectory::Decode(std::string_view value) {
  const size_t newline = value.find('\n');
  if (newline == std::string_view::npos) {
    return absl::InvalidArgumentError("peer location: no newline between host name and address");
  }
  std::string_view host = value.substr(0, newline);
  std::string_view address = value.substr(newline + 1);
  if (!ValidField(host) || !ValidField(address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer location: fields must be printable and at most ", kMaxFieldBytes, " bytes"));
  }
  return PeerLocation{std::string(host), std::string(address)};
}

absl::Status PeerDirectory::Publish(const PeerLocation& self) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    known_[rank_] = PeerLocation{Clean(self.host_name), Clean(self.address)};
  }
  if (world_size_ <= 1 || store_ == nullptr) return absl::OkStatus();
  return store_->Set(Key(rank_), Encode(self));
}

bool PeerDirectory::Lookup(int rank, int64_t timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (known_.count(rank) > 0) return true;
  }
  if (store_ == nullptr || rank < 0 || rank >= world_size_ || timeout_ms <= 0) return false;
  absl::StatusOr<std::string> value = store_->Get(Key(rank), timeout_ms);
  if (!value.ok()) return false;
  absl::StatusOr<PeerLocation> location = Decode(*value);
  if (!location.ok()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  known_[rank] = *location;
  return true;
}

void PeerDirectory::Prefetch(const std::vector<int>& ranks, int64_t timeout_ms) {
  for (int rank : ranks) Lookup(rank, timeout_ms);
}

std::string PeerDirectory::Describe(int rank, int64_t lookup_timeout_ms) {
  if (!Lookup(rank, lookup_timeout_ms)) return absl::StrCat("rank ", rank);
  std::lock_guard<std::mutex> lock(mu_);
  const PeerLocation& location = known_[rank];
  return absl::StrCat("rank ", rank, " on ", location.host_name, " (", location.address, ")");
}

std::string PeerDirectory::RanksNamedIn(const std::string& text, int max_ranks,
                                        int64_t lookup_timeout_ms) {
  std::vector<std::string> named;
  for (int rank = 0; rank < world_size_ && rank < max_ranks; ++rank) {
    if (rank == rank_ || !Lookup(rank, lookup_timeout_ms)) continue;
    std::string address;
    {
      std::lock_guard<std::mutex> lock(mu_);
      address = known_[rank].address;
    }
    if (!address.empty() && text.find("[" + address + "]") != std::string::npos) {
      named.push_back(Describe(rank, 0));
    }
  }
  return absl::StrJoin(named, "; ");
}

std::vector<int> RingNeighbours(int rank, int world_size) {
  std::vector<int> neighbours;
  if (world_size <= 1) return neighbours;
  neighbours.push_back((rank + 1) % world_size);
  const int previous = (rank + world_size - 1) % world_size;
  if (previous != neighbours[0]) neighbours.push_back(previous);
  return neighbours;
}

std::string CollectiveTimeoutMessage(const std::string& op, int64_t timeout_ms,
                                     PeerDirectory* peers, const std::vector<int>& waited_for,
                                     const std::string& detail) {
  std::vector<std::string> names;
  for (int rank : waited_for) names.push_back(peers->Describe(rank));
  std::string message = absl::StrCat("collective ", op, " timed out after ",
                                     absl::StrFormat("%g", timeout_ms / 1000.0), " s: ",
                                     peers->Describe(peers->rank()), " waited for ",
                                     names.empty() ? "its peers" : absl::StrJoin(names, ", "));
  if (!detail.empty()) absl::StrAppend(&message, " (", detail, ")");
  return message;
}

}  // namespace mptrain
