// The coordinator's HTTP server against hostile and ordinary clients, over real loopback
// sockets: what a request may make it hold (head, body, connections, threads) and the gate.

#include "coordinator/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/test_job_spec.h"
#include "gtest/gtest.h"
#include "tests/raw_connections.h"

namespace mptrain {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUserToken[] = "user-token-0123456789abcdef";
constexpr char kWorkerToken[] = "worker-token-0123456789abcdef";
constexpr char kCommaToken[] = "comma,token-0123456789abcdef";
constexpr char kBobToken[] = "bob-token-0123456789abcdef";
constexpr char kViewerToken[] = "viewer-token-0123456789abcdef";

// One client connection, from `source` (an IPv4 loopback address: all of 127.0.0.0/8 is) or
// 127.0.0.1; every call gives up after `timeout_ms`.
class Client {
 public:
  explicit Client(int port, const char* source = nullptr) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (source != nullptr) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      if (inet_pton(AF_INET, source, &from.sin_addr) != 1 ||
          bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) {
        return;
      }
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~Client() { close(fd_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool connected() const { return connected_; }

  // False once the server has closed the connection (or it cannot take more now).
  bool Send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      pollfd ready{fd_, POLLOUT, 0};
      if (poll(&ready, 1, 5000) != 1) return false;
      const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // Everything until the server closes, or until `timeout_ms` passes without a byte.
  std::string ReadUntilClosed(int timeout_ms = 5000) {
    std::string got;
    char buffer[4096];
    while (true) {
      pollfd ready{fd_, POLLIN, 0};
      if (poll(&ready, 1, timeout_ms) != 1) break;
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      got.append(buffer, static_cast<size_t>(n));
    }
    return got;
  }

  // One answer on a kept-alive connection: its head and its Content-Length of body.
  std::string ReadResponse(int timeout_ms = 5000) {
    std::string got;
    char buffer[4096];
    while (true) {
      const size_t head_end = got.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        const size_t at = got.find("Content-Length: ");
        const size_t length = at < head_end ? std::strtoul(got.c_str() + at + 16, nullptr, 10) : 0;
        if (got.size() >= head_end + 4 + length) return got;
      }
      pollfd ready{fd_, POLLIN, 0};
      if (poll(&ready, 1, timeout_ms) != 1) return got;
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) return got;
      got.append(buffer, static_cast<size_t>(n));
    }
  }

  // True when the server closed the connection within `timeout_ms` (having sent nothing).
  bool ClosedByServer(int timeout_ms) {
    pollfd ready{fd_, POLLIN, 0};
    if (poll(&ready, 1, timeout_ms) != 1) return false;
    char byte;
    return recv(fd_, &byte, 1, 0) <= 0;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

int64_t MillisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// Waits (at most 5 s) until `done` holds; false if it never did.
template <typename Condition>
bool Await(Condition done) {
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (Clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

int StatusOf(const std::string& response) {
  // "HTTP/1.1 200 OK"
  if (!absl::StartsWith(response, "HTTP/1.")) return -1;
  return std::atoi(response.substr(9, 3).c_str());
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(bool with_tokens, HttpServerOptions options = {}) {
    std::optional<TokenTable> tokens;
    if (with_tokens) {
      auto parsed = TokenTable::Parse(absl::StrCat("user alice ", kUserToken, "\nworker w1 ",
                                                   kWorkerToken, "\nuser carol ", kCommaToken,
                                                   "\nuser bob ", kBobToken, "\nviewer grafana ",
                                                   kViewerToken, "\n"),
                                      "test tokens");
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      tokens = *std::move(parsed);
    }
    options.listen = "127.0.0.1:0";
    auto started = HttpServer::Start(options, &state_, &rpcs_,
                                     std::make_shared<Authenticator>(std::move(tokens)));
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
  }

  // One request on a connection of its own; the whole answer (the server closes after it).
  std::string Get(const std::string& path, const std::string& headers = "",
                  const std::string& method = "GET", const std::string& body = "",
                  const char* source = nullptr) {
    Client client(server_->port(), source);
    EXPECT_TRUE(client.connected());
    client.Send(absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n",
                             headers, "\r\n", body));
    return client.ReadUntilClosed();
  }

  CoordinatorState state_{CoordinatorOptions{}};
  RpcMetrics rpcs_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, Headers_BeyondTheConnectionsPool_Answered431AndClosed) {
  Start(false);
  Client client(server_->port());
  ASSERT_TRUE(client.connected());
  client.Send("GET /metrics HTTP/1.1\r\nHost: test\r\n");
  const std::string header = absl::StrCat("X-Filler: ", std::string(8000, 'a'), "\r\n");
  // 32 MiB of headers: the server stops reading at its per-connection bound.
  int sent = 0;
  for (; sent < 4096 && client.Send(header); ++sent) {
  }
  EXPECT_LT(sent, 4096) << "the server read 32 MiB of headers";
  EXPECT_EQ(StatusOf(client.ReadUntilClosed()), 431);
  EXPECT_EQ(StatusOf(Get("/metrics")), 200);
}

TEST_F(HttpServerTest, RequestLine_TooLong_Answered414) {
  Start(false);
  EXPECT_EQ(StatusOf(Get(absl::StrCat("/", std::string(200'000, 'a')))), 414);
  EXPECT_EQ(StatusOf(Get("/metrics")), 200);
}

TEST_F(HttpServerTest, SlowClients_HoldNoThread_OthersAreAnsweredAtOnce) {
  Start(false);
  // Far more half-sent requests than the server has threads, each waiting for the rest of its
  // headers (cpp-httplib, before, held a thread for each, 16 in all).
  std::vector<std::unique_ptr<Client>> slow;
  for (int i = 0; i < 24; ++i) {
    slow.push_back(std::make_unique<Client>(server_->port()));
    ASSERT_TRUE(slow.back()->connected());
    ASSERT_TRUE(slow.back()->Send("GET /metrics HTTP/1.1\r\nHost: test\r\nX-Slow: 1"));
  }
  // Answered while every slow client still holds its connection (their head deadline is 10 s,
  // past Get's 5 s): not only once they were dropped.
  EXPECT_EQ(StatusOf(Get("/metrics")), 200);
  int still_open = 0;
  for (auto& client : slow) still_open += !client->ClosedByServer(0);
  EXPECT_EQ(still_open, 24) << "the answer came only once slow clients were closed";
}

// A client that sends its head a byte at a time is never idle (libmicrohttpd's timeout), but
// has the head deadline to finish it; and no connection outlives its maximum age.
TEST_F(HttpServerTest, SlowHeadsAndOldConnections_AreClosed) {
  HttpServerOptions options;
  options.connections.admission_deadline = std::chrono::milliseconds(1'000);
  options.connections.max_age = std::chrono::milliseconds(2'500);
  Start(false, options);
  auto trickle_until_closed = [](Client& client) {
    const auto start = Clock::now();
    while (Clock::now() - start < std::chrono::seconds(8)) {
      if (!client.Send("a") || client.ClosedByServer(200)) break;
    }
    return Clock::now() - start;
  };
  Client slow(server_->port());
  ASSERT_TRUE(slow.connected());
  ASSERT_TRUE(slow.Send("GET /metrics HTTP/1.1\r\nHost: test\r\nX-Slow: "));
  const auto slow_lived = trickle_until_closed(slow);
  EXPECT_GE(slow_lived, std::chrono::milliseconds(700));
  EXPECT_LT(slow_lived, std::chrono::milliseconds(3'000)) << "a head trickled past its deadline";

  // Kept alive after a whole request, then trickling the next head: closed at the maximum age.
  Client kept(server_->port());
  ASSERT_TRUE(kept.Send("GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(kept.Send("GET /metrics HTTP/1.1\r\nHost: test\r\nX-Slow: "));
  const auto kept_lived = trickle_until_closed(kept);
  EXPECT_LT(kept_lived, std::chrono::milliseconds(4'000)) << "a connection outlived its age";
  EXPECT_EQ(StatusOf(Get("/metrics")), 200);
}

TEST_F(HttpServerTest, ConnectionsFromOneAddress_AreBounded_ThenServedAgain) {
  Start(false);
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 32; ++i) {
    idle.push_back(std::make_unique<Client>(server_->port()));
    ASSERT_TRUE(idle.back()->connected());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // All accepted by now.
  Client extra(server_->port());
  extra.Send("GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
  EXPECT_TRUE(extra.ClosedByServer(3000)) << "a 33rd connection from one address was served";
  idle.clear();
  int status = -1;
  for (int attempt = 0; attempt < 50 && status != 200; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    status = StatusOf(Get("/metrics"));
  }
  EXPECT_EQ(status, 200);
}

// Issue 27: 300 idle connections from 10 addresses took all 256 slots and nobody was answered
// until they timed out (10 s), again and again. Now connections not admitted in 3 s are
// closed, one address range holds at most 64, and with the table full a newcomer from a range
// holding fewer takes the place of a waiting one: a client from elsewhere, and an established
// one, are answered at once.
TEST_F(HttpServerTest, IdleConnectionsFromManyRanges_OthersAreStillAnsweredAtOnce) {
  Start(false);
  Client established(server_->port(), "127.0.201.1");
  ASSERT_TRUE(established.connected());
  ASSERT_TRUE(established.Send("GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n"));
  ASSERT_EQ(StatusOf(established.ReadResponse()), 200);

  // 400 addresses in 5 ranges (/24) of 80.
  mptrain::testing::IdleFlood flood(server_->port(),
                                   mptrain::testing::LoopbackSources(10, 5, 80));
  ASSERT_TRUE(Await([&] { return flood.opened() >= 400 && server_->open_connections() >= 256; }))
      << "the flood did not fill the server: opened " << flood.opened() << ", held "
      << server_->open_connections();

  // Across the flood's renewal (its connections are cut at 3 s and come back).
  for (int probe = 0; probe < 6; ++probe) {
    const auto start = Clock::now();
    const std::string source = absl::StrCat("127.0.200.", probe + 1);
    EXPECT_EQ(StatusOf(Get("/metrics", "", "GET", "", source.c_str())), 200)
        << "probe " << probe;
    EXPECT_LT(MillisSince(start), 2000) << "probe " << probe;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // Spread over the flood.
  }
  const auto start = Clock::now();
  ASSERT_TRUE(established.Send("GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n"));
  EXPECT_EQ(StatusOf(established.ReadResponse(2000)), 200) << "the established client was cut";
  EXPECT_LT(MillisSince(start), 2000);
}

TEST_F(HttpServerTest, ConnectionsFromOneRange_AreBounded_OtherRangesServed) {
  HttpServerOptions options;
  options.connections.admission_deadline = std::chrono::seconds(20);  // Not in this test.
  Start(false, options);
  std::vector<std::unique_ptr<Client>> held;
  for (int host = 1; host <= 64; ++host) {
    held.push_back(
        std::make_unique<Client>(server_->port(), absl::StrCat("127.0.3.", host).c_str()));
    ASSERT_TRUE(held.back()->connected());
  }
  ASSERT_TRUE(Await([&] { return server_->open_connections() == 64; }))
      << server_->open_connections();
  Client extra(server_->port(), "127.0.3.200");
  extra.Send("GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
  EXPECT_TRUE(extra.ClosedByServer(3000)) << "a 65th connection from one /24 was served";
  EXPECT_EQ(StatusOf(Get("/metrics", "", "GET", "", "127.0.4.1")), 200);
}

// A connection is admitted by a request with credentials; the login form needs none, so it
// admits nothing: both an idle connection and one that only fetched the form are cut at 3 s,
// one with a user's request is kept.
TEST_F(HttpServerTest, ConnectionsNotAdmitted_AreClosedAtTheDeadline) {
  Start(true);
  Client idle(server_->port());
  Client login(server_->port());
  Client admitted(server_->port());
  const auto start = Clock::now();
  ASSERT_TRUE(login.Send("GET /login HTTP/1.1\r\nHost: test\r\n\r\n"));
  ASSERT_EQ(StatusOf(login.ReadResponse()), 200);
  const std::string metrics = absl::StrCat("GET /metrics HTTP/1.1\r\nHost: test\r\n",
                                           "Authorization: Bearer ", kUserToken, "\r\n\r\n");
  ASSERT_TRUE(admitted.Send(metrics));
  ASSERT_EQ(StatusOf(admitted.ReadResponse()), 200);
  EXPECT_TRUE(idle.ClosedByServer(6000));
  const int64_t idle_lived_ms = MillisSince(start);
  EXPECT_GE(idle_lived_ms, 2'500);
  EXPECT_LT(idle_lived_ms, 4'500);
  EXPECT_TRUE(login.ClosedByServer(1000)) << "the login form admitted its connection";
  ASSERT_TRUE(admitted.Send(metrics));
  EXPECT_EQ(StatusOf(admitted.ReadResponse()), 200);
}

TEST_F(HttpServerTest, Bodies_WithoutLengthEncodedOrTooLarge_AreRefusedBeforeTheyAreRead) {
  Start(false);
  // Announced 1 GiB: refused on its headers; nothing of it is sent or read.
  EXPECT_EQ(StatusOf(Get("/login", "Content-Length: 1073741824\r\n", "POST")), 413);
  EXPECT_EQ(StatusOf(Get("/login", "Content-Length: 65537\r\n", "POST")), 413);
  EXPECT_EQ(StatusOf(Get("/login", "Content-Length: -1\r\n", "POST")), 400);  // libmicrohttpd
  EXPECT_EQ(StatusOf(Get("/login", "Transfer-Encoding: chunked\r\n", "POST")), 400);
  EXPECT_EQ(StatusOf(Get("/login", "Content-Length: 7\r\nContent-Encoding: gzip\r\n", "POST")),
            400);
  EXPECT_EQ(StatusOf(Get("/login", "", "POST")), 411);
  EXPECT_EQ(StatusOf(Get("/app.css", "Range: bytes=0-,0-,0-\r\n")), 416);
  EXPECT_EQ(StatusOf(Get("/app.css")), 200);
}

TEST_F(HttpServerTest, Routes_AnswerJsonErrorsAndRefuseOtherMethods) {
  Start(false);
  const std::string metrics = Get("/metrics");
  EXPECT_EQ(StatusOf(metrics), 200);
  EXPECT_TRUE(absl::StrContains(metrics, "X-Content-Type-Options: nosniff")) << metrics;
  EXPECT_TRUE(absl::StrContains(metrics, "mptrain_")) << metrics;
  const std::string head = Get("/metrics", "", "HEAD");
  EXPECT_EQ(StatusOf(head), 200);
  EXPECT_FALSE(absl::StrContains(head, "mptrain_")) << "HEAD answered with a body";
  EXPECT_EQ(StatusOf(Get("/metrics", "", "DELETE")), 405);
  EXPECT_EQ(StatusOf(Get("/api/jobs")), 200);
  EXPECT_EQ(StatusOf(Get("/api/jobs?page_size=many")), 400);
  EXPECT_EQ(StatusOf(Get("/api/jobs/job-0001")), 404);
  EXPECT_EQ(StatusOf(Get("/api/jobs/job-0001/events?after=x")), 400);
  EXPECT_EQ(StatusOf(Get("/api/jobs/a.b")), 404);
  EXPECT_EQ(StatusOf(Get(absl::StrCat("/api/jobs/", std::string(65, 'a')))), 404);
  EXPECT_EQ(StatusOf(Get("/api/workers")), 200);
  EXPECT_EQ(StatusOf(Get("/")), 200);
  EXPECT_EQ(StatusOf(Get("/vendor/uplot/uPlot.iife.min.js")), 200);
  EXPECT_EQ(StatusOf(Get("/../etc/passwd.js")), 404);
  EXPECT_EQ(StatusOf(Get("/nothing-here")), 404);
}

TEST_F(HttpServerTest, Tokens_UserAdmittedWorkerRefused_LoginSetsTheCookie) {
  Start(true);
  EXPECT_EQ(StatusOf(Get("/metrics")), 401);
  EXPECT_EQ(StatusOf(Get("/metrics", absl::StrCat("Authorization: Bearer ", kWorkerToken, "\r\n"))),
            403);
  EXPECT_EQ(StatusOf(Get("/metrics", absl::StrCat("Authorization: Bearer ", kUserToken, "\r\n"))),
            200);
  const std::string page = Get("/job?id=x");
  EXPECT_EQ(StatusOf(page), 302);
  EXPECT_TRUE(absl::StrContains(page, "Location: /login")) << page;
  EXPECT_EQ(StatusOf(Get("/login")), 200);  // The form and its stylesheet need no token.
  EXPECT_EQ(StatusOf(Get("/app.css")), 200);

  const std::string form = absl::StrCat("token=", kUserToken);
  const std::string login =
      Get("/login", absl::StrCat("Content-Type: application/x-www-form-urlencoded\r\n",
                                 "Content-Length: ", form.size(), "\r\n"),
          "POST", form);
  EXPECT_EQ(StatusOf(login), 302);
  EXPECT_TRUE(absl::StrContains(
      login, absl::StrCat("mptrain_token=", kUserToken, "; Path=/; HttpOnly; SameSite=Strict")))
      << login;
  EXPECT_EQ(StatusOf(Get("/api/jobs", absl::StrCat("Cookie: mptrain_token=", kUserToken, "\r\n"))),
            200);
  const std::string bad = "token=not-a-token-of-anyone";
  const std::string refused =
      Get("/login", absl::StrCat("Content-Length: ", bad.size(), "\r\n"), "POST", bad);
  EXPECT_TRUE(absl::StrContains(refused, "Location: /login?failed=1")) << refused;
  EXPECT_FALSE(absl::StrContains(refused, "Set-Cookie")) << refused;

  // A token the cookie could not carry back as it is (a comma): no cookie, the header works.
  const std::string comma = absl::StrCat("token=", kCommaToken);
  const std::string uncookied =
      Get("/login", absl::StrCat("Content-Length: ", comma.size(), "\r\n"), "POST", comma);
  EXPECT_TRUE(absl::StrContains(uncookied, "Location: /login?failed=1")) << uncookied;
  EXPECT_EQ(StatusOf(Get("/metrics", absl::StrCat("Authorization: Bearer ", kCommaToken, "\r\n"))),
            200);
}

// A request that is not admitted is answered before its body is read: no "100 Continue".
TEST_F(HttpServerTest, Gate_AnswersBeforeTheBody) {
  Start(true);
  Client client(server_->port());
  client.Send(
      "POST /api/jobs HTTP/1.1\r\nHost: test\r\nContent-Length: 65536\r\n"
      "Expect: 100-continue\r\n\r\n");
  const std::string answer = client.ReadUntilClosed(3000);
  EXPECT_EQ(StatusOf(answer), 401) << answer;
  EXPECT_FALSE(absl::StrContains(answer, "100 Continue")) << answer;
}

// Each user's token shows its own jobs only, another's answered 404 as an unknown job's (the
// JSON the dashboard reads, and /metrics' per-job series); a viewer's shows every job.
TEST_F(HttpServerTest, JobReads_OwnJobsOnly_ViewerSeesAll) {
  v1::RegisterWorkerRequest worker;
  worker.set_host("127.0.0.1");
  worker.set_name("w1");
  worker.set_device(v1::CPU);
  worker.set_slots(1);
  worker.set_incarnation(1);
  ASSERT_TRUE(state_.RegisterWorker(worker).ok());
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = SmallJobSpec(1);
  submit.mutable_spec()->set_name("alices-model");
  const std::string alices = state_.SubmitJob(submit, "alice")->job_id();  // runs
  submit.mutable_spec()->set_name("bobs-model");
  const std::string bobs = state_.SubmitJob(submit, "bob")->job_id();  // queued
  ASSERT_EQ(state_.GetJob(alices)->state(), v1::RUNNING);
  Start(true);
  auto as = [](const char* token) { return absl::StrCat("Authorization: Bearer ", token, "\r\n"); };

  const std::string bob_list = Get("/api/jobs", as(kBobToken));
  EXPECT_EQ(StatusOf(bob_list), 200) << bob_list;
  EXPECT_TRUE(absl::StrContains(bob_list, bobs)) << bob_list;
  EXPECT_FALSE(absl::StrContains(bob_list, alices)) << bob_list;
  EXPECT_FALSE(absl::StrContains(bob_list, "alices-model")) << bob_list;
  const std::string unknown = Get("/api/jobs/job-9999", as(kBobToken));
  for (const std::string& path :
       {absl::StrCat("/api/jobs/", alices), absl::StrCat("/api/jobs/", alices, "/events")}) {
    const std::string answer = Get(path, as(kBobToken));
    EXPECT_EQ(StatusOf(answer), 404) << path << ": " << answer;
    EXPECT_TRUE(absl::StrContains(answer, absl::StrCat("\"unknown job ", alices, "\"")))
        << answer;
    EXPECT_FALSE(absl::StrContains(answer, "alice")) << "the owner leaked: " << answer;
    EXPECT_EQ(StatusOf(Get(path, as(kUserToken))), 200) << path;
    EXPECT_EQ(StatusOf(Get(path, as(kViewerToken))), 200) << path;
  }
  EXPECT_EQ(StatusOf(unknown), 404);
  const std::string bob_metrics = Get("/metrics", as(kBobToken));
  EXPECT_EQ(StatusOf(bob_metrics), 200);
  EXPECT_FALSE(absl::StrContains(bob_metrics, alices)) << bob_metrics;
  EXPECT_FALSE(absl::StrContains(bob_metrics, "alices-model")) << bob_metrics;
  EXPECT_TRUE(absl::StrContains(Get("/metrics", as(kUserToken)), absl::StrCat("job_id=\"", alices)));

  const std::string viewer_list = Get("/api/jobs", as(kViewerToken));
  EXPECT_TRUE(absl::StrContains(viewer_list, alices)) << viewer_list;
  EXPECT_TRUE(absl::StrContains(viewer_list, bobs)) << viewer_list;
  EXPECT_TRUE(
      absl::StrContains(Get("/metrics", as(kViewerToken)), absl::StrCat("job_id=\"", alices)));
}

// /api/workers (the workers page) carries each worker's latest usage, to every reader (a user,
// another user, a viewer: the worker list holds no job's data), never to a worker's token.
TEST_F(HttpServerTest, ApiWorkers_CarryTheLatestUsage_ToEveryReader) {
  v1::RegisterWorkerRequest worker;
  worker.set_host("127.0.0.1");
  worker.set_name("g1");
  worker.set_device(v1::CUDA);
  worker.set_slots(2);
  worker.set_incarnation(1);
  for (int i = 0; i < 2; ++i) worker.add_devices()->set_index(i);
  auto registered = state_.RegisterWorker(worker);
  ASSERT_TRUE(registered.ok()) << registered.status();
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id(registered->worker_id());
  heartbeat.set_incarnation(1);
  heartbeat.set_worker_secret(registered->worker_secret());
  heartbeat.mutable_usage()->set_memory_available_bytes(int64_t{40} << 30);
  heartbeat.mutable_usage()->set_memory_total_bytes(int64_t{64} << 30);
  v1::DeviceUsage* read = heartbeat.mutable_usage()->add_devices();
  read->set_index(0);
  read->set_available(true);
  read->set_memory_used_bytes(int64_t{30} << 30);
  read->set_memory_total_bytes(int64_t{80} << 30);
  read->set_utilization_percent(75);
  heartbeat.mutable_usage()->add_devices()->set_index(1);  // Unavailable (no NVML).
  ASSERT_TRUE(state_.Heartbeat(heartbeat).ok());
  Start(true);
  auto as = [](const char* token) { return absl::StrCat("Authorization: Bearer ", token, "\r\n"); };
  for (const char* token : {kUserToken, kBobToken, kViewerToken}) {
    const std::string answer = Get("/api/workers", as(token));
    EXPECT_EQ(StatusOf(answer), 200) << answer;
    for (const char* part :
         {R"("usage":{"memory_available_bytes":"42949672960","memory_total_bytes":"68719476736")",
          // (Index 0 is protobuf JSON's default, left out as every default here.)
          R"([{"available":true,"memory_used_bytes":"32212254720","memory_total_bytes":"85899345920","utilization_percent":75},)",
          R"({"index":1})", R"("usage_unix_ms":")"}) {
      EXPECT_TRUE(absl::StrContains(answer, part)) << "no " << part << " in " << answer;
    }
  }
  EXPECT_EQ(StatusOf(Get("/api/workers", as(kWorkerToken))), 403);
  const std::string metrics = Get("/metrics", as(kBobToken));
  EXPECT_TRUE(absl::StrContains(
      metrics, "mptrain_worker_gpu_utilization_ratio{worker=\"g1\",host=\"127.0.0.1\",gpu=\"0\"} 0.75\n"))
      << metrics;
}

}  // namespace
}  // namespace mptrain

namespace mptrain {
namespace {

// The body of an answer (after the blank line of its head).
std::string BodyOf(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// The dashboard's cancel button: a POST with gRPC CancelJob's rules (a user's own job, not a
// viewer's, another's answered 404), and, from a browser (the session cookie), only with the
// CSRF header that GET /api/csrf gives for that cookie and not from another site's page.
TEST_F(HttpServerTest, Cancel_AsCancelJobWithTheCookiesCsrfToken) {
  v1::RegisterWorkerRequest worker;
  worker.set_host("127.0.0.1");
  worker.set_name("w1");
  worker.set_device(v1::CPU);
  worker.set_slots(4);
  worker.set_incarnation(1);
  ASSERT_TRUE(state_.RegisterWorker(worker).ok());
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = SmallJobSpec(1);
  const std::string first = state_.SubmitJob(submit, "alice")->job_id();
  const std::string second = state_.SubmitJob(submit, "alice")->job_id();
  const std::string third = state_.SubmitJob(submit, "alice")->job_id();
  Start(true);
  auto post = [&](const std::string& job, const std::string& headers) {
    return Get(absl::StrCat("/api/jobs/", job, "/cancel"),
               absl::StrCat(headers, "Content-Length: 0\r\n"), "POST");
  };
  auto bearer = [](const char* token) {
    return absl::StrCat("Authorization: Bearer ", token, "\r\n");
  };
  const std::string cookie = absl::StrCat("Cookie: mptrain_token=", kUserToken, "\r\n");

  EXPECT_EQ(StatusOf(post(first, "")), 401);
  EXPECT_EQ(StatusOf(post(first, bearer(kViewerToken))), 403) << "a viewer cancelled";
  EXPECT_EQ(StatusOf(post(first, bearer(kBobToken))), 404) << "bob cancelled alice's job";
  EXPECT_EQ(StatusOf(post(first, bearer(kWorkerToken))), 403);
  // The cookie alone, or with a wrong token, or one made for another session: refused.
  EXPECT_EQ(StatusOf(post(first, cookie)), 403);
  EXPECT_EQ(StatusOf(post(first, cookie + "X-CSRF-Token: 00\r\n")), 403);
  const std::string bobs_csrf =
      BodyOf(Get("/api/csrf", absl::StrCat("Cookie: mptrain_token=", kBobToken, "\r\n")));
  const std::string alices_csrf = BodyOf(Get("/api/csrf", cookie));
  auto value_of = [](const std::string& json) {
    const size_t start = json.find(": \"") + 3;
    return json.substr(start, json.find('"', start) - start);
  };
  ASSERT_EQ(value_of(alices_csrf).size(), 64u) << alices_csrf;
  EXPECT_NE(value_of(alices_csrf), value_of(bobs_csrf));
  EXPECT_FALSE(absl::StrContains(alices_csrf, kUserToken)) << "the token itself was handed out";
  EXPECT_EQ(StatusOf(post(first, cookie + "X-CSRF-Token: " + value_of(bobs_csrf) + "\r\n")), 403);
  const std::string csrf_header = "X-CSRF-Token: " + value_of(alices_csrf) + "\r\n";
  EXPECT_EQ(StatusOf(post(first, cookie + csrf_header + "Sec-Fetch-Site: cross-site\r\n")), 403);
  EXPECT_EQ(state_.GetJob(first)->state(), v1::RUNNING) << "a refused cancel cancelled";

  const std::string cancelled = post(first, cookie + csrf_header + "Sec-Fetch-Site: same-origin\r\n");
  EXPECT_EQ(StatusOf(cancelled), 200) << cancelled;
  EXPECT_TRUE(absl::StrContains(cancelled, "\"CANCELLED\"")) << cancelled;
  EXPECT_EQ(state_.GetJob(first)->state(), v1::CANCELLED);
  EXPECT_EQ(StatusOf(post(first, cookie + csrf_header)), 409) << "an ended job cancelled again";
  // An API client's own Authorization header needs no CSRF token.
  EXPECT_EQ(StatusOf(post(second, bearer(kUserToken))), 200);
  EXPECT_EQ(state_.GetJob(second)->state(), v1::CANCELLED);
  // Only POST changes anything.
  EXPECT_EQ(StatusOf(Get(absl::StrCat("/api/jobs/", third, "/cancel"), bearer(kUserToken))), 404);
  EXPECT_EQ(StatusOf(Get(absl::StrCat("/api/jobs/", third, "/cancel"),
                         bearer(kUserToken) + "Content-Length: 0\r\n", "PUT")),
            405);
  EXPECT_NE(state_.GetJob(third)->state(), v1::CANCELLED);
}

}  // namespace
}  // namespace mptrain
