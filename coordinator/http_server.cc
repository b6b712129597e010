#include "coordinator/http_server.h"

#include <httplib.h>  // CPPHTTPLIB_OPENSSL_SUPPORT comes from //third_party/system:httplib

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "coordinator/server_security.h"
#include "coordinator/web_assets.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"

namespace mptrain {
namespace {

// Each connection holds a thread while it is read (cpp-httplib reads blocking, with a timeout
// per read): enough threads that a few slow clients do not stall /metrics for everyone.
constexpr int kHandlerThreads = 16;
constexpr size_t kMaxQueuedConnections = 64;
constexpr size_t kMaxBodyBytes = 64 << 10;
constexpr char kCookie[] = "mptrain_token";

// cpp-httplib's own pool queues without bound; this one makes the accept loop wait instead.
class BoundedTaskQueue final : public httplib::TaskQueue {
 public:
  BoundedTaskQueue(int threads, size_t max_queued) : max_queued_(max_queued) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~BoundedTaskQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    room_.wait(lock, [this] { return stopping_ || jobs_.size() < max_queued_; });
    if (stopping_) return;
    jobs_.push_back(std::move(fn));
    work_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    work_.notify_all();
    room_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }

 private:
  void Run() {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
        room_.notify_one();
      }
      job();
    }
  }

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable work_, room_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

int HttpCode(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    default: return 500;
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

void SendError(httplib::Response& response, const absl::Status& status) {
  response.status = HttpCode(status);
  response.set_content(absl::StrCat("{\"error\": ", JsonString(status.message()), "}"),
                       "application/json");
}

// What cpp-httplib (Debian 12's 0.11.4) would read or build without a bound, refused before
// any body is read (the pre-routing handler runs first): a body of no stated length (chunked,
// which set_payload_max_length does not cover) or an encoded one (its decoded size unknown), a
// body-carrying method without Content-Length, and byte ranges (one copy of the content per
// range, in memory). Returns the HTTP status to answer with, or 0 to go on.
int RefusedRequestShape(const httplib::Request& request, std::string* why) {
  if (request.has_header("Range")) {
    *why = "byte ranges are not served";
    return 416;
  }
  if (request.has_header("Transfer-Encoding") || request.has_header("Content-Encoding")) {
    *why = "request bodies must be sent unencoded, with Content-Length";
    return 400;
  }
  const bool has_body_method =
      request.method == "POST" || request.method == "PUT" || request.method == "PATCH";
  if (has_body_method && !request.has_header("Content-Length")) {
    *why = "a request body needs Content-Length";
    return 411;
  }
  return 0;
}

std::string CookieToken(const httplib::Request& request) {
  for (absl::string_view part : absl::StrSplit(request.get_header_value("Cookie"), ';')) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::ConsumePrefix(&part, absl::StrCat(kCookie, "="))) return std::string(part);
  }
  return "";
}

// The authorization header value the request carries: its own, or one made from the cookie.
std::string Authorization(const httplib::Request& request) {
  std::string header = request.get_header_value("Authorization");
  if (!header.empty()) return header;
  const std::string token = CookieToken(request);
  return token.empty() ? "" : absl::StrCat("Bearer ", token);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options, const CoordinatorState* state, const RpcMetrics* rpcs,
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
  auto server = std::unique_ptr<HttpServer>(new HttpServer());
  server->state_ = state;
  server->rpcs_ = rpcs;
  server->authenticator_ = std::move(authenticator);
  server->tls_ = tls;
  if (tls) {
    server->server_ = std::make_unique<httplib::SSLServer>(
        options.tls_cert.c_str(), options.tls_key.c_str(),
        options.tls_client_ca.empty() ? nullptr : options.tls_client_ca.c_str());
    if (!server->server_->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--http_listen: cannot use the TLS certificate ", options.tls_cert, " and key ",
          options.tls_key, options.tls_client_ca.empty() ? "" : " and client CA ",
          options.tls_client_ca));
    }
  } else {
    server->server_ = std::make_unique<httplib::Server>();
  }
  httplib::Server& http = *server->server_;
  http.new_task_queue = [] { return new BoundedTaskQueue(kHandlerThreads, kMaxQueuedConnections); };
  http.set_payload_max_length(kMaxBodyBytes);
  http.set_read_timeout(5, 0);
  http.set_write_timeout(5, 0);
  http.set_keep_alive_max_count(100);
  server->Route();
  if (port == 0) {
    port = http.bind_to_any_port(host);
  } else if (!http.bind_to_port(host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ", options.listen));
  }
  server->port_ = port;
  server->thread_ = std::thread([raw = server.get()] { raw->server_->listen_after_bind(); });
  spdlog::info("HTTP (metrics, dashboard) on {}://{}:{}{}", tls ? "https" : "http", host, port,
               server->authenticator_->enabled() ? ", tokens required" : "");
  return server;
}

HttpServer::~HttpServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpServer::Route() {
  httplib::Server& http = *server_;
  const bool secure_cookie = tls_;
  // Every response: no framing by other sites, scripts only from here.
  http.set_post_routing_handler([](const httplib::Request&, httplib::Response& response) {
    response.set_header("Content-Security-Policy",
                        "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                        "frame-ancestors 'none'");
    response.set_header("X-Content-Type-Options", "nosniff");
    response.set_header("Cache-Control", "no-store");
  });
  // The gate: everything but the login form and its stylesheet needs a user token.
  http.set_pre_routing_handler([this](const httplib::Request& request,
                                      httplib::Response& response) {
    std::string why;
    if (const int code = RefusedRequestShape(request, &why); code != 0) {
      response.status = code;
      response.set_header("Connection", "close");  // An unread body may follow.
      response.set_content(absl::StrCat("{\"error\": ", JsonString(why), "}"),
                           "application/json");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (request.path == "/login" || request.path == "/app.css") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    absl::Status status = authenticator_->Authorize(
        absl::StrCat("/http", request.path), Authorization(request));
    if (status.ok()) return httplib::Server::HandlerResponse::Unhandled;
    const bool page = !absl::StartsWith(request.path, "/api/") && request.path != "/metrics";
    if (page && status.code() == absl::StatusCode::kUnauthenticated) {
      response.set_redirect("/login");
    } else {
      SendError(response, status);
    }
    return httplib::Server::HandlerResponse::Handled;
  });

  auto asset = [](const std::string& name) {
    return [name](const httplib::Request&, httplib::Response& response) {
      const WebAsset* found = FindWebAsset(name);
      if (found == nullptr) {
        response.status = 404;
        return;
      }
      response.set_content(std::string(found->body), found->content_type);
    };
  };
  http.Get("/", asset("/jobs.html"));
  http.Get("/job", asset("/job.html"));
  http.Get("/workers", asset("/workers.html"));
  http.Get("/login", asset("/login.html"));
  http.Get(R"(/((?:vendor/uplot/)?[a-zA-Z0-9_.-]+\.(?:js|css)))",
           [](const httplib::Request& request, httplib::Response& response) {
             const WebAsset* found = FindWebAsset(request.path);
             if (found == nullptr) {
               response.status = 404;
               return;
             }
             response.set_content(std::string(found->body), found->content_type);
           });
  http.Post("/login", [this, secure_cookie](const httplib::Request& request,
                                            httplib::Response& response) {
    const std::string token = request.get_param_value("token");
    absl::Status status =
        token.empty() || token.size() > 256 || token.find_first_of(" ;\r\n") != std::string::npos
            ? absl::UnauthenticatedError("no token given")
            : authenticator_->Authorize("/http/", absl::StrCat("Bearer ", token));
    if (!status.ok()) {
      response.set_redirect("/login?failed=1");
      return;
    }
    response.set_header("Set-Cookie",
                        absl::StrCat(kCookie, "=", token, "; Path=/; HttpOnly; SameSite=Strict",
                                     secure_cookie ? "; Secure" : ""));
    response.set_redirect("/");
  });

  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(RenderMetrics(state_->GetOverview(), *rpcs_),
                         "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/api/jobs", [this](const httplib::Request& request, httplib::Response& response) {
    v1::ListJobsRequest list;
    list.set_page_token(request.get_param_value("page_token"));
    int page_size = 0;
    if (request.has_param("page_size") &&
        !absl::SimpleAtoi(request.get_param_value("page_size"), &page_size)) {
      SendError(response, absl::InvalidArgumentError("page_size must be a number"));
      return;
    }
    list.set_page_size(page_size);
    auto jobs = state_->ListJobs(list);
    if (!jobs.ok()) return SendError(response, jobs.status());
    response.set_content(ToJson(*jobs), "application/json");
  });
  http.Get(R"(/api/jobs/([A-Za-z0-9_-]{1,64}))",
           [this](const httplib::Request& request, httplib::Response& response) {
             auto job = state_->GetJob(request.matches[1]);
             if (!job.ok()) return SendError(response, job.status());
             response.set_content(ToJson(*job), "application/json");
           });
  http.Get(R"(/api/jobs/([A-Za-z0-9_-]{1,64})/events)",
           [this](const httplib::Request& request, httplib::Response& response) {
             v1::GetJobEventsRequest page;
             page.set_job_id(request.matches[1]);
             int64_t after = 0;
             int limit = 0;
             if ((request.has_param("after") &&
                  !absl::SimpleAtoi(request.get_param_value("after"), &after)) ||
                 (request.has_param("limit") &&
                  !absl::SimpleAtoi(request.get_param_value("limit"), &limit))) {
               SendError(response, absl::InvalidArgumentError("after and limit are numbers"));
               return;
             }
             page.set_after_sequence(after);
             page.set_max_events(limit);
             auto events = state_->GetJobEvents(page);
             if (!events.ok()) return SendError(response, events.status());
             response.set_content(ToJson(*events), "application/json");
           });
  http.Get("/api/workers", [this](const httplib::Request&, httplib::Response& response) {
    v1::ListWorkersResponse workers;
    for (const auto& line : state_->GetOverview().workers) *workers.add_workers() = line.worker;
    response.set_content(ToJson(workers), "application/json");
  });
}

}  // namespace mptrain
