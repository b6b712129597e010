// A hostile client on the coordinator's network, tried against a real secured cluster (mutual
// TLS, tokens, worker and rank secrets): every abuse of the control plane is refused with the
// right code, and the job under attack still ends SUCCEEDED with matching checksums. Then path
// escapes through job specs: refused at submit where the coordinator can tell, by the rank
// before any I/O otherwise, and nothing is written.

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/local_cluster.h"

namespace mptrain::testing {
namespace {

auto Deadline() { return std::chrono::system_clock::now() + std::chrono::seconds(10); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

// The assignment a worker daemon wrote for one of its ranks (the test runs as root, as an
// attacker who stole a rank's file would).
v1::Assignment StealAssignment(const LocalCluster& cluster, const v1::Job& job, int rank) {
  v1::Assignment assignment;
  for (const v1::RankPlacement& placement : job.placement()) {
    if (placement.rank() != rank) continue;
    const std::string worker = placement.worker_id().substr(0, placement.worker_id().find('#'));
    std::ifstream in(absl::StrCat(cluster.dir(), "/", worker, "/", job.job_id(), "-rank", rank,
                                  "-attempt1.assignment"),
                     std::ios::binary);
    EXPECT_TRUE(assignment.ParseFromIstream(&in)) << "no assignment file for rank " << rank;
  }
  return assignment;
}

// Runs one unary call and returns its code.
template <typename Stub, typename Request, typename Response>
grpc::StatusCode Call(Stub* stub,
                      grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                   Response*),
                      const Request& request) {
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  Response response;
  return (stub->*method)(&context, request, &response).error_code();
}

TEST(Security, HostileClients_AreRefused_AndTheJobUnderAttackSucceeds) {
  LocalCluster cluster({});
  ASSERT_TRUE(cluster.Start().ok());
  const std::string spec = WriteSpec("victim", R"({
    "name": "victim", "world_size": 2, "device": "cpu",
    "model": {"input_dim": 64, "hidden_dims": [64], "output_dim": 8},
    "data": {"synthetic": {"seed": 1}}, "micro_batch_size": 32, "accumulation_steps": 2,
    "steps": 4000, "optimizer": {"lr": 0.001}, "telemetry_every": 50})");
  const std::string job_id = cluster.Submit(spec);
  auto running = cluster.WaitForJob(
      job_id,
      [](const v1::Job& job) {
        return job.state() != v1::PENDING &&
               (job.state() != v1::RUNNING || job.progress(1).step() >= 1);
      },
      30);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING);
  const v1::Assignment rank0 = StealAssignment(cluster, *running, 0);
  ASSERT_EQ(rank0.rank_secret().size(), 32u);

  auto anonymous = cluster.Channel(cluster.SecurityFor(""));  // TLS, no token
  auto bob = cluster.Channel(cluster.SecurityFor("bob"));     // another user
  // A worker's credentials (certificate and token) but none of its secrets.
  auto worker_token = cluster.Channel(cluster.SecurityFor(LocalCluster::kSpareWorker));
  auto anon_user = v1::Coordinator::NewStub(anonymous);
  auto anon_worker = v1::WorkerControl::NewStub(anonymous);
  auto bob_user = v1::Coordinator::NewStub(bob);
  auto bob_worker = v1::WorkerControl::NewStub(bob);
  auto rogue = v1::WorkerControl::NewStub(worker_token);
  using C = v1::Coordinator::Stub;
  using W = v1::WorkerControl::Stub;

  // Forged results, telemetry and rendezvous data, as the abuses of the issue list them.
  v1::ReportRankResultRequest forged_success;
  forged_success.set_job_id(job_id);
  forged_success.set_attempt(1);
  forged_success.set_parameter_checksum("0000000000000000");
  v1::ReportRankResultRequest forged_failure = forged_success;
  forged_failure.set_error("forged failure");
  v1::ReportTelemetryRequest forged_telemetry;
  forged_telemetry.set_job_id(job_id);
  forged_telemetry.set_attempt(1);
  forged_telemetry.set_step(123456789);
  forged_telemetry.add_records()->set_step(123456789);
  forged_telemetry.mutable_records(0)->set_loss(-42);
  v1::KeyValueSetRequest forged_key;
  forged_key.set_job_id(job_id);
  forged_key.set_attempt(1);
  forged_key.set_key("gloo/0");
  forged_key.set_value("attacker");
  v1::KeyValueGetRequest peek;
  peek.set_job_id(job_id);
  peek.set_attempt(1);
  peek.set_key("gloo/0");

  SCOPED_TRACE("without a token");
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = running->spec();
  EXPECT_EQ(Call<C>(anon_user.get(), &C::SubmitJob, submit), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call<C>(anon_user.get(), &C::ListJobs, v1::ListJobsRequest()),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call<W>(anon_worker.get(), &W::ReportRankResult, forged_success),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call<W>(anon_worker.get(), &W::KeyValueSet, forged_key),
            grpc::StatusCode::UNAUTHENTICATED);

  SCOPED_TRACE("with a user's token (wrong role, or not the owner)");
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  // As an unknown job's: bob is not told that alice's job exists.
  EXPECT_EQ(Call<C>(bob_user.get(), &C::CancelJob, cancel), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Call<W>(bob_worker.get(), &W::ReportRankResult, forged_success),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Call<W>(bob_worker.get(), &W::ReportTelemetry, forged_telemetry),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Call<W>(bob_worker.get(), &W::KeyValueSet, forged_key),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::RegisterWorkerRequest fake_worker;
  fake_worker.set_host("127.0.0.1");
  fake_worker.set_device(v1::CPU);
  fake_worker.set_slots(8);
  fake_worker.set_name("fake");
  EXPECT_EQ(Call<W>(bob_worker.get(), &W::RegisterWorker, fake_worker),
            grpc::StatusCode::PERMISSION_DENIED);

  SCOPED_TRACE("with the worker role but no secret, another rank's secret or a stale one");
  for (int rank = 0; rank < 2; ++rank) {
    forged_success.set_rank(rank);
    forged_failure.set_rank(rank);
    forged_telemetry.set_rank(rank);
    EXPECT_EQ(Call<W>(rogue.get(), &W::ReportRankResult, forged_success),
              grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(Call<W>(rogue.get(), &W::ReportRankResult, forged_failure),
              grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(Call<W>(rogue.get(), &W::ReportTelemetry, forged_telemetry),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(Call<W>(rogue.get(), &W::KeyValueSet, forged_key),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Call<W>(rogue.get(), &W::KeyValueGet, peek), grpc::StatusCode::PERMISSION_DENIED);
  // Rank 0's stolen secret does not speak for rank 1, nor for another attempt.
  forged_success.set_rank(1);
  forged_success.set_rank_secret(rank0.rank_secret());
  EXPECT_EQ(Call<W>(rogue.get(), &W::ReportRankResult, forged_success),
            grpc::StatusCode::PERMISSION_DENIED);
  forged_telemetry.set_rank(1);
  forged_telemetry.set_rank_secret(rank0.rank_secret());
  EXPECT_EQ(Call<W>(rogue.get(), &W::ReportTelemetry, forged_telemetry),
            grpc::StatusCode::PERMISSION_DENIED);
  for (int attempt : {0, 2}) {
    forged_success.set_rank(0);
    forged_success.set_attempt(attempt);
    EXPECT_EQ(Call<W>(rogue.get(), &W::ReportRankResult, forged_success),
              grpc::StatusCode::PERMISSION_DENIED)
        << "attempt " << attempt;
  }
  // A live worker's name cannot be taken over, nor can it be deregistered by its public
  // incarnation alone.
  v1::ListWorkersResponse workers;
  {
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    ASSERT_TRUE(cluster.coordinator()->ListWorkers(&context, {}, &workers).ok());
  }
  ASSERT_EQ(workers.workers_size(), 2);
  fake_worker.set_name("w0");
  EXPECT_EQ(Call<W>(rogue.get(), &W::RegisterWorker, fake_worker),
            grpc::StatusCode::PERMISSION_DENIED)
      << "another worker's credentials registered w0";
  auto w0_again = v1::WorkerControl::NewStub(cluster.Channel(cluster.SecurityFor("w0")));
  EXPECT_EQ(Call<W>(w0_again.get(), &W::RegisterWorker, fake_worker),
            grpc::StatusCode::ALREADY_EXISTS)
      << "w0's own credentials, while w0 is live";
  for (const v1::Worker& worker : workers.workers()) {
    v1::DeregisterWorkerRequest deregister;
    deregister.set_worker_id(worker.worker_id());
    deregister.set_incarnation(worker.incarnation());
    EXPECT_EQ(Call<W>(rogue.get(), &W::DeregisterWorker, deregister),
              grpc::StatusCode::PERMISSION_DENIED);
    v1::ReportRankExitRequest exit;
    exit.set_worker_id(worker.worker_id());
    exit.set_job_id(job_id);
    exit.set_attempt(1);
    exit.set_term_signal(9);
    EXPECT_EQ(Call<W>(rogue.get(), &W::ReportRankExit, exit), grpc::StatusCode::PERMISSION_DENIED);
  }
  // A hostile-sized name is refused with a bounded message, not a transport error.
  submit.mutable_spec()->set_name(std::string(8'000, 'n'));
  {
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    v1::SubmitJobResponse response;
    grpc::Status status = cluster.coordinator()->SubmitJob(&context, submit, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_LT(status.error_message().size(), 400u);
  }

  // The attacks landed while the job was training (else they would prove little).
  auto during = cluster.WaitForJob(job_id, [](const v1::Job&) { return true; }, 5);
  ASSERT_TRUE(during.ok());
  EXPECT_EQ(during->state(), v1::RUNNING) << "the victim job ended before the attacks did";
  auto ended = cluster.WaitForEnd(job_id, 120);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state(), v1::SUCCEEDED) << ended->error();
  EXPECT_EQ(ended->owner(), "alice");
  ASSERT_EQ(ended->progress_size(), 2);
  EXPECT_EQ(ended->progress(0).step(), 4000);
  EXPECT_NE(ended->progress(0).parameter_checksum(), "0000000000000000");
  EXPECT_EQ(ended->progress(0).parameter_checksum(), ended->progress(1).parameter_checksum());
  EXPECT_EQ(ended->latest_telemetry().step(), 4000);
  EXPECT_GE(ended->latest_telemetry().loss(), 0);
  // Workers do not keep a finished rank's assignment (it held the rank's secret): the files
  // go once the rank processes are reaped.
  const std::string leftovers = absl::StrCat("ls ", cluster.dir(), "/w*/ | grep -c ", job_id);
  for (int i = 0; i < 100 && LastLine(RunCommand(leftovers).output) != "0"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(LastLine(RunCommand(leftovers).output), "0");
}

// Runs one unary call; its status.
template <typename Stub, typename Request, typename Response>
grpc::Status CallStatus(Stub* stub,
                        grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                     Response*),
                        const Request& request, Response* response) {
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  return (stub->*method)(&context, request, response);
}

// Two users of one secured cluster: bob's reads of alice's job answer as for a job that does
// not exist (no spec, path, log or telemetry of hers), his listing shows his jobs only; a
// viewer reads every job and changes none; an admin reads every job.
TEST(Security, Reads_AnotherUsersJob_NotFound_ViewerAndAdminReadAll) {
  LocalCluster cluster({});
  ASSERT_TRUE(cluster.Start().ok());
  const std::string spec_file = WriteSpec("alices", R"({
    "name": "alices-model", "world_size": 1, "device": "cpu",
    "model": {"input_dim": 4, "output_dim": 2}, "data": {"synthetic": {"seed": 1}},
    "micro_batch_size": 2, "accumulation_steps": 1, "steps": 20, "optimizer": {"lr": 0.1}})");
  const std::string alices = cluster.Submit(spec_file);  // trainctl acts as alice
  auto ended = cluster.WaitForEnd(alices, 60);
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_EQ(ended->state(), v1::SUCCEEDED) << ended->error();
  auto stub = [&](const std::string& principal) {
    return v1::Coordinator::NewStub(cluster.Channel(cluster.SecurityFor(principal)));
  };
  auto alice = stub("alice"), bob = stub("bob"), viewer = stub("viewer"), admin = stub("admin");
  using C = v1::Coordinator::Stub;
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ended->spec();
  submit.mutable_spec()->set_name("bobs-model");
  submit.mutable_spec()->set_steps(100'000'000);  // still running when bob cancels it
  v1::SubmitJobResponse bobs;
  ASSERT_TRUE(CallStatus<C>(bob.get(), &C::SubmitJob, submit, &bobs).ok());

  v1::GetJobRequest get;
  get.set_job_id(alices);
  v1::GetJobEventsRequest events;
  events.set_job_id(alices);
  v1::GetRankLogRequest log;
  log.set_job_id(alices);
  v1::GetJobRequest unknown;
  unknown.set_job_id("job-9999");
  v1::GetJobResponse job;
  const grpc::Status not_there = CallStatus<C>(bob.get(), &C::GetJob, unknown, &job);
  ASSERT_EQ(not_there.error_code(), grpc::StatusCode::NOT_FOUND);
  {
    SCOPED_TRACE("bob reads alice's job");
    const grpc::Status got = CallStatus<C>(bob.get(), &C::GetJob, get, &job);
    EXPECT_EQ(got.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(got.error_message(), absl::StrReplaceAll(not_there.error_message(),
                                                       {{"job-9999", alices}}))
        << "the answer differs from an unknown job's";
    v1::GetJobEventsResponse history;
    EXPECT_EQ(CallStatus<C>(bob.get(), &C::GetJobEvents, events, &history).error_code(),
              grpc::StatusCode::NOT_FOUND);
    v1::GetRankLogResponse output;
    const grpc::Status bobs_log = CallStatus<C>(bob.get(), &C::GetRankLog, log, &output);
    EXPECT_EQ(bobs_log.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(bobs_log.error_message(), got.error_message()) << "not an unknown job's answer";
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    v1::WatchJobRequest watch;
    watch.set_job_id(alices);
    auto reader = bob->WatchJob(&context, watch);
    v1::WatchJobEvent event;
    EXPECT_FALSE(reader->Read(&event)) << "bob was sent a snapshot of alice's job";
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
    v1::ListJobsResponse listed;
    ASSERT_TRUE(CallStatus<C>(bob.get(), &C::ListJobs, v1::ListJobsRequest(), &listed).ok());
    ASSERT_EQ(listed.jobs_size(), 1);
    EXPECT_EQ(listed.jobs(0).job_id(), bobs.job_id());
  }
  {
    SCOPED_TRACE("alice, the viewer and the admin");
    // The rank's output, or why there is none (a short job may ship none): not "unknown job".
    v1::GetRankLogResponse output;
    const grpc::Status alices_log = CallStatus<C>(alice.get(), &C::GetRankLog, log, &output);
    EXPECT_EQ(alices_log.error_message().find("unknown job"), std::string::npos)
        << alices_log.error_message();
    for (auto* reader : {alice.get(), viewer.get(), admin.get()}) {
      EXPECT_TRUE(CallStatus<C>(reader, &C::GetJob, get, &job).ok());
      EXPECT_EQ(job.job().owner(), "alice");
      v1::GetJobEventsResponse history;
      EXPECT_TRUE(CallStatus<C>(reader, &C::GetJobEvents, events, &history).ok());
      EXPECT_GT(history.events_size(), 0);
    }
    v1::ListJobsResponse listed;
    ASSERT_TRUE(CallStatus<C>(alice.get(), &C::ListJobs, v1::ListJobsRequest(), &listed).ok());
    EXPECT_EQ(listed.jobs_size(), 1);
    for (auto* reader : {viewer.get(), admin.get()}) {
      ASSERT_TRUE(CallStatus<C>(reader, &C::ListJobs, v1::ListJobsRequest(), &listed).ok());
      EXPECT_EQ(listed.jobs_size(), 2);
    }
  }
  {
    SCOPED_TRACE("the viewer changes nothing");
    v1::SubmitJobResponse submitted;
    const grpc::Status refused = CallStatus<C>(viewer.get(), &C::SubmitJob, submit, &submitted);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(refused.error_message().find("(role viewer) may not call"), std::string::npos)
        << refused.error_message();
    v1::CancelJobRequest cancel;
    cancel.set_job_id(bobs.job_id());
    v1::CancelJobResponse cancelled;
    EXPECT_EQ(CallStatus<C>(viewer.get(), &C::CancelJob, cancel, &cancelled).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(CallStatus<C>(alice.get(), &C::CancelJob, cancel, &cancelled).error_code(),
              grpc::StatusCode::NOT_FOUND)
        << "alice cancelled bob's job, or learned that it exists";
    EXPECT_TRUE(CallStatus<C>(bob.get(), &C::CancelJob, cancel, &cancelled).ok());
  }
}

// Each worker has its own identity: its token's principal and its client certificate's CN
// are its name, and the coordinator registers it under that name only.
TEST(Security, WorkerCredentials_RegisterOnlyTheNameTheyName) {
  LocalCluster cluster({});  // workers w0 and w1 registered, each with its own credentials
  ASSERT_TRUE(cluster.Start().ok());
  using W = v1::WorkerControl::Stub;
  v1::RegisterWorkerRequest registration;
  registration.set_host("127.0.0.1");
  registration.set_device(v1::CPU);
  registration.set_slots(64);
  registration.set_incarnation(9);
  registration.set_name("w2");
  auto as_w1 = v1::WorkerControl::NewStub(cluster.Channel(cluster.SecurityFor("w1")));
  v1::RegisterWorkerResponse registered;
  const grpc::Status other_name = CallStatus<W>(as_w1.get(), &W::RegisterWorker, registration,
                                                &registered);
  EXPECT_EQ(other_name.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(other_name.error_message().find("a worker registers under its token's principal: "
                                            "this token is worker w1's, not w2"),
            std::string::npos)
      << other_name.error_message();
  // w1's token with the spare worker's certificate: the certificate's CN must name w1 too.
  ClientSecurity mixed = cluster.SecurityFor(LocalCluster::kSpareWorker);
  mixed.token = cluster.SecurityFor("w1").token;
  auto mixed_stub = v1::WorkerControl::NewStub(cluster.Channel(mixed));
  registration.set_name("w1");
  const grpc::Status wrong_certificate =
      CallStatus<W>(mixed_stub.get(), &W::RegisterWorker, registration, &registered);
  EXPECT_EQ(wrong_certificate.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(wrong_certificate.error_message().find(
                "a worker registers under its client certificate's subject CN: this certificate "
                "is \"spare\"'s, not w1"),
            std::string::npos)
      << wrong_certificate.error_message();
  // The users' certificate names no worker.
  ClientSecurity user_certificate = cluster.SecurityFor("alice");
  user_certificate.token = cluster.SecurityFor(LocalCluster::kSpareWorker).token;
  registration.set_name(LocalCluster::kSpareWorker);
  auto user_cert_stub = v1::WorkerControl::NewStub(cluster.Channel(user_certificate));
  EXPECT_EQ(CallStatus<W>(user_cert_stub.get(), &W::RegisterWorker, registration, &registered)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A real daemon holding w1's credentials, started as w2: refused, it exits saying why (one
  // that registered would run until `timeout` ends it: exit 124, the check's output missing).
  const std::string pki = cluster.pki();
  CommandResult daemon = RunCommand(absl::StrCat(
      "timeout 20 ", RunfilePath("worker/worker"), " --coordinator=", cluster.address(),
      " --device=cpu --slots=1 --name=w2 --work_dir=", cluster.dir(), "/w2 --data_root=",
      TestTempDir(), " --output_root=", TestTempDir(), " --tls_ca=", pki, "/ca.pem --tls_cert=",
      pki, "/w1.pem --tls_key=", pki, "/w1.key --token_file=", pki, "/w1.token 2>&1"));
  EXPECT_NE(daemon.exit_code, 0) << daemon.output;
  EXPECT_NE(daemon.output.find("this token is worker w1's, not w2"), std::string::npos)
      << daemon.output;
  // Its own credentials register it.
  auto spare = v1::WorkerControl::NewStub(
      cluster.Channel(cluster.SecurityFor(LocalCluster::kSpareWorker)));
  const grpc::Status own = CallStatus<W>(spare.get(), &W::RegisterWorker, registration,
                                         &registered);
  EXPECT_TRUE(own.ok()) << own.error_message();
  EXPECT_EQ(registered.worker_id().substr(0, registered.worker_id().find('#')),
            LocalCluster::kSpareWorker);
}

TEST(Security, WrongCaMissingClientCertificateOrToken_AreRefused) {
  LocalCluster cluster({});
  ASSERT_TRUE(cluster.Start().ok());
  const std::string trainctl = RunfilePath("client/trainctl") + " --coordinator=" +
                               cluster.address() + " --timeout_ms=3000 ";
  const std::string pki = cluster.pki();
  const std::string client_cert =
      " --tls_cert=" + pki + "/client.pem --tls_key=" + pki + "/client.key";
  CommandResult wrong_ca = RunCommand(trainctl + "--tls_ca=" + pki + "/other-ca.pem" +
                                      client_cert + " --token_file=" + pki + "/alice.token list");
  EXPECT_EQ(wrong_ca.exit_code, 1) << wrong_ca.output;
  EXPECT_NE(wrong_ca.output.find("UNAVAILABLE"), std::string::npos) << wrong_ca.output;
  CommandResult plaintext = RunCommand(trainctl + "--token_file=" + pki + "/alice.token list");
  EXPECT_EQ(plaintext.exit_code, 1) << plaintext.output;
  // "Socket closed" alone does not say what is missing: the error names the flags.
  EXPECT_NE(plaintext.output.find("if it serves TLS, pass --tls_ca"), std::string::npos)
      << plaintext.output;
  CommandResult no_client_cert = RunCommand(trainctl + "--tls_ca=" + pki + "/ca.pem --token_file=" +
                                            pki + "/alice.token list");
  EXPECT_EQ(no_client_cert.exit_code, 1) << "mutual TLS: " << no_client_cert.output;
  EXPECT_NE(no_client_cert.output.find("requires a client certificate (mutual TLS), pass "
                                       "--tls_cert and --tls_key"),
            std::string::npos)
      << no_client_cert.output;
  CommandResult no_token = RunCommand(trainctl + "--tls_ca=" + pki + "/ca.pem" + client_cert +
                                      " list");
  EXPECT_EQ(no_token.exit_code, 1) << no_token.output;
  EXPECT_NE(no_token.output.find("UNAUTHENTICATED"), std::string::npos) << no_token.output;
  CommandResult ok = RunCommand(trainctl + "--tls_ca=" + pki + "/ca.pem" + client_cert +
                                " --token_file=" + pki + "/alice.token list");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

// One ServerReflectionInfo exchange asking list_services, as raw protobuf bytes (field 7, an
// empty string), through a generic stub: the answer's bytes name every service. Returns the
// answer and the call's status.
std::pair<std::string, grpc::Status> ListServicesByReflection(
    const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &queue);
  auto step = [&queue](std::function<void(void*)> start) {
    void* tag = nullptr;
    bool ok = false;
    start(reinterpret_cast<void*>(1));
    return queue.Next(&tag, &ok) && ok;
  };
  std::string answer;
  grpc::Status status;
  const char request_bytes[] = {0x3a, 0x00};  // list_services = ""
  grpc::Slice slice(request_bytes, sizeof(request_bytes));
  grpc::ByteBuffer request(&slice, 1);
  if (step([&](void* tag) { call->StartCall(tag); }) &&
      step([&](void* tag) { call->Write(request, tag); }) &&
      step([&](void* tag) { call->WritesDone(tag); })) {
    grpc::ByteBuffer response;
    if (step([&](void* tag) { call->Read(&response, tag); })) {
      std::vector<grpc::Slice> slices;
      (void)response.Dump(&slices);
      for (const grpc::Slice& part : slices) {
        answer.append(reinterpret_cast<const char*>(part.begin()), part.size());
      }
    }
  }
  step([&](void* tag) { call->Finish(&status, tag); });
  return {answer, status};
}

// WatchJob streams are bounded per principal (--max_watches_per_principal), so that one user's
// watches cannot take every place: alice's third is refused, bob's first (of his own job: he
// may not read hers) is served, and a place alice gives back is hers again.
TEST(Security, Watches_AreBoundedPerPrincipal) {
  LocalCluster::Options options;
  options.workers = 1;
  options.coordinator_flags = {"--max_watches_per_principal=2"};
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  // Two ranks on one slot: the job stays PENDING, so its watches stay open.
  const std::string job_id = cluster.Submit(WriteSpec("waiting", R"({
    "name": "waiting", "world_size": 2, "device": "cpu",
    "model": {"input_dim": 4, "output_dim": 2}, "data": {"synthetic": {"seed": 1}},
    "micro_batch_size": 2, "accumulation_steps": 1, "steps": 1, "optimizer": {"lr": 0.1}})"));
  ASSERT_FALSE(job_id.empty());
  auto alice = v1::Coordinator::NewStub(cluster.Channel(cluster.SecurityFor("alice")));
  auto bob = v1::Coordinator::NewStub(cluster.Channel(cluster.SecurityFor("bob")));
  v1::SubmitJobRequest bobs_submit;
  {
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    v1::GetJobRequest get;
    get.set_job_id(job_id);
    v1::GetJobResponse alices;
    ASSERT_TRUE(cluster.coordinator()->GetJob(&context, get, &alices).ok());
    *bobs_submit.mutable_spec() = alices.job().spec();
  }
  v1::SubmitJobResponse bobs_job;
  {
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    ASSERT_TRUE(bob->SubmitJob(&context, bobs_submit, &bobs_job).ok());
  }
  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::WatchJobEvent>> reader;
    v1::WatchJobEvent first;
    bool open = false;
  };
  auto watch = [&](v1::Coordinator::Stub* stub, const std::string& watched) {
    auto opened = std::make_unique<Watch>();
    opened->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::WatchJobRequest request;
    request.set_job_id(watched);
    opened->reader = stub->WatchJob(&opened->context, request);
    opened->open = opened->reader->Read(&opened->first);  // The snapshot, when admitted.
    return opened;
  };
  auto first = watch(alice.get(), job_id);
  auto second = watch(alice.get(), job_id);
  ASSERT_TRUE(first->open) << first->reader->Finish().error_message() << " job " << job_id;
  ASSERT_TRUE(second->open) << second->reader->Finish().error_message();
  EXPECT_EQ(first->first.snapshot().state(), v1::PENDING);
  auto third = watch(alice.get(), job_id);
  EXPECT_FALSE(third->open);
  const grpc::Status refused = third->reader->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("--max_watches_per_principal"), std::string::npos)
      << refused.error_message();
  auto bobs = watch(bob.get(), bobs_job.job_id());
  EXPECT_TRUE(bobs->open) << "alice's watches took bob's place";

  first->context.TryCancel();
  first->reader->Finish();
  bool readmitted = false;
  for (int attempt = 0; attempt < 50 && !readmitted; ++attempt) {
    auto again = watch(alice.get(), job_id);
    readmitted = again->open;
    if (readmitted) {
      again->context.TryCancel();
      again->reader->Finish();
    } else {
      again->reader->Finish();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  EXPECT_TRUE(readmitted) << "a watch alice ended did not give its place back";
  for (Watch* open : {second.get(), bobs.get()}) {
    open->context.TryCancel();
    open->reader->Finish();
  }
}

TEST(Security, ServerReflection_ListsTheServicesToUsersOnly) {
  LocalCluster cluster({});
  ASSERT_TRUE(cluster.Start().ok());
  auto [services, status] = ListServicesByReflection(cluster.Channel(cluster.SecurityFor("alice")));
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_NE(services.find("mptrain.v1.Coordinator"), std::string::npos) << services;
  EXPECT_NE(services.find("mptrain.v1.WorkerControl"), std::string::npos) << services;
  auto [nothing, refused] = ListServicesByReflection(cluster.Channel(cluster.SecurityFor("")));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED) << refused.error_message();
  EXPECT_TRUE(nothing.empty());
}

TEST(Security, NetworkListenWithoutTlsAndTokens_RefusesToStart) {
  CommandResult refused = RunCommand(RunfilePath("coordinator/coordinator") +
                                     " --listen=0.0.0.0:0");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--insecure"), std::string::npos) << refused.output;
}

class PathEscape : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = TestTempDir() + "/roots";
    own_ = root_ + "/alice";  // The cluster's trainctl is alice: her part of the output root.
    outside_ = TestTempDir() + "/outside";
    RunCommand("rm -rf " + root_ + " " + outside_ + " && mkdir -p " + own_ + " " + outside_);
    std::ofstream(outside_ + "/secret.txt") << "top secret";
    std::ofstream(own_ + "/existing.safetensors") << "keep me";
    ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/link").c_str()), 0);
    ASSERT_EQ(symlink(outside_.c_str(), (own_ + "/link").c_str()), 0);
    ASSERT_EQ(symlink((outside_ + "/secret.txt").c_str(), (own_ + "/final.safetensors").c_str()),
              0);
    LocalCluster::Options options;
    options.roots = root_;
    cluster_ = std::make_unique<LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start().ok());
  }

  std::string Spec(const std::string& name, const std::string& extra) {
    return WriteSpec(name, absl::StrCat(R"({
      "name": ")", name, R"(", "world_size": 2, "device": "cpu",
      "model": {"input_dim": 4, "output_dim": 2}, "data": {"synthetic": {"seed": 0}},
      "micro_batch_size": 2, "accumulation_steps": 1, "steps": 2, "optimizer": {"lr": 0.1})",
                                         extra, "}"));
  }

  // Submits and expects the job to fail naming `field` and `reason`.
  void ExpectJobFails(const std::string& name, const std::string& extra, const std::string& field,
                      const std::string& reason) {
    SCOPED_TRACE(name);
    const std::string job_id = cluster_->Submit(Spec(name, extra));
    auto ended = cluster_->WaitForEnd(job_id, 60);
    ASSERT_TRUE(ended.ok()) << ended.status();
    EXPECT_EQ(ended->state(), v1::FAILED);
    EXPECT_NE(ended->error().find(field), std::string::npos) << ended->error();
    EXPECT_NE(ended->error().find(reason), std::string::npos) << ended->error();
    EXPECT_EQ(ended->error().find("top secret"), std::string::npos) << ended->error();
  }

  std::string root_, own_, outside_;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(PathEscape, LexicalEscapes_RefusedAtSubmit_SameAnswerWhetherTheFileExists) {
  CommandResult dotdot = cluster_->Trainctl(
      "submit " + Spec("dotdot", R"(, "output_checkpoint": ")" + own_ + R"(/../../outside/x")"));
  EXPECT_EQ(dotdot.exit_code, 1);
  EXPECT_NE(dotdot.output.find("INVALID_ARGUMENT: output_checkpoint"), std::string::npos)
      << dotdot.output;
  CommandResult relative =
      cluster_->Trainctl("submit " + Spec("relative", R"(, "init_checkpoint": "init.st")"));
  EXPECT_NE(relative.output.find("INVALID_ARGUMENT: init_checkpoint"), std::string::npos)
      << relative.output;
  CommandResult dir = cluster_->Trainctl("submit " + Spec("dir", R"(, "checkpoint_every": 1,
      "checkpoint_dir": ")" + outside_ + R"(")"));
  EXPECT_NE(dir.output.find("PERMISSION_DENIED: checkpoint_dir"), std::string::npos)
      << dir.output;
  CommandResult exists =
      cluster_->Trainctl("submit " + Spec("a", R"(, "init_checkpoint": "/etc/passwd")"));
  CommandResult missing =
      cluster_->Trainctl("submit " + Spec("b", R"(, "init_checkpoint": "/etc/no-such-file")"));
  EXPECT_NE(exists.output.find("PERMISSION_DENIED: init_checkpoint"), std::string::npos)
      << exists.output;
  EXPECT_EQ(absl::StrReplaceAll(exists.output, {{"/etc/passwd", "P"}, {"a.json", "S"}}),
            absl::StrReplaceAll(missing.output, {{"/etc/no-such-file", "P"}, {"b.json", "S"}}))
      << "whether a file outside the roots exists must not show";
  EXPECT_NE(exists.output.find("outside the data roots"), std::string::npos) << exists.output;
}

TEST_F(PathEscape, SymlinksAndExistingOutputs_FailTheJobAndNothingIsWritten) {
  ExpectJobFails("middle", R"(, "init_checkpoint": ")" + root_ + R"(/link/secret.txt")",
                 "init_checkpoint", "symbolic link");
  ExpectJobFails("final", R"(, "output_checkpoint": ")" + own_ + R"(/final.safetensors")",
                 "output_checkpoint", "symbolic link");
  ExpectJobFails("existing", R"(, "output_checkpoint": ")" + own_ +
                                 R"(/existing.safetensors")",
                 "output_checkpoint", "overwrite_output");
  // A file no job of alice's wrote (unstamped) is not hers to replace, whatever the spec says.
  ExpectJobFails("unstamped", R"(, "overwrite_output": true, "output_checkpoint": ")" + own_ +
                                  R"(/existing.safetensors")",
                 "output_checkpoint", "was not written by a job of alice");
  ExpectJobFails("ckptdir", R"(, "checkpoint_every": 1, "checkpoint_dir": ")" + own_ +
                                R"(/link/ckpt")",
                 "checkpoint_dir", "symbolic link");
  EXPECT_EQ(ReadFile(outside_ + "/secret.txt"), "top secret");
  EXPECT_EQ(ReadFile(own_ + "/existing.safetensors"), "keep me");
  struct stat info {};
  EXPECT_NE(stat((outside_ + "/ckpt").c_str(), &info), 0) << "nothing created outside";

  // The workers are fine, and an explicit overwrite of alice's own output is honoured.
  for (const char* name : {"first", "overwrite"}) {
    const std::string job_id = cluster_->Submit(Spec(
        name, R"(, "overwrite_output": true, "output_checkpoint": ")" + own_ +
                  R"(/mine.safetensors")"));
    auto ended = cluster_->WaitForEnd(job_id, 60);
    ASSERT_TRUE(ended.ok()) << ended.status();
    EXPECT_EQ(ended->state(), v1::SUCCEEDED) << name << ": " << ended->error();
  }
}

}  // namespace
}  // namespace mptrain::testing
