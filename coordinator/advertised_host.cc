#include "coordinator/advertised_host.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mptrain {

std::optional<std::string> PeerIp(const std::string& grpc_peer) {
  if (absl::StartsWith(grpc_peer, "ipv4:")) {
    const std::string rest = grpc_peer.substr(5);
    const size_t colon = rest.rfind(':');
    return colon == std::string::npos ? rest : rest.substr(0, colon);
  }
  if (absl::StartsWith(grpc_peer, "ipv6:")) {
    // "ipv6:[addr]:port" (gRPC may also percent-encode the brackets).
    std::string rest = grpc_peer.substr(5);
    for (const auto& [encoded, plain] : {std::pair<std::string, std::string>{"%5B", "["},
                                         {"%5D", "]"}}) {
      for (size_t at; (at = rest.find(encoded)) != std::string::npos;) {
        rest.replace(at, encoded.size(), plain);
      }
    }
    const size_t open = rest.find('['), close = rest.find(']');
    if (open == std::string::npos || close == std::string::npos || close < open) return rest;
    return rest.substr(open + 1, close - open - 1);
  }
  return std::nullopt;
}

bool IsLoopbackLiteral(const std::string& host) {
  if (absl::AsciiStrToLower(host) == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  std::string bare = host;
  if (bare.size() > 2 && bare.front() == '[' && bare.back() == ']') {
    bare = bare.substr(1, bare.size() - 2);
  }
  if (inet_pton(AF_INET6, bare.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

absl::Status CheckAdvertisedHost(const std::string& host, const std::string& grpc_peer) {
  const std::optional<std::string> peer = PeerIp(grpc_peer);
  if (!peer.has_value() || IsLoopbackLiteral(*peer) || !IsLoopbackLiteral(host)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "host ", host, " is a loopback address, but this worker connects from ", *peer,
      ": ranks on other machines could not reach its ranks. Start the worker without --host "
      "(it advertises the address it reaches the coordinator from) or with --host ", *peer));
}

}  // namespace mptrain
