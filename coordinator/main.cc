// coordinator: the gRPC server that queues jobs, places ranks on workers and collects results.
//
//   coordinator --listen 0.0.0.0:50051 --heartbeat-timeout 10
//       --tls_cert server.pem --tls_key server.key [--tls_client_ca ca.pem] --token_file tokens
//
// Off loopback it refuses to start without TLS and tokens unless --insecure is given.
// With port 0 the kernel picks a free port; --port-file receives it (tests use this).

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/synchronization/mutex.h"
#include "common/cli_flags.h"
#include "common/logging.h"
#include "common/rpc_limits.h"
#include "coordinator/coordinator_state.h"
#include "coordinator/grpc_listener.h"
#include "coordinator/grpc_service.h"
#include "coordinator/http_server.h"
#include "coordinator/metrics.h"
#include "coordinator/rpc_metrics_interceptor.h"
#include "coordinator/server_security.h"
#include "coordinator/store/sqlite_job_store.h"
#include "coordinator/wait_set.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "HOST:PORT to serve on (port 0 = any free)");
ABSL_FLAG(double, heartbeat_timeout, 10.0,
          "Seconds without a heartbeat after which a worker is lost and its jobs fail");
ABSL_FLAG(int32_t, max_live_workers, mptrain::kDefaultMaxLiveWorkers,
          "Live workers at once; a registration past it is refused with a retry delay");
ABSL_FLAG(std::string, port_file, "", "If set, the bound port is written to this file");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn or error");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate of this server (enables TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: clients must present a certificate it signed (mutual TLS)");
ABSL_FLAG(std::string, token_file, "",
          "Bearer tokens, one `ROLE PRINCIPAL TOKEN` a line (roles: admin, user, worker)");
ABSL_FLAG(std::string, state_dir, "mptrain-state",
          "Directory of the job store (SQLite): jobs, their history and the id counter survive "
          "a coordinator restart");
ABSL_FLAG(bool, ephemeral, false, "Keep no state on disk (a restart forgets every job)");
ABSL_FLAG(double, adopt_grace_s, 60,
          "After a restart, how long a running job's ranks have to be reported again by their "
          "workers before the job fails (and restarts per max_restarts)");
ABSL_FLAG(int64_t, max_finished_jobs, 1000, "Ended jobs kept (the newest)");
ABSL_FLAG(double, finished_job_retention_s, 7 * 24 * 3600.0, "Ended jobs older than this go");
ABSL_FLAG(double, lost_worker_retention_s, 3600,
          "Lost workers stay listed this long (a worker registering again under its name "
          "replaces its lost entry at once)");
ABSL_FLAG(std::string, http_listen, "",
          "HOST:PORT for /metrics (Prometheus) and the web dashboard (empty: off). Uses the "
          "same TLS certificate and tokens as gRPC");
ABSL_FLAG(std::string, http_port_file, "", "If set, the bound HTTP port is written to this file");
ABSL_FLAG(int64_t, max_pending_jobs_per_principal, 1000,
          "Jobs one submitter (token principal) may have waiting to be placed, of the 10000 in "
          "all (without tokens every caller is one principal: only the total applies)");
ABSL_FLAG(int64_t, max_pending_mib, 256,
          "Memory (MiB) the jobs waiting to be placed may hold together; a submit past it is "
          "RESOURCE_EXHAUSTED (a small job holds about 3 KiB, plus the size of a bigger spec)");
ABSL_FLAG(int64_t, max_pending_mib_per_principal, 32,
          "Of --max_pending_mib, what one submitter's (token principal's) waiting jobs may hold "
          "(without tokens only the total applies)");
ABSL_FLAG(int32_t, max_watches_per_principal, 512,
          "WatchJob streams one caller (token principal) may have open at once, of the 4096 in "
          "all (without tokens only the total applies)");
ABSL_FLAG(double, grpc_handshake_timeout_s, 5,
          "Seconds a connection to the gRPC port has to finish its handshake (TLS, then HTTP/2's "
          "settings) before it is closed (gRPC's own default: 120)");
ABSL_FLAG(int64_t, grpc_max_connections, 0,
          "Connections the gRPC port holds at once; more are closed as they arrive (0: two per "
          "--max_live_workers, for a worker and its ranks, plus 8192 for users)");
ABSL_FLAG(int64_t, grpc_max_connections_per_address, 2048,
          "Connections one client address (IPv6: one /64) may hold on the gRPC port (a worker "
          "and its ranks share one)");
ABSL_FLAG(double, grpc_max_connection_idle_s, 600,
          "Seconds a gRPC connection with no call open is kept (then closed with GOAWAY: a "
          "client opens a new one when it next calls)");
ABSL_FLAG(std::string, health_listen, "",
          "HOST:PORT of a plaintext port that serves grpc.health.v1.Health and nothing else "
          "(empty: off), for probes that cannot present TLS or a client certificate, such as "
          "kubelet's gRPC probes; the main port serves the same health service");
ABSL_FLAG(bool, insecure, false,
          "Allow listening off loopback without TLS and tokens (warns at every start)");

// gRPC's default receive limit is 4 MiB; the largest legitimate message (a 1 MiB spec or key
// value) is far below it, and each RPC checks its own fields' limits with a clear error.
constexpr int kMaxReceiveMessageBytes = 4 << 20;
constexpr int kMaxServerThreads = 32;
constexpr size_t kMaxServerMemoryBytes = size_t{2} << 30;
constexpr int kMaxStreamsPerConnection = 20'000;

constexpr int64_t kMostGrpcConnections = 1 << 20;

// Each connection is a descriptor: raise the soft limit so that the connection cap, not the
// descriptor limit, is what refuses connections (warns when the hard limit is lower).
void RaiseDescriptorLimit(size_t max_connections) {
  const rlim_t wanted = static_cast<rlim_t>(max_connections) + 1024;  // Files, the store, HTTP.
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= wanted) return;
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, limit.rlim_max);
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur < wanted) {
    spdlog::warn("open files are limited to {} (ulimit -n): fewer than --grpc_max_connections "
                 "({}) and the rest; connections beyond it wait to be accepted",
                 limit.rlim_cur, max_connections);
  }
}

int main(int argc, char** argv) {
  // Debian's abseil is built without NDEBUG, so every absl::Mutex (gRPC's, several per call)
  // keeps a lock-order graph for deadlock detection: 8% of the coordinator's CPU at 50,000
  // workers. Our own code uses std::mutex; the detection only ever looked at gRPC's locks.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  mptrain::ParseFlags(argc, argv, "coordinator --listen HOST:PORT [--heartbeat-timeout SECONDS]");
  mptrain::InitLogging("coordinator", absl::GetFlag(FLAGS_log_level));

  // Signals are taken by one thread with sigwait, so block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  double timeout_s = absl::GetFlag(FLAGS_heartbeat_timeout);
  if (!(timeout_s > 0)) {
    spdlog::error("--heartbeat-timeout must be > 0, got {}", timeout_s);
    return 2;
  }
  mptrain::CoordinatorOptions options;
  options.heartbeat_timeout_ms = static_cast<int64_t>(timeout_s * 1000);
  options.max_live_workers = absl::GetFlag(FLAGS_max_live_workers);
  if (options.max_live_workers < 1 || options.max_live_workers > 1'000'000) {
    spdlog::error("--max_live_workers must be in [1, 1000000], got {}", options.max_live_workers);
    return 2;
  }
  mptrain::ServerSecurityOptions security_options;
  security_options.listen = absl::GetFlag(FLAGS_listen);
  security_options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  security_options.tls_key = absl::GetFlag(FLAGS_tls_key);
  security_options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  security_options.token_file = absl::GetFlag(FLAGS_token_file);
  security_options.insecure = absl::GetFlag(FLAGS_insecure);
  absl::StatusOr<mptrain::ServerSecurity> security = mptrain::MakeServerSecurity(security_options);
  if (!security.ok()) {
    spdlog::error("{}", std::string(security.status().message()));
    return 2;
  }
  for (const std::string& warning : security->warnings) spdlog::warn("{}", warning);

  std::unique_ptr<mptrain::SqliteJobStore> store;
  if (!absl::GetFlag(FLAGS_ephemeral)) {
    auto opened = mptrain::SqliteJobStore::Open(absl::GetFlag(FLAGS_state_dir));
    if (!opened.ok()) {
      spdlog::error("{}", std::string(opened.status().message()));
      return 2;
    }
    store = std::move(*opened);
    options.store = store.get();
  }
  if (!(absl::GetFlag(FLAGS_adopt_grace_s) >= 0) || absl::GetFlag(FLAGS_max_finished_jobs) < 0 ||
      !(absl::GetFlag(FLAGS_finished_job_retention_s) >= 0) ||
      !(absl::GetFlag(FLAGS_lost_worker_retention_s) >= 0)) {
    spdlog::error("--adopt_grace_s, --max_finished_jobs, --finished_job_retention_s and "
                  "--lost_worker_retention_s must be >= 0");
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_pending_jobs_per_principal) < 1 ||
      absl::GetFlag(FLAGS_max_pending_jobs_per_principal) >
          static_cast<int64_t>(options.max_pending_jobs)) {
    spdlog::error("--max_pending_jobs_per_principal must be in [1, {}]",
                  options.max_pending_jobs);
    return 2;
  }
  // Without tokens every caller is the same principal ("anonymous"): a share of the queue per
  // principal would only shrink it.
  options.max_pending_jobs_per_owner =
      security->authenticator->enabled()
          ? static_cast<size_t>(absl::GetFlag(FLAGS_max_pending_jobs_per_principal))
          : options.max_pending_jobs;
  const int64_t pending_mib = absl::GetFlag(FLAGS_max_pending_mib);
  const int64_t pending_mib_per_principal = absl::GetFlag(FLAGS_max_pending_mib_per_principal);
  if (pending_mib < 1 || pending_mib > (int64_t{1} << 20) || pending_mib_per_principal < 1 ||
      pending_mib_per_principal > pending_mib) {
    spdlog::error("--max_pending_mib must be in [1, 2^20] and --max_pending_mib_per_principal "
                  "in [1, --max_pending_mib]");
    return 2;
  }
  options.max_pending_bytes = pending_mib << 20;
  options.max_pending_bytes_per_owner = security->authenticator->enabled()
                                            ? pending_mib_per_principal << 20
                                            : options.max_pending_bytes;
  options.adopt_grace_ms = static_cast<int64_t>(absl::GetFlag(FLAGS_adopt_grace_s) * 1000);
  options.max_finished_jobs = static_cast<size_t>(absl::GetFlag(FLAGS_max_finished_jobs));
  options.finished_job_retention_ms =
      static_cast<int64_t>(absl::GetFlag(FLAGS_finished_job_retention_s) * 1000);
  options.lost_worker_retention_ms =
      static_cast<int64_t>(absl::GetFlag(FLAGS_lost_worker_retention_s) * 1000);
  // Long calls wait here, not on a thread; the state names what each mutation changed.
  mptrain::WaitSet waits;
  options.notify = [&waits](const std::vector<std::string>& keys) { waits.Notify(keys); };
  mptrain::CoordinatorState state(options);
  if (absl::Status restored = state.Restore(); !restored.ok()) {
    spdlog::error("{}", std::string(restored.message()));
    return 2;
  }
  mptrain::CallLimits watch_limits = mptrain::kDefaultWatchLimits;
  watch_limits.per_holder = absl::GetFlag(FLAGS_max_watches_per_principal);
  if (watch_limits.per_holder < 1 || watch_limits.per_holder > watch_limits.total) {
    spdlog::error("--max_watches_per_principal must be in [1, {}], got {}", watch_limits.total,
                  watch_limits.per_holder);
    return 2;
  }
  if (!security->authenticator->enabled()) watch_limits.per_holder = watch_limits.total;
  const double handshake_timeout_s = absl::GetFlag(FLAGS_grpc_handshake_timeout_s);
  const double max_connection_idle_s = absl::GetFlag(FLAGS_grpc_max_connection_idle_s);
  if (!(handshake_timeout_s >= 0.1 && handshake_timeout_s <= 600) ||
      !(max_connection_idle_s >= 1 && max_connection_idle_s <= 30 * 24 * 3600)) {
    spdlog::error("--grpc_handshake_timeout_s must be in [0.1, 600] and "
                  "--grpc_max_connection_idle_s in [1, 2592000]");
    return 2;
  }
  mptrain::GrpcConnectionLimits connection_limits;
  const int64_t max_connections =
      absl::GetFlag(FLAGS_grpc_max_connections) == 0
          ? std::min<int64_t>(2 * int64_t{options.max_live_workers} + 8192, kMostGrpcConnections)
          : absl::GetFlag(FLAGS_grpc_max_connections);
  const int64_t max_per_address = absl::GetFlag(FLAGS_grpc_max_connections_per_address);
  if (max_connections < 1 || max_connections > kMostGrpcConnections || max_per_address < 1 ||
      max_per_address > max_connections) {
    spdlog::error("--grpc_max_connections must be in [1, {}] and "
                  "--grpc_max_connections_per_address in [1, --grpc_max_connections]",
                  kMostGrpcConnections);
    return 2;
  }
  connection_limits.max_connections = static_cast<size_t>(max_connections);
  connection_limits.max_connections_per_address = static_cast<size_t>(max_per_address);
  RaiseDescriptorLimit(connection_limits.max_connections);
  mptrain::CoordinatorService coordinator_service(&state, &waits, security->authenticator,
                                                  watch_limits);
  // Every live worker holds one poll open: the bound grows with --max_live_workers (before, a
  // fixed 16,384 turned away the polls of the workers past it), plus the default's room for
  // ranks' key-value reads and retries.
  mptrain::CallLimits long_poll_limits = mptrain::kDefaultLongPollLimits;
  long_poll_limits.total = options.max_live_workers + mptrain::kDefaultLongPollLimits.total;
  mptrain::WorkerControlService worker_service(&state, &waits, security->authenticator,
                                               long_poll_limits);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  mptrain::RpcMetrics rpc_metrics;
  grpc::ServerBuilder builder;
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<mptrain::RpcMetricsInterceptorFactory>(&rpc_metrics));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // The port is accepted by GrpcListener, which keeps the connection caps gRPC 1.51 lacks,
  // and handed to the server here.
  auto acceptor = builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
      security->credentials);
  // A connection that does not finish its handshake goes soon; one that holds no call, after
  // a while (its client simply reconnects).
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(handshake_timeout_s * 1000));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             static_cast<int>(max_connection_idle_s * 1000));
  builder.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  // Explicit quotas: no call holds a thread while it waits (callback API), and gRPC's own
  // threads and memory are capped.
  grpc::ResourceQuota quota("coordinator");
  quota.SetMaxThreads(kMaxServerThreads);
  quota.Resize(kMaxServerMemoryBytes);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  // Clients ping connections with open calls (common/rpc_limits.h): accept that rate.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             mptrain::kServerMinPingIntervalMs);
  builder.RegisterService(&coordinator_service);
  builder.RegisterService(&worker_service);
  worker_service.AddPollQueues(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    spdlog::error("cannot start the gRPC server for {}", absl::GetFlag(FLAGS_listen));
    return 1;
  }
  worker_service.StartPolls();
  // However main ends from here on: the server shut down, then the polls' queues drained,
  // while the server still exists (a pending poll slot refers to it).
  struct StopServer {
    grpc::Server* server;
    mptrain::WorkerControlService* workers;
    ~StopServer() {
      server->Shutdown(std::chrono::system_clock::now());
      workers->StopPolls();
    }
  } stop_server{server.get(), &worker_service};
  // Declared after the server and the acceptor: it stops accepting before they go.
  absl::StatusOr<std::unique_ptr<mptrain::GrpcListener>> listener =
      mptrain::GrpcListener::Bind(absl::GetFlag(FLAGS_listen), connection_limits);
  if (!listener.ok()) {
    spdlog::error("{}", std::string(listener.status().message()));
    return 1;
  }
  (*listener)->Start(acceptor.get());
  const int port = (*listener)->port();
  spdlog::info("coordinator listening on {} (port {}; {}), heartbeat timeout {} s",
               absl::GetFlag(FLAGS_listen), port, security->summary, timeout_s);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    std::string tmp = absl::GetFlag(FLAGS_port_file) + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), absl::GetFlag(FLAGS_port_file).c_str());
  }

  // kubelet's gRPC probe speaks plaintext and has no client certificate, so with (mutual) TLS
  // on the main port it needs a port of its own. That port holds only the health service,
  // whose answer is SERVING or NOT_SERVING: it reveals nothing and accepts no other method.
  std::unique_ptr<grpc::Server> health_server;
  grpc::CallbackGenericService health_only;  // Every other method: UNIMPLEMENTED.
  if (!absl::GetFlag(FLAGS_health_listen).empty()) {
    grpc::ServerBuilder health_builder;
    int health_port = 0;
    health_builder.AddListeningPort(absl::GetFlag(FLAGS_health_listen),
                                    grpc::InsecureServerCredentials(), &health_port);
    health_builder.SetMaxReceiveMessageSize(4096);  // A HealthCheckRequest is a short name.
    health_builder.RegisterCallbackGenericService(&health_only);  // A server needs one service.
    health_server = health_builder.BuildAndStart();
    if (health_server == nullptr || health_port == 0) {
      spdlog::error("--health_listen {}: cannot listen there (a HOST:PORT this machine holds, "
                    "port free)", absl::GetFlag(FLAGS_health_listen));
      return 2;
    }
    spdlog::info("health service (grpc.health.v1, plaintext) on {} (port {})",
                 absl::GetFlag(FLAGS_health_listen), health_port);
  }

  std::unique_ptr<mptrain::HttpServer> http;
  if (!absl::GetFlag(FLAGS_http_listen).empty()) {
    mptrain::HttpServerOptions http_options;
    http_options.listen = absl::GetFlag(FLAGS_http_listen);
    http_options.tls_cert = security_options.tls_cert;
    http_options.tls_key = security_options.tls_key;
    http_options.tls_client_ca = security_options.tls_client_ca;
    http_options.insecure = security_options.insecure;
    auto started = mptrain::HttpServer::Start(http_options, &state, &rpc_metrics,
                                              security->authenticator);
    if (!started.ok()) {
      spdlog::error("{}", std::string(started.status().message()));
      return 2;
    }
    http = std::move(*started);
    if (!absl::GetFlag(FLAGS_http_port_file).empty()) {
      std::string tmp = absl::GetFlag(FLAGS_http_port_file) + ".tmp";
      std::ofstream(tmp) << http->port() << "\n";
      std::rename(tmp.c_str(), absl::GetFlag(FLAGS_http_port_file).c_str());
    }
  }

  std::atomic<bool> stopping{false};
  std::thread liveness([&] {
    while (!stopping.load()) {
      state.CheckLiveness();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::thread signal_waiter([&] {
    int signal = 0;
    sigwait(&signals, &signal);
    spdlog::info("signal {}: shutting down", signal);
    stopping.store(true);
    waits.Shutdown();  // Every waiting call answers UNAVAILABLE now.
    // Probes see NOT_SERVING from here on, on both ports.
    server->GetHealthCheckService()->Shutdown();
    if (health_server != nullptr) health_server->GetHealthCheckService()->Shutdown();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  });
  server->Wait();
  if (health_server != nullptr) {
    health_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  listener->reset();
  http.reset();
  signal_waiter.join();
  liveness.join();
  spdlog::info("coordinator stopped");
  return 0;
}
