// End-to-end tests: a real coordinator, real worker daemons and their rank processes, driven by
// trainctl and by raw worker-side RPCs, all on loopback.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "tests/local_cluster.h"
#include "tests/reference_mlp.h"
#include "trainer/parameter_layout.h"

namespace mptrain::testing {
namespace {

TEST(Integration, SeedJob_TwoWorkers_SucceedsWithIdenticalParameters) {
  LocalCluster cluster({});
  ASSERT_TRUE(cluster.Start().ok());
  CommandResult result =
      cluster.Trainctl("submit " + RunfilePath("examples/seed_cpu.json") + " --wait");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string job_id = LastLine(result.output);
  EXPECT_EQ(job_id, "job-0001");
  EXPECT_NE(result.output.find("SUCCEEDED"), std::string::npos) << result.output;
  for (int step = 1; step <= 5; ++step) {
    EXPECT_NE(result.output.find(absl::StrCat("step      ", step, "  loss")), std::string::npos)
        << "watch shows step " << step << ":\n" << result.output;
  }

  CommandResult status = cluster.Trainctl("--output=json status " + job_id);
  ASSERT_EQ(status.exit_code, 0) << status.output;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(status.output, &job).ok())
      << status.output;
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  ASSERT_EQ(job.progress_size(), 2);
  EXPECT_EQ(job.progress(0).step(), 5);
  EXPECT_FALSE(job.progress(0).parameter_checksum().empty());
  EXPECT_EQ(job.progress(0).parameter_checksum(), job.progress(1).parameter_checksum());
  ASSERT_EQ(job.placement_size(), 2);
  EXPECT_NE(job.placement(0).worker_id(), job.placement(1).worker_id());
  EXPECT_EQ(job.latest_telemetry().step(), 5);
  EXPECT_EQ(job.latest_telemetry().loss_scale(), 65536);
  EXPECT_GT(job.latest_telemetry().samples_per_second(), 0);

  CommandResult list = cluster.Trainctl("list");
  EXPECT_NE(list.output.find("job-0001"), std::string::npos);
  CommandResult workers = cluster.Trainctl("workers");
  EXPECT_NE(workers.output.find("ALIVE"), std::string::npos) << workers.output;
  // Both workers are free again and take the next job.
  CommandResult again =
      cluster.Trainctl("submit " + RunfilePath("examples/seed_cpu.json") + " --wait");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  // Each worker ran both of its ranks in warm rank processes: the first in the one ready from
  // the daemon's start, the second in that same process, kept after the first job ended
  // cleanly (--reuse_ranks, issue 33) instead of a new one that would set up again.
  for (int worker = 0; worker < 2; ++worker) {
    std::ifstream file(absl::StrCat(cluster.dir(), "/worker", worker, ".log"));
    const std::string log((std::istreambuf_iterator<char>(file)), {});
    std::set<std::string> pids;
    for (size_t at = log.find("handed to the warm rank process "); at != std::string::npos;
         at = log.find("handed to the warm rank process ", at + 1)) {
      pids.insert(log.substr(at + 32, log.find(' ', at + 32) - at - 32));
    }
    EXPECT_EQ(pids.size(), 1u) << "worker " << worker << "'s log:\n" << log;
    EXPECT_NE(log.find("reused: it ran 1 job(s) before, the last job-0001)"), std::string::npos)
        << "worker " << worker << "'s log:\n" << log;
  }
}

TEST(Integration, NpyDataAndCheckpointInit_TwoRanks_OneFp32StepMatchesReference) {
  const int in = 8, hidden = 6, out = 3, rows = 12, batch = 2, accumulation = 3;
  std::mt19937 generator(5);
  std::normal_distribution<float> normal;
  NpyMatrix features{rows, in, std::vector<float>(rows * in)};
  NpyMatrix targets{rows, out, std::vector<float>(rows * out)};
  for (float& v : features.values) v = normal(generator);
  for (float& v : targets.values) v = normal(generator);
  const std::string dir = TestTempDir();
  const std::string output = OutputPartOf("alice") + "/out.safetensors";  // alice submits.
  std::remove(output.c_str());  // Outputs are never replaced.
  ASSERT_TRUE(WriteNpyMatrix(dir + "/features.npy", features).ok());
  ASSERT_TRUE(WriteNpyMatrix(dir + "/targets.npy", targets).ok());
  ParameterLayout layout = MakeParameterLayout({in, hidden, out});
  std::vector<float> init(layout.total);
  for (float& v : init) v = 0.3f * normal(generator);
  ASSERT_TRUE(WriteSafetensors(dir + "/init.safetensors", ParametersToTensors(layout, init)).ok());
  std::string spec = WriteSpec("npy", absl::StrCat(R"({
    "name": "npy", "world_size": 2, "device": "cpu",
    "model": {"input_dim": 8, "hidden_dims": [6], "output_dim": 3, "activation": "relu"},
    "data": {"npy": {"features_path": ")", dir, R"(/features.npy", "targets_path": ")", dir,
                                                R"(/targets.npy"}},
    "micro_batch_size": 2, "accumulation_steps": 3, "steps": 1, "precision": "fp32",
    "optimizer": {"lr": 0.5, "momentum": 0.9, "weight_decay": 0.1},
    "init_checkpoint": ")", dir, R"(/init.safetensors",
    "output_checkpoint": ")", output, R"("
  })"));

  LocalCluster cluster({});
  ASSERT_TRUE(cluster.Start().ok());
  CommandResult result = cluster.Trainctl("submit " + spec + " --wait");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto written = ReadSafetensors(output);
  ASSERT_TRUE(written.ok()) << written.status();
  auto trained = TensorsToParameters(layout, *written, "out");
  ASSERT_TRUE(trained.ok()) << trained.status();

  // Reference: rank r owns rows [6r, 6r + 6) and walks them in micro-batches of 2; each
  // micro-batch contributes grad / accumulation; the allreduce averages the two ranks.
  std::vector<ReferenceLayer> layers(2);
  std::vector<std::vector<double>> weight_grads(2), bias_grads(2);
  for (size_t l = 0; l < 2; ++l) {
    const LayerLayout& ll = layout.layers[l];
    layers[l] = {static_cast<int>(ll.in), static_cast<int>(ll.out),
                 std::vector<double>(init.begin() + ll.weight_offset,
                                     init.begin() + ll.weight_offset + ll.in * ll.out),
                 std::vector<double>(init.begin() + ll.bias_offset,
                                     init.begin() + ll.bias_offset + ll.out)};
    weight_grads[l].assign(ll.in * ll.out, 0.0);
    bias_grads[l].assign(ll.out, 0.0);
  }
  for (int rank = 0; rank < 2; ++rank) {
    for (int micro = 0; micro < accumulation; ++micro) {
      const int first_row = rank * rows / 2 + micro * batch;
      std::vector<double> x(features.values.begin() + first_row * in,
                            features.values.begin() + (first_row + batch) * in);
      std::vector<double> y(targets.values.begin() + first_row * out,
                            targets.values.begin() + (first_row + batch) * out);
      ReferenceLossAndGrad(layers, ReferenceActivation::kRelu, x, y, batch,
                           1.0 / accumulation / 2, &weight_grads, &bias_grads);
    }
  }
  for (size_t l = 0; l < 2; ++l) {
    const LayerLayout& ll = layout.layers[l];
    auto check = [&](int64_t offset, const std::vector<double>& grads) {
      for (size_t i = 0; i < grads.size(); ++i) {
        const double p = init[offset + i];
        const double expected = p - 0.5 * (grads[i] + 0.1 * p);
        EXPECT_NEAR((*trained)[offset + i], expected, 1e-5 * (1 + std::fabs(expected)))
            << "layer " << l << " element " << i;
      }
    };
    check(ll.weight_offset, weight_grads[l]);
    check(ll.bias_offset, bias_grads[l]);
  }
}

TEST(Integration, WorkerProtocol_RegisterAssignUniqueIdTelemetryResult) {
  LocalCluster::Options options;
  options.workers = 0;
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  auto* stub = cluster.worker_control();
  auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(10); };

  v1::RegisterWorkerRequest registration;
  registration.set_host("127.0.0.1");
  registration.set_device(v1::CUDA);
  registration.set_slots(2);
  registration.set_incarnation(42);
  registration.set_name(LocalCluster::kSpareWorker);  // worker_control()'s own name
  v1::RegisterWorkerResponse registered;
  {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    ASSERT_TRUE(stub->RegisterWorker(&context, registration, &registered).ok());
  }
  std::string spec = WriteSpec("cuda_seed", absl::StrCat(R"({
    "name": "fake", "world_size": 2, "device": "cuda",
    "model": {"input_dim": 4, "output_dim": 2}, "data": {"synthetic": {"seed": 0}},
    "micro_batch_size": 2, "accumulation_steps": 1, "steps": 1, "optimizer": {"lr": 0.1}})"));
  const std::string job_id = cluster.Submit( spec);

  v1::PollAssignmentsRequest poll;
  poll.set_worker_id(registered.worker_id());
  poll.set_incarnation(42);
  poll.set_worker_secret(registered.worker_secret());
  poll.set_wait_ms(5'000);
  v1::PollAssignmentsResponse assignments;
  {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    ASSERT_TRUE(stub->PollAssignments(&context, poll, &assignments).ok());
  }
  ASSERT_EQ(assignments.start_size(), 2);
  EXPECT_EQ(assignments.start(1).device_index(), 1);
  const int attempt = assignments.start(0).attempt();
  const std::string secret0 = assignments.start(0).rank_secret();
  const std::string secret1 = assignments.start(1).rank_secret();
  ASSERT_EQ(secret0.size(), 32u);
  ASSERT_NE(secret0, secret1) << "every rank has its own capability";

  // Rank 1 blocks on the unique id until rank 0 publishes its 128 bytes.
  std::string unique_id(128, '\0');
  for (int i = 0; i < 128; ++i) unique_id[i] = static_cast<char>(i * 7);
  v1::KeyValueGetResponse fetched;
  grpc::Status get_status;
  std::atomic<bool> get_answered{false};
  std::thread rank1([&] {
    v1::KeyValueGetRequest get;
    get.set_job_id(job_id);
    get.set_attempt(attempt);
    get.set_key("nccl_unique_id");
    get.set_timeout_ms(10'000);
    get.set_rank(1);
    get.set_rank_secret(secret1);
    grpc::ClientContext context;
    context.set_deadline(deadline() + std::chrono::seconds(10));
    get_status = stub->KeyValueGet(&context, get, &fetched);
    get_answered = true;
  });
  // Time for the read to reach the coordinator first (it may come after the write under load:
  // the value is then simply there); a read answered before the write was not blocked.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(get_answered.load()) << "KeyValueGet answered before the key was set: "
                                    << get_status.error_message();
  {
    v1::KeyValueSetRequest set;
    set.set_job_id(job_id);
    set.set_attempt(attempt);
    set.set_key("nccl_unique_id");
    set.set_value(unique_id);
    set.set_rank(0);
    set.set_rank_secret(secret0);
    v1::KeyValueSetResponse response;
    grpc::ClientContext context;
    context.set_deadline(deadline());
    ASSERT_TRUE(stub->KeyValueSet(&context, set, &response).ok());
  }
  rank1.join();
  ASSERT_TRUE(get_status.ok()) << get_status.error_message();
  EXPECT_EQ(fetched.value(), unique_id);

  // A get that nobody answers times out with DEADLINE_EXCEEDED.
  {
    v1::KeyValueGetRequest get;
    get.set_job_id(job_id);
    get.set_attempt(attempt);
    get.set_key("never");
    get.set_timeout_ms(300);
    get.set_rank_secret(secret0);
    grpc::ClientContext context;
    context.set_deadline(deadline());
    v1::KeyValueGetResponse response;
    EXPECT_EQ(stub->KeyValueGet(&context, get, &response).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }

  // A rank holds at most 16 waiting reads (kDefaultLongPollLimits): the 17th is refused at
  // once, its peer is still served, and reads that end give their places back.
  {
    constexpr int kOpen = 16;
    auto waiting_get = [&](int rank, const std::string& secret, const std::string& key,
                           int64_t timeout_ms) {
      v1::KeyValueGetRequest get;
      get.set_job_id(job_id);
      get.set_attempt(attempt);
      get.set_key(key);
      get.set_timeout_ms(timeout_ms);
      get.set_rank(rank);
      get.set_rank_secret(secret);
      grpc::ClientContext context;
      context.set_deadline(deadline() + std::chrono::seconds(20));
      v1::KeyValueGetResponse response;
      return stub->KeyValueGet(&context, get, &response);
    };
    // Sixteen reads of a key set below; one refused while a probe holds a place reads again.
    std::array<grpc::Status, kOpen> ended;
    std::vector<std::thread> readers;
    for (int i = 0; i < kOpen; ++i) {
      readers.emplace_back([&, i] {
        for (int tries = 0; tries < 1'000; ++tries) {
          ended[i] = waiting_get(0, secret0, "released", 20'000);
          if (ended[i].error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      });
    }
    // One probe at a time (admitted, it ends after 1 ms): refused only once the 16 are open.
    grpc::Status refused;
    for (int tries = 0; tries < 500; ++tries) {
      refused = waiting_get(0, secret0, "never", 1);
      if (refused.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(refused.error_message().find("rank 0 of job"), std::string::npos)
        << refused.error_message();
    const grpc::Status peer = waiting_get(1, secret1, "nccl_unique_id", 1'000);
    EXPECT_TRUE(peer.ok()) << "rank 0's reads took rank 1's place: " << peer.error_message();
    {
      v1::KeyValueSetRequest set;
      set.set_job_id(job_id);
      set.set_attempt(attempt);
      set.set_key("released");
      set.set_value("1");
      set.set_rank(0);
      set.set_rank_secret(secret0);
      v1::KeyValueSetResponse response;
      grpc::ClientContext context;
      context.set_deadline(deadline());
      ASSERT_TRUE(stub->KeyValueSet(&context, set, &response).ok());
    }
    for (auto& reader : readers) reader.join();
    for (const grpc::Status& status : ended) EXPECT_TRUE(status.ok()) << status.error_message();
    bool readmitted = false;
    for (int tries = 0; tries < 50 && !readmitted; ++tries) {
      readmitted = waiting_get(0, secret0, "released", 1'000).ok();
      if (!readmitted) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(readmitted) << "the ended reads did not give their places back";
  }

  v1::ReportTelemetryRequest telemetry;
  telemetry.set_job_id(job_id);
  telemetry.set_attempt(attempt);
  telemetry.set_step(1);
  telemetry.set_rank_secret(secret0);
  telemetry.add_records()->set_step(1);
  telemetry.mutable_records(0)->set_loss(0.25);
  {
    v1::ReportTelemetryResponse response;
    grpc::ClientContext context;
    context.set_deadline(deadline());
    ASSERT_TRUE(stub->ReportTelemetry(&context, telemetry, &response).ok());
    EXPECT_FALSE(response.abort());
  }
  for (int rank = 0; rank < 2; ++rank) {
    v1::ReportRankResultRequest result;
    result.set_job_id(job_id);
    result.set_rank(rank);
    result.set_attempt(attempt);
    result.set_parameter_checksum("same");
    result.set_rank_secret(rank == 0 ? secret0 : secret1);
    v1::ReportRankResultResponse response;
    grpc::ClientContext context;
    context.set_deadline(deadline());
    ASSERT_TRUE(stub->ReportRankResult(&context, result, &response).ok());
  }
  CommandResult watch = cluster.Trainctl("watch " + job_id);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_NE(watch.output.find("SUCCEEDED"), std::string::npos) << watch.output;
  CommandResult status = cluster.Trainctl("status " + job_id);
  EXPECT_NE(status.output.find("loss 0.250000"), std::string::npos) << status.output;
}

TEST(Integration, PlaintextLoopbackWithoutTokens_SeedJobSucceeds) {
  // The quick start: no TLS, no tokens, loopback only. Capabilities still apply.
  LocalCluster::Options options;
  options.secure = false;
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  CommandResult result =
      cluster.Trainctl("submit " + RunfilePath("examples/seed_cpu.json") + " --wait");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  CommandResult status = cluster.Trainctl("--output=json status " + LastLine(result.output));
  EXPECT_NE(status.output.find("\"owner\": \"anonymous\""), std::string::npos) << status.output;

  // A second coordinator on the same address is refused (gRPC's default SO_REUSEPORT let it
  // start, and the kernel split the workers and clients between the two).
  CommandResult second = RunCommand(
      "timeout 20 " + RunfilePath("coordinator/coordinator") + " --listen=" + cluster.address() +
      " --ephemeral 2>&1");
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_NE(second.output.find("cannot listen on " + cluster.address()), std::string::npos)
      << second.output;
}

TEST(Integration, InvalidSpec_IsRefusedNamingTheField) {
  LocalCluster cluster({});
  ASSERT_TRUE(cluster.Start().ok());
  std::string spec = WriteSpec("bad", R"({
    "name": "bad", "world_size": 2, "device": "cpu",
    "model": {"input_dim": 8, "hidden_dims": [4, 0], "output_dim": 2},
    "data": {"synthetic": {"seed": 0}}, "micro_batch_size": 2, "accumulation_steps": 1,
    "steps": 1, "optimizer": {"lr": 0.1}})");
  CommandResult result = cluster.Trainctl("submit " + spec);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("INVALID_ARGUMENT"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("model.hidden_dims[1] must be > 0, got 0"), std::string::npos)
      << result.output;
  CommandResult list = cluster.Trainctl("--output=json list");
  EXPECT_EQ(list.output.find("job-"), std::string::npos) << "nothing was queued";

  std::string unknown = WriteSpec("unknown", R"({"name": "x", "world_sise": 2})");
  CommandResult refused = cluster.Trainctl("submit " + unknown);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("world_sise"), std::string::npos) << refused.output;

  CommandResult missing = cluster.Trainctl("status job-4242");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("NOT_FOUND"), std::string::npos) << missing.output;
}

TEST(Integration, UnreachableCoordinator_OneLineErrorAndNonZeroExit) {
  CommandResult result = RunCommand(RunfilePath("client/trainctl") +
                                    " --coordinator=127.0.0.1:1 --timeout_ms=2000 list");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("trainctl: list failed: UNAVAILABLE"), std::string::npos)
      << result.output;
  EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
}

// SIGTERM stops a daemon cleanly whichever of its threads it lands on: OpenBLAS starts its
// pool before main, and a daemon that blocked the signal for a sigwait thread was killed
// outright when it landed there (no deregistration, its work directory left in /tmp). Here
// while it waits for a coordinator that is not there, with a pool of 4.
TEST(Integration, WorkerDaemonSigtermWhileRegistering_ExitsCleanlyAndRemovesItsWorkDir) {
  const std::string tmp = TestTempDir() + "/sigterm_tmp";
  const std::string script =
      "mkdir -p " + tmp + "; cd " + tmp + "; OPENBLAS_NUM_THREADS=4 TMPDIR=" + tmp + " " +
      RunfilePath("worker/worker") +
      " --coordinator=127.0.0.1:1 --device=cpu --name=leaving --data_root=" + tmp +
      " --output_root=" + tmp + " >worker.log 2>&1 & "
      "pid=$!; sleep 1.5; kill -TERM $pid; wait $pid; echo \"exit $?\"; "
      "echo \"left $(ls -d " + tmp + "/mptrain-worker-* 2>/dev/null | wc -l)\"; cat worker.log";
  CommandResult result = RunCommand("bash -c '" + script + "'");
  EXPECT_NE(result.output.find("exit 0"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("left 0"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("signal 15: stopping ranks and exiting"), std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace mptrain::testing
