#include "coordinator/http_server.h"

#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cstdarg>
#include <cstdio>
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/small_file.h"
#include "common/status_macros.h"
#include "coordinator/http_connections.h"
#include "coordinator/server_security.h"
#include "coordinator/web_assets.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"

namespace mptrain {
namespace {

constexpr char kCookie[] = "mptrain_token";
// The header a state-changing request sent with the cookie (or with no token at all) must
// carry, holding CsrfToken of the cookie's token: a page of another site can neither set a
// custom header on a cross-origin request without a CORS preflight (which this server never
// grants) nor compute the value without the token.
constexpr char kCsrfHeader[] = "X-CSRF-Token";

// SHA-256 of a label and the session's token, in hex: what GET /api/csrf hands the page (a
// same-origin read; no other site may read the answer) and what a cancel must send back. It
// needs no server secret, so it outlives a coordinator restart, and reveals nothing of the
// token.
std::string CsrfToken(absl::string_view session_token) {
  const std::string input = absl::StrCat("mptrain-csrf-v1:", session_token);
  unsigned char digest[32];
  if (gnutls_hash_fast(GNUTLS_DIG_SHA256, input.data(), input.size(), digest) != 0) return "";
  std::string hex;
  for (unsigned char byte : digest) absl::StrAppendFormat(&hex, "%02x", byte);
  return hex;
}

// What a request may make this server hold. libmicrohttpd reads a request's line and headers
// into a fixed per-connection pool (a larger head is answered 431 or 414, or the connection
// closed) and serves every connection from a few event-loop threads, so a slow client holds
// a connection slot, never a thread; and a slot only for so long: libmicrohttpd closes a
// connection idle for kIdleTimeoutSeconds, the connection table (http_connections.h) one on
// which no request was admitted within its admission deadline (a byte every few seconds is
// not idle) or one older than its maximum age. The table counts connections per address
// range and in all; libmicrohttpd's own cap is above the table's by the connections the
// table has shut down that libmicrohttpd has not closed yet.
constexpr size_t kConnectionMemoryBytes = 64 << 10;  // Request line + headers + the answer's head.
constexpr unsigned kConnectionsBeingClosed = 64;
constexpr unsigned kMaxConnectionsPerAddress = 32;
constexpr unsigned kIdleTimeoutSeconds = 10;
constexpr unsigned kEventThreads = 4;
constexpr size_t kMaxBodyBytes = 64 << 10;

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

int HttpCode(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: return MHD_HTTP_BAD_REQUEST;
    case absl::StatusCode::kUnauthenticated: return MHD_HTTP_UNAUTHORIZED;
    case absl::StatusCode::kPermissionDenied: return MHD_HTTP_FORBIDDEN;
    case absl::StatusCode::kNotFound: return MHD_HTTP_NOT_FOUND;
    case absl::StatusCode::kFailedPrecondition: return MHD_HTTP_CONFLICT;  // Already ended.
    default: return MHD_HTTP_INTERNAL_SERVER_ERROR;
  }
}

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// One answer, built by a route and sent by Dispatch.
struct Reply {
  int status = MHD_HTTP_OK;
  std::string body;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // Close the connection after it (an unread body may follow).

  static Reply Json(std::string json) { return {MHD_HTTP_OK, std::move(json), "application/json"}; }
  static Reply Error(int status, absl::string_view message) {
    return {status, absl::StrCat("{\"error\": ", JsonString(message), "}"), "application/json"};
  }
  static Reply Error(const absl::Status& status) {
    return Error(HttpCode(status), status.message());
  }
  static Reply Redirect(std::string location) {
    Reply reply{MHD_HTTP_FOUND, "", "text/plain"};
    reply.headers.emplace_back("Location", std::move(location));
    return reply;
  }
};

// The request as the routes see it: libmicrohttpd's parsed line, headers, query and cookies.
class Request {
  MHD_Connection* const connection_;  // First: initialised before the fields below.

 public:
  Request(MHD_Connection* connection, std::string method, std::string path)
      : connection_(connection), method(std::move(method)), path(std::move(path)) {}

  std::optional<std::string> Header(const char* name) const {
    return Lookup(MHD_HEADER_KIND, name);
  }
  std::optional<std::string> Query(const char* name) const {
    return Lookup(MHD_GET_ARGUMENT_KIND, name);
  }
  std::optional<std::string> Cookie(const char* name) const {
    return Lookup(MHD_COOKIE_KIND, name);
  }

  const std::string method;  // HEAD is answered as GET (libmicrohttpd leaves the body out).
  const std::string path;
  std::string body;          // At most kMaxBodyBytes.

 private:
  std::optional<std::string> Lookup(MHD_ValueKind kind, const char* name) const {
    const char* value = MHD_lookup_connection_value(connection_, kind, name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  }
};

// What would make this server read or build without a bound, refused before any body is read:
// a body of no stated length (chunked) or an encoded one (its decoded size unknown), a
// body-carrying method without Content-Length or with more than kMaxBodyBytes, and byte ranges
// (not served). Returns the reply, or nothing to go on.
std::optional<Reply> RefusedRequestShape(const Request& request) {
  auto refuse = [](int status, absl::string_view why) {
    Reply reply = Reply::Error(status, why);
    reply.close = true;
    return reply;
  };
  if (request.Header(MHD_HTTP_HEADER_RANGE)) {
    return refuse(MHD_HTTP_RANGE_NOT_SATISFIABLE, "byte ranges are not served");
  }
  if (request.Header(MHD_HTTP_HEADER_TRANSFER_ENCODING) ||
      request.Header(MHD_HTTP_HEADER_CONTENT_ENCODING)) {
    return refuse(MHD_HTTP_BAD_REQUEST,
                  "request bodies must be sent unencoded, with Content-Length");
  }
  const bool has_body_method =
      request.method == "POST" || request.method == "PUT" || request.method == "PATCH";
  const std::optional<std::string> length = request.Header(MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (has_body_method && (!length || length->empty())) {
    return refuse(MHD_HTTP_LENGTH_REQUIRED, "a request body needs Content-Length");
  }
  uint64_t bytes = 0;
  if (length && !length->empty() && (!absl::SimpleAtoi(*length, &bytes) || bytes > kMaxBodyBytes)) {
    return refuse(MHD_HTTP_CONTENT_TOO_LARGE,
                  absl::StrCat("request bodies are limited to ", kMaxBodyBytes, " bytes"));
  }
  return std::nullopt;
}

// The authorization header value the request carries: its own, or one made from the cookie.
std::string Authorization(const Request& request) {
  if (auto header = request.Header(MHD_HTTP_HEADER_AUTHORIZATION); header && !header->empty()) {
    return *header;
  }
  const std::optional<std::string> token = request.Cookie(kCookie);
  return token && !token->empty() ? absl::StrCat("Bearer ", *token) : "";
}

// application/x-www-form-urlencoded: the value of `key`, decoded.
std::string FormValue(const std::string& body, absl::string_view key) {
  for (absl::string_view pair : absl::StrSplit(body, '&')) {
    if (!absl::ConsumePrefix(&pair, key) || !absl::ConsumePrefix(&pair, "=")) continue;
    std::string value(pair);
    for (char& c : value) {
      if (c == '+') c = ' ';
    }
    value.resize(MHD_http_unescape(value.data()));
    return value;
  }
  return "";
}

// "/api/jobs/ID" and "/api/jobs/ID/events": the job id, when the rest matches `suffix`.
std::optional<std::string> JobIdIn(absl::string_view path, absl::string_view suffix) {
  if (!absl::ConsumePrefix(&path, "/api/jobs/") || !absl::ConsumeSuffix(&path, suffix)) {
    return std::nullopt;
  }
  if (path.empty() || path.size() > 64) return std::nullopt;
  for (char c : path) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-') return std::nullopt;
  }
  return std::string(path);
}

// The dashboard's scripts, stylesheets and the vendored uPlot: [vendor/uplot/]NAME.(js|css).
bool IsAssetPath(absl::string_view path) {
  if (!absl::ConsumePrefix(&path, "/")) return false;
  absl::ConsumePrefix(&path, "vendor/uplot/");
  if (!absl::EndsWith(path, ".js") && !absl::EndsWith(path, ".css")) return false;
  for (char c : path) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '-') return false;
  }
  return true;
}

Reply Asset(absl::string_view name) {
  const WebAsset* found = FindWebAsset(std::string(name));
  if (found == nullptr) return Reply::Error(MHD_HTTP_NOT_FOUND, "not found");
  return {MHD_HTTP_OK, std::string(found->body), std::string(found->content_type)};
}

void LogFromLibrary(void*, const char* format, va_list args) {
  char line[512];
  std::vsnprintf(line, sizeof(line), format, args);
  std::string text(line);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  spdlog::debug("http: {}", text);
}

}  // namespace

// The routes and libmicrohttpd's callbacks. What it holds is read-only once serving, but for
// the connection table (locked).
class HttpServer::Handler {
 public:
  Handler(CoordinatorState* state, const RpcMetrics* rpcs,
          std::shared_ptr<const Authenticator> authenticator, bool tls,
          bool require_client_certificate, const HttpServerOptions& options)
      : state_(state),
        rpcs_(rpcs),
        authenticator_(std::move(authenticator)),
        tls_(tls),
        require_client_certificate_(require_client_certificate),
        connections_(options.connections) {}

  // MHD_AcceptPolicyCallback: whether a connection from this address may open now.
  static MHD_Result MayOpen(void* self, const sockaddr* address, socklen_t length);
  // MHD_NotifyConnectionCallback: a connection opened (its TLS handshake not yet made) or is
  // about to be closed.
  static void Connection(void* self, MHD_Connection* connection, void** socket_context,
                         MHD_ConnectionNotificationCode code);

  // MHD_AccessHandlerCallback: called once the request's line and headers are read, then per
  // piece of its body, then once more to answer.
  static MHD_Result Dispatch(void* self, MHD_Connection* connection, const char* url,
                             const char* method, const char* version, const char* upload_data,
                             size_t* upload_data_size, void** request_state);
  // MHD_RequestCompletedCallback: the request's state goes.
  static void Completed(void* self, MHD_Connection* connection, void** request_state,
                        MHD_RequestTerminationCode why);

  size_t open_connections() const { return connections_.open_connections(); }

  // Kept while serving: libmicrohttpd reads them when it starts.
  std::string tls_cert_pem, tls_key_pem, tls_client_ca_pem;

 private:
  struct Pending {
    std::optional<Request> request;
    std::optional<Reply> early;  // Refused before its body.
  };

  static bool HasTrustedClientCertificate(MHD_Connection* connection);
  static MHD_Result Send(MHD_Connection* connection, const Reply& reply);
  // What is answered before any body is read, if anything: a request of a refused shape, or
  // not admitted (client certificate, token).
  std::optional<Reply> Gate(MHD_Connection* connection, const Request& request) const;
  Reply Route(const Request& request) const;
  Reply Login(const Request& request) const;
  Reply Cancel(const Request& request, const std::string& job_id) const;

  CoordinatorState* const state_;
  const RpcMetrics* const rpcs_;
  const std::shared_ptr<const Authenticator> authenticator_;
  const bool tls_;
  const bool require_client_certificate_;
  HttpConnectionTable connections_;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options, CoordinatorState* state, const RpcMetrics* rpcs,
    std::shared_ptr<const Authenticator> authenticator) {
  const size_t colon = options.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_listen must be HOST:PORT (port 0 = any free), got ", options.listen));
  }
  std::string host = options.listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const bool tls = !options.tls_cert.empty();
  if (!IsLoopbackListenAddress(options.listen) && !options.insecure &&
      (!tls || !authenticator->enabled())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--http_listen ", options.listen, " is off loopback: it needs --tls_cert/--tls_key and "
        "--token_file (as the gRPC port does), or --insecure"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints,
                  &resolved) != 0 ||
      resolved == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_listen: cannot resolve the host of ", options.listen));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> address(resolved, freeaddrinfo);

  auto server = std::unique_ptr<HttpServer>(new HttpServer());
  const bool enabled = authenticator->enabled();
  server->handler_ = std::make_unique<Handler>(state, rpcs, std::move(authenticator), tls,
                                               tls && !options.tls_client_ca.empty(), options);
  server->tls_ = tls;
  Handler& handler = *server->handler_;

  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
  if (address->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  std::vector<MHD_OptionItem> items = {
      // First, so that what the options below may log goes there too.
      {MHD_OPTION_EXTERNAL_LOGGER, reinterpret_cast<intptr_t>(&LogFromLibrary), nullptr},
      {MHD_OPTION_SOCK_ADDR, 0, address->ai_addr},
      {MHD_OPTION_THREAD_POOL_SIZE, kEventThreads, nullptr},
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT, kConnectionMemoryBytes, nullptr},
      {MHD_OPTION_CONNECTION_LIMIT,
       static_cast<intptr_t>(options.connections.max_connections + kConnectionsBeingClosed),
       nullptr},
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT, kMaxConnectionsPerAddress, nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT, kIdleTimeoutSeconds, nullptr},
      {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(&Handler::Completed), &handler},
      {MHD_OPTION_NOTIFY_CONNECTION, reinterpret_cast<intptr_t>(&Handler::Connection), &handler},
  };
  if (tls) {
    flags |= MHD_USE_TLS;
    ASSIGN_OR_RETURN(handler.tls_cert_pem, ReadPemFile("--tls_cert", options.tls_cert));
    ASSIGN_OR_RETURN(handler.tls_key_pem, ReadPemFile("--tls_key", options.tls_key));
    items.push_back({MHD_OPTION_HTTPS_MEM_CERT, 0, handler.tls_cert_pem.data()});
    items.push_back({MHD_OPTION_HTTPS_MEM_KEY, 0, handler.tls_key_pem.data()});
    items.push_back({MHD_OPTION_HTTPS_PRIORITIES, 0,
                     const_cast<char*>("NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2")});
    if (!options.tls_client_ca.empty()) {
      ASSIGN_OR_RETURN(handler.tls_client_ca_pem,
                       ReadPemFile("--tls_client_ca", options.tls_client_ca));
      // The trust list the handshake verifies client certificates against (Connection makes
      // one required; Gate checks again).
      items.push_back({MHD_OPTION_HTTPS_MEM_TRUST, 0, handler.tls_client_ca_pem.data()});
    }
  }
  items.push_back({MHD_OPTION_END, 0, nullptr});
  server->daemon_ = MHD_start_daemon(flags, static_cast<uint16_t>(port), &Handler::MayOpen,
                                     &handler, &Handler::Dispatch, &handler, MHD_OPTION_ARRAY,
                                     items.data(), MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve HTTP on ", options.listen,
        tls ? " (the port may be taken, or the TLS certificate, key or client CA unusable)"
            : " (the port may be taken)"));
  }
  const MHD_DaemonInfo* bound = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = bound != nullptr ? bound->port : port;
  spdlog::info("HTTP (metrics, dashboard) on {}://{}:{}{}", tls ? "https" : "http", host,
               server->port_, enabled ? ", tokens required" : "");
  return server;
}

size_t HttpServer::open_connections() const { return handler_->open_connections(); }

HttpServer::~HttpServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

MHD_Result HttpServer::Handler::Dispatch(void* self, MHD_Connection* connection, const char* url,
                                const char* method, const char*, const char* upload_data,
                                size_t* upload_data_size, void** request_state) {
  auto* handler = static_cast<Handler*>(self);
  auto* pending = static_cast<Pending*>(*request_state);
  if (pending == nullptr) {
    // First call: the line and headers are read, no body yet.
    pending = new Pending;
    *request_state = pending;
    pending->request.emplace(connection, method, url);
    pending->early = handler->Gate(connection, *pending->request);
    if (pending->early) return Send(connection, *pending->early);
    // Through the gate with credentials: from now on only idleness and age close it. The login
    // form and its stylesheet need none, so they leave a connection held to its deadline.
    const std::string& path = pending->request->path;
    if (path != "/login" && path != "/app.css") handler->connections_.Admitted(connection);
    return MHD_YES;  // Go on to the body (libmicrohttpd answers "100 Continue" if asked).
  }
  if (pending->early) {
    *upload_data_size = 0;  // Refused: its body is not kept.
    return MHD_YES;
  }
  if (*upload_data_size != 0) {
    // Within the Content-Length checked above; the library stops at that length.
    std::string& body = pending->request->body;
    const size_t take = std::min(*upload_data_size, kMaxBodyBytes - body.size());
    body.append(upload_data, take);
    *upload_data_size = 0;
    return MHD_YES;
  }
  return Send(connection, handler->Route(*pending->request));
}

void HttpServer::Handler::Completed(void*, MHD_Connection*, void** request_state,
                           MHD_RequestTerminationCode) {
  delete static_cast<Pending*>(*request_state);
  *request_state = nullptr;
}

MHD_Result HttpServer::Handler::MayOpen(void* self, const sockaddr* address, socklen_t length) {
  return static_cast<Handler*>(self)->connections_.MayOpen(address, length) ? MHD_YES : MHD_NO;
}

void HttpServer::Handler::Connection(void* self, MHD_Connection* connection, void**,
                                     MHD_ConnectionNotificationCode code) {
  auto* handler = static_cast<Handler*>(self);
  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    handler->connections_.Closed(connection);
    return;
  }
  const MHD_ConnectionInfo* fd =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
  const MHD_ConnectionInfo* peer =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (fd != nullptr) {
    const sockaddr* address = peer != nullptr ? peer->client_addr : nullptr;
    socklen_t length = 0;
    if (address != nullptr) {
      length = address->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    }
    handler->connections_.Opened(connection, fd->connect_fd, address, length);
  }
  if (!handler->require_client_certificate_) return;
  // libmicrohttpd only asks for a client certificate: require one, verified during the
  // handshake against --tls_client_ca and made for client authentication (extended key usage
  // TLS client, as OpenSSL's "sslclient" purpose), so that a client without one gets no
  // connection to hold.
  const MHD_ConnectionInfo* tls =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  if (tls == nullptr || tls->tls_session == nullptr) return;
  auto session = static_cast<gnutls_session_t>(tls->tls_session);
  gnutls_certificate_server_set_request(session, GNUTLS_CERT_REQUIRE);
  static gnutls_typed_vdata_st client_purpose = {
      GNUTLS_DT_KEY_PURPOSE_OID,
      reinterpret_cast<unsigned char*>(const_cast<char*>(GNUTLS_KP_TLS_WWW_CLIENT)), 0};
  gnutls_session_set_verify_cert2(session, &client_purpose, 1, 0);
}

std::optional<Reply> HttpServer::Handler::Gate(MHD_Connection* connection,
                                               const Request& request) const {
  if (std::optional<Reply> refused = RefusedRequestShape(request)) return refused;
  if (require_client_certificate_ && !HasTrustedClientCertificate(connection)) {
    Reply reply = Reply::Error(MHD_HTTP_FORBIDDEN,
                               "a client certificate signed by --tls_client_ca is required");
    reply.close = true;
    return reply;
  }
  // Everything but the login form and its stylesheet needs a user token.
  const std::string& path = request.path;
  if (path == "/login" || path == "/app.css") return std::nullopt;
  absl::Status status =
      authenticator_->Authorize(absl::StrCat("/http", path), Authorization(request));
  if (status.ok()) return std::nullopt;
  const bool page = !absl::StartsWith(path, "/api/") && path != "/metrics";
  Reply reply = page && status.code() == absl::StatusCode::kUnauthenticated
                    ? Reply::Redirect("/login")
                    : Reply::Error(status);
  reply.close = true;  // A body may follow, unread.
  return reply;
}

bool HttpServer::Handler::HasTrustedClientCertificate(MHD_Connection* connection) {
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  if (info == nullptr || info->tls_session == nullptr) return false;
  auto session = static_cast<gnutls_session_t>(info->tls_session);
  unsigned int peers = 0;
  if (gnutls_certificate_get_peers(session, &peers) == nullptr || peers == 0) return false;
  gnutls_typed_vdata_st purpose = {
      GNUTLS_DT_KEY_PURPOSE_OID,
      reinterpret_cast<unsigned char*>(const_cast<char*>(GNUTLS_KP_TLS_WWW_CLIENT)), 0};
  unsigned int verdict = 0;
  return gnutls_certificate_verify_peers(session, &purpose, 1, &verdict) == GNUTLS_E_SUCCESS &&
         verdict == 0;
}

MHD_Result HttpServer::Handler::Send(MHD_Connection* connection, const Reply& reply) {
  MHD_Response* response = MHD_create_response_from_buffer(
      reply.body.size(), const_cast<char*>(reply.body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  if (!reply.content_type.empty()) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, reply.content_type.c_str());
  }
  for (const auto& [name, value] : reply.headers) {
    MHD_add_response_header(response, name.c_str(), value.c_str());
  }
  // Every answer: no framing by other sites, scripts only from here, nothing cached.
  MHD_add_response_header(response, "Content-Security-Policy",
                          "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                          "frame-ancestors 'none'");
  MHD_add_response_header(response, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  if (reply.close) MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");
  const MHD_Result queued =
      MHD_queue_response(connection, static_cast<unsigned>(reply.status), response);
  MHD_destroy_response(response);
  return queued;
}

Reply HttpServer::Handler::Route(const Request& request) const {
  const bool get = request.method == "GET" || request.method == "HEAD";
  const std::string& path = request.path;  // Admitted by Gate.
  // Whose jobs the answer shows: a user's own, a viewer's or admin's all (as the gRPC reads).
  const CallerIdentity caller = authenticator_->Identify(Authorization(request));
  const JobReader reader{caller.principal, caller.reads_all_jobs};
  if (path == "/login" && request.method == "POST") return Login(request);
  const std::optional<std::string> cancelled = JobIdIn(path, "/cancel");
  if (cancelled && request.method == "POST") return Cancel(request, *cancelled);
  if (!get) {
    Reply reply = Reply::Error(MHD_HTTP_METHOD_NOT_ALLOWED,
                               "only GET (and POST /login, POST /api/jobs/ID/cancel)");
    reply.headers.emplace_back("Allow", path == "/login" || cancelled ? "GET, HEAD, POST"
                                                                      : "GET, HEAD");
    return reply;
  }
  if (path == "/api/csrf") {
    const std::optional<std::string> token = request.Cookie(kCookie);
    return Reply::Json(absl::StrCat("{\"csrf_token\": \"", CsrfToken(token.value_or("")),
                                    "\"}"));
  }
  if (path == "/") return Asset("/jobs.html");
  if (path == "/job") return Asset("/job.html");
  if (path == "/workers") return Asset("/workers.html");
  if (path == "/compare") return Asset("/compare.html");
  if (path == "/login") return Asset("/login.html");
  if (IsAssetPath(path)) return Asset(path);
  if (path == "/metrics") {
    // Per-job series of the jobs the scraper may read; the counts are of all jobs.
    return {MHD_HTTP_OK, RenderMetrics(state_->GetOverview(reader), *rpcs_),
            "text/plain; version=0.0.4; charset=utf-8"};
  }
  if (path == "/api/jobs") {
    v1::ListJobsRequest list;
    list.set_page_token(request.Query("page_token").value_or(""));
    int page_size = 0;
    if (auto text = request.Query("page_size"); text && !absl::SimpleAtoi(*text, &page_size)) {
      return Reply::Error(MHD_HTTP_BAD_REQUEST, "page_size must be a number");
    }
    list.set_page_size(page_size);
    auto jobs = state_->ListJobs(list, CoordinatorState::View::kLive, reader);
    return jobs.ok() ? Reply::Json(ToJson(*jobs)) : Reply::Error(jobs.status());
  }
  if (std::optional<std::string> id = JobIdIn(path, "")) {
    auto job = state_->GetJob(*id, CoordinatorState::View::kLive, reader);
    return job.ok() ? Reply::Json(ToJson(*job)) : Reply::Error(job.status());
  }
  if (std::optional<std::string> id = JobIdIn(path, "/events")) {
    v1::GetJobEventsRequest page;
    page.set_job_id(*id);
    int64_t after = 0;
    int limit = 0;
    std::optional<std::string> after_text = request.Query("after");
    std::optional<std::string> limit_text = request.Query("limit");
    if ((after_text && !absl::SimpleAtoi(*after_text, &after)) ||
        (limit_text && !absl::SimpleAtoi(*limit_text, &limit))) {
      return Reply::Error(MHD_HTTP_BAD_REQUEST, "after and limit are numbers");
    }
    page.set_after_sequence(after);
    page.set_max_events(limit);
    auto events = state_->GetJobEvents(page, CoordinatorState::View::kLive, reader);
    return events.ok() ? Reply::Json(ToJson(*events)) : Reply::Error(events.status());
  }
  if (path == "/api/workers") {
    v1::ListWorkersResponse workers;
    for (const auto& line : state_->GetOverview().workers) *workers.add_workers() = line.worker;
    return Reply::Json(ToJson(workers));
  }
  return Reply::Error(MHD_HTTP_NOT_FOUND, "not found");
}

// The one route that changes state. The caller needs what gRPC's CancelJob needs (a user's
// own job, an admin's any; a viewer may not; another's job is unknown, 404). A browser's
// request (the cookie, or no tokens at all) must also carry kCsrfHeader and must not say it
// comes from another site (Sec-Fetch-Site); a request with its own Authorization header is not
// one a browser sends unasked. It waits for the store to write the cancellation before it
// answers, as the gRPC call does.
Reply HttpServer::Handler::Cancel(const Request& request, const std::string& job_id) const {
  const std::string authorization = Authorization(request);
  absl::Status allowed =
      authenticator_->Authorize("/mptrain.v1.Coordinator/CancelJob", authorization);
  if (!allowed.ok()) return Reply::Error(allowed);
  const bool explicit_authorization =
      request.Header(MHD_HTTP_HEADER_AUTHORIZATION).value_or("") != "";
  if (!explicit_authorization) {
    const std::string fetch_site = request.Header("Sec-Fetch-Site").value_or("same-origin");
    if (fetch_site != "same-origin" && fetch_site != "none") {
      return Reply::Error(MHD_HTTP_FORBIDDEN,
                          "a cancel from another site's page is refused (Sec-Fetch-Site)");
    }
    const std::string expected = CsrfToken(request.Cookie(kCookie).value_or(""));
    if (expected.empty() || request.Header(kCsrfHeader).value_or("") != expected) {
      return Reply::Error(MHD_HTTP_FORBIDDEN,
                          absl::StrCat("a cancel with the session cookie needs the ",
                                       kCsrfHeader, " header of GET /api/csrf"));
    }
  }
  const CallerIdentity caller = authenticator_->Identify(authorization);
  auto state = state_->CancelJob(job_id, caller.principal, caller.admin);
  if (!state.ok()) return Reply::Error(state.status());
  return Reply::Json(absl::StrCat("{\"state\": \"", v1::JobState_Name(*state), "\"}"));
}

Reply HttpServer::Handler::Login(const Request& request) const {
  const std::string token = FormValue(request.body, "token");
  // Only a token the cookie can carry back as it is (RFC 6265's cookie-octets: no space,
  // quote, comma, semicolon or backslash); any token still works as a Bearer header.
  const bool cookie_safe = std::all_of(token.begin(), token.end(), [](char c) {
    return c > 0x20 && c < 0x7f && c != '"' && c != ',' && c != ';' && c != '\\';
  });
  absl::Status status =
      token.empty() || token.size() > 256 || !cookie_safe
          ? absl::UnauthenticatedError("no token given")
          : authenticator_->Authorize("/http/", absl::StrCat("Bearer ", token));
  if (!status.ok()) return Reply::Redirect("/login?failed=1");
  Reply reply = Reply::Redirect("/");
  reply.headers.emplace_back(
      "Set-Cookie", absl::StrCat(kCookie, "=", token, "; Path=/; HttpOnly; SameSite=Strict",
                                 tls_ ? "; Secure" : ""));
  return reply;
}

}  // namespace mptrain
