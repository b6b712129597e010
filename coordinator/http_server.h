#pragma once

// The coordinator's HTTP side (--http_listen): /metrics for Prometheus, a JSON API over the
// state (/api/jobs, /api/jobs/ID, /api/jobs/ID/events?after=N, /api/workers) and the dashboard
// pages that read it (/, /job?id=ID, /workers), with their scripts and the vendored uPlot
// served from the binary: no page needs the internet.
//
// Security follows the gRPC port: with a token table, every request needs a user, viewer or
// admin token, and shows a user its own jobs only (the JSON, the pages that read it, and the
// per-job series of /metrics; another's job is NOT_FOUND), a viewer or admin every job. The
// token comes as `Authorization: Bearer TOKEN` (Prometheus, curl) or the cookie set by the
// login form (browsers); with --tls_cert, HTTPS with the same certificate (and, with
// --tls_client_ca, the same client certificates). Off loopback, TLS and tokens are required
// unless --insecure. Nothing here changes state: every route but the login form is GET.
//
// Bounded (GNU libmicrohttpd): a request's line and headers are read into 64 KiB per
// connection (a larger head is answered 431/414 and the connection closed), 256 connections
// in all, 64 per client address range (IPv4 /24, IPv6 /64) and 32 per address; a connection
// on which no request was admitted (TLS handshake, whole head, credentials) within 3 s is
// closed, any after 10 s without traffic or 2 minutes in all (http_connections.h). When all
// 256 are taken, a newcomer takes the place of a connection not yet admitted from the range
// that holds the most of those. Served by 4 event-loop threads, so a slow client holds a
// connection slot for a while, never a thread; request bodies only with Content-Length, at
// most 64 KiB, read only once the request is admitted. With --tls_client_ca a client
// certificate (for client authentication, signed by that CA) is required in the handshake.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator_state.h"
#include "coordinator/http_connections.h"
#include "coordinator/metrics.h"

struct MHD_Daemon;

namespace mptrain {

struct HttpServerOptions {
  std::string listen;  // HOST:PORT (port 0: any free)
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  bool insecure = false;
  // Caps and deadlines of connections (tests shorten them).
  HttpConnectionLimits connections;
};

class HttpServer {
 public:
  // INVALID_ARGUMENT: a malformed listen address. FAILED_PRECONDITION: off loopback without
  // TLS and tokens (and not insecure). UNAVAILABLE: the port cannot be bound.
  // `state` is changed only by POST /api/jobs/ID/cancel (the dashboard's cancel button).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpServerOptions& options, CoordinatorState* state, const RpcMetrics* rpcs,
      std::shared_ptr<const Authenticator> authenticator);
  ~HttpServer();  // Stops serving.

  int port() const { return port_; }
  bool tls() const { return tls_; }
  // Connections the connection table counts now (tests await a flood's with it).
  size_t open_connections() const;

 private:
  class Handler;  // The routes, called from libmicrohttpd's threads (http_server.cc).

  HttpServer() = default;

  std::unique_ptr<Handler> handler_;
  MHD_Daemon* daemon_ = nullptr;  // Stopped before handler_ goes.
  int port_ = 0;
  bool tls_ = false;
};

}  // namespace mptrain
