#include "common/client_channel.h"

#include <cstdlib>
#include <mutex>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rpc_limits.h"
#include "common/small_file.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace mptrain {
namespace {

constexpr size_t kMaxTokenBytes = 4096;

// gRPC's synchronous client makes progress on a channel's connection attempt only while some
// call waits on that channel; our calls fail fast while the coordinator is away, so a channel
// that reconnects is left to gRPC's backup poller, which runs every 5 s by default. A TLS
// handshake takes three round trips: every worker and rank reached a restarted coordinator
// 15-18 s late (measured), past the 10 s self-fencing limit. Poll every 100 ms instead. The
// variable is gRPC's documented setting, read once when gRPC initialises (before the first
// channel); a value already in the environment is kept.
constexpr char kBackupPollVariable[] = "GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS";
constexpr char kBackupPollIntervalMs[] = "100";

void PollReconnectsPromptly() {
  static std::once_flag once;
  std::call_once(once, [] { setenv(kBackupPollVariable, kBackupPollIntervalMs, /*overwrite=*/0); });
}

class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(std::string token)
      : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // Outlives every call: the channel owns the factory.
};


}  // namespace

absl::StatusOr<std::string> LoadClientToken(const std::string& token_file) {
  std::string text;
  absl::string_view source = "MPTRAIN_TOKEN";
  if (!token_file.empty()) {
    absl::StatusOr<std::string> content = ReadSmallFile("--token_file", token_file,
                                                        kMaxTokenBytes);
    if (!content.ok()) return content.status();
    text = *content;
    source = "--token_file";
  } else if (const char* env = std::getenv("MPTRAIN_TOKEN")) {
    text = env;
  }
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    for (char c : line) {
      if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": the token must be one word of printable characters"));
      }
    }
    return std::string(line);
  }
  if (!token_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--token_file ", token_file, ": empty"));
  }
  return std::string();
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeCoordinatorChannel(
    const std::string& address, const ClientSecurity& security, bool own_connection) {
  PollReconnectsPromptly();
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments arguments;
  if (own_connection) arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // gRPC backs off reconnecting up to 120 s by default: a coordinator that restarts would see
  // its workers and ranks only minutes later. Retry at least once a second instead. (The
  // minimum backoff is left alone: gRPC also takes it as each attempt's connect timeout, and a
  // TLS handshake on a busy machine needs more than a few hundred milliseconds.)
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A call that waits on an open stream (trainctl watch, a long poll) learns that the
  // coordinator's host has gone within ~30 s instead of waiting on a dead connection for ever:
  // a ping every kClientKeepaliveMs while calls are open, answered within 10 s (the
  // coordinator accepts pings that often: kServerMinPingIntervalMs).
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kClientKeepaliveMs);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  // gRPC stops pinging after 2 pings with no data sent by this side (its default), and a watch
  // sends nothing after its request: without this, pings end 40 s into a quiet watch.
  arguments.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  if (!security.tls_ca.empty()) {
    grpc::SslCredentialsOptions options;
    absl::StatusOr<std::string> ca = ReadPemFile("--tls_ca", security.tls_ca);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    if (security.tls_cert.empty() != security.tls_key.empty()) {
      return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
    }
    if (!security.tls_cert.empty()) {
      absl::StatusOr<std::string> cert = ReadPemFile("--tls_cert", security.tls_cert);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadPemFile("--tls_key", security.tls_key);
      if (!key.ok()) return key.status();
      options.pem_cert_chain = *cert;
      options.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(options);
    if (!security.tls_server_name.empty()) {
      arguments.SetSslTargetNameOverride(security.tls_server_name);
    }
  } else {
    if (!security.tls_cert.empty() || !security.tls_key.empty()) {
      return absl::InvalidArgumentError("--tls_cert/--tls_key need --tls_ca");
    }
    credentials = grpc::InsecureChannelCredentials();
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  if (!security.token.empty()) {
    factories.push_back(std::make_unique<BearerTokenInterceptorFactory>(security.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, arguments,
                                                                 std::move(factories));
}

std::vector<std::string> TlsFlagsFor(const ClientSecurity& security) {
  std::vector<std::string> flags;
  if (!security.tls_ca.empty()) flags.push_back("--tls_ca=" + security.tls_ca);
  if (!security.tls_cert.empty()) flags.push_back("--tls_cert=" + security.tls_cert);
  if (!security.tls_key.empty()) flags.push_back("--tls_key=" + security.tls_key);
  if (!security.tls_server_name.empty()) {
    flags.push_back("--tls_server_name=" + security.tls_server_name);
  }
  return flags;
}

}  // namespace mptrain
