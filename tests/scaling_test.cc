// Scaling beyond 2 ranks on CPU (issue 17): 4 and 8 gloo ranks, several ranks per worker daemon
// and several daemons per job, through the real coordinator, daemons and trainctl. Each job must
// succeed with one parameter checksum on every rank, be placed on every worker with several ranks
// each, and end equal to an independent double-precision reference (tests/reference_mlp.h) and,
// within fp32 rounding, to the same global batch trained by 2 ranks.

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "tests/local_cluster.h"
#include "tests/reference_mlp.h"
#include "trainer/parameter_layout.h"

namespace mptrain::testing {
namespace {

// The model and the data set all jobs share. Every step each rank walks its whole shard
// (micro_batch_size · accumulation_steps == rows / world_size), so every world size sees the
// same global batch of all kRows rows and computes the same mean gradient.
constexpr int kIn = 8, kOut = 3, kRows = 48, kAccumulation = 3, kSteps = 3;
const std::vector<int64_t> kWidths = {kIn, 6, 5, kOut};
constexpr double kLr = 0.1, kMomentum = 0.9, kWeightDecay = 0.01;

struct DataSet {
  NpyMatrix features{kRows, kIn, std::vector<float>(kRows * kIn)};
  NpyMatrix targets{kRows, kOut, std::vector<float>(kRows * kOut)};
  ParameterLayout layout = MakeParameterLayout(kWidths);
  std::vector<float> init;
};

// Written once into the test's scratch directory (the workers' data root).
const DataSet& Data() {
  static const DataSet* data = [] {
    auto* d = new DataSet;
    std::mt19937 generator(17);
    std::normal_distribution<float> normal;
    for (float& v : d->features.values) v = normal(generator);
    for (float& v : d->targets.values) v = normal(generator);
    d->init.resize(d->layout.total);
    for (float& v : d->init) v = 0.3f * normal(generator);
    const std::string dir = TestTempDir();
    EXPECT_TRUE(WriteNpyMatrix(dir + "/scaling_features.npy", d->features).ok());
    EXPECT_TRUE(WriteNpyMatrix(dir + "/scaling_targets.npy", d->targets).ok());
    const TensorMap init = ParametersToTensors(d->layout, d->init);
    EXPECT_TRUE(WriteSafetensors(dir + "/scaling_init.safetensors", init).ok());
    return d;
  }();
  return *data;
}

// kSteps of fp32 SGD (momentum, weight decay: torch.optim.SGD) in double precision, walked as the
// trainer does: rank r owns rows [r·N/W, (r+1)·N/W) and takes micro-batches of `batch` rows from a
// cursor that wraps within its shard; each micro-batch's gradient counts 1 / accumulation, and
// the allreduce averages the ranks.
std::vector<double> Reference(int world_size, int batch) {
  const DataSet& data = Data();
  const ParameterLayout& layout = data.layout;
  std::vector<double> params(data.init.begin(), data.init.end());
  std::vector<double> momentum(params.size(), 0.0);
  const int shard = kRows / world_size;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<ReferenceLayer> layers(layout.layers.size());
    std::vector<std::vector<double>> weight_grads(layers.size()), bias_grads(layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      const LayerLayout& ll = layout.layers[l];
      layers[l] = {static_cast<int>(ll.in), static_cast<int>(ll.out),
                   std::vector<double>(params.begin() + ll.weight_offset,
                                       params.begin() + ll.weight_offset + ll.in * ll.out),
                   std::vector<double>(params.begin() + ll.bias_offset,
                                       params.begin() + ll.bias_offset + ll.out)};
      weight_grads[l].assign(ll.in * ll.out, 0.0);
      bias_grads[l].assign(ll.out, 0.0);
    }
    for (int rank = 0; rank < world_size; ++rank) {
      for (int micro = 0; micro < kAccumulation; ++micro) {
        const int cursor = ((step * kAccumulation + micro) * batch) % shard;
        std::vector<double> x, y;  // (batch, kIn), (batch, kOut)
        for (int i = 0; i < batch; ++i) {
          const int row = rank * shard + (cursor + i) % shard;
          x.insert(x.end(), data.features.values.begin() + row * kIn,
                   data.features.values.begin() + (row + 1) * kIn);
          y.insert(y.end(), data.targets.values.begin() + row * kOut,
                   data.targets.values.begin() + (row + 1) * kOut);
        }
        ReferenceLossAndGrad(layers, ReferenceActivation::kRelu, x, y, batch,
                             1.0 / kAccumulation / world_size, &weight_grads, &bias_grads);
      }
    }
    auto update = [&](int64_t offset, const std::vector<double>& grads) {
      for (size_t i = 0; i < grads.size(); ++i) {
        double& p = params[offset + i];
        double& buffer = momentum[offset + i];
        buffer = kMomentum * buffer + grads[i] + kWeightDecay * p;
        p -= kLr * buffer;
      }
    };
    for (size_t l = 0; l < layers.size(); ++l) {
      update(layout.layers[l].weight_offset, weight_grads[l]);
      update(layout.layers[l].bias_offset, bias_grads[l]);
    }
  }
  return params;
}

struct JobRun {
  v1::Job job;
  std::vector<float> trained;  // rank 0's output checkpoint
};

// Submits the shared job with `world_size` ranks and waits for it; the job's name and output
// file carry `tag`, which must be new (outputs are never replaced).
JobRun RunJob(LocalCluster& cluster, int world_size, const std::string& tag) {
  const DataSet& data = Data();
  const std::string dir = TestTempDir();
  const std::string output = OutputPartOf("alice") + "/scaling_" + tag + ".safetensors";
  std::remove(output.c_str());
  const int batch = kRows / world_size / kAccumulation;
  const std::string spec = WriteSpec(
      "scaling_" + tag,
      absl::StrFormat(R"({
    "name": "scaling-%s", "world_size": %d, "device": "cpu",
    "model": {"input_dim": 8, "hidden_dims": [6, 5], "output_dim": 3, "activation": "relu"},
    "data": {"npy": {"features_path": "%s/scaling_features.npy",
                     "targets_path": "%s/scaling_targets.npy"}},
    "micro_batch_size": %d, "accumulation_steps": %d, "steps": %d, "precision": "fp32",
    "optimizer": {"lr": %g, "momentum": %g, "weight_decay": %g},
    "init_checkpoint": "%s/scaling_init.safetensors", "output_checkpoint": "%s",
    "telemetry_every": 1})",
                      tag, world_size, dir, dir, batch, kAccumulation, kSteps, kLr, kMomentum,
                      kWeightDecay, dir, output));
  JobRun run;
  CommandResult submitted = cluster.Trainctl("submit " + spec + " --wait");
  EXPECT_EQ(submitted.exit_code, 0) << submitted.output;
  CommandResult status = cluster.Trainctl("--output=json status " + LastLine(submitted.output));
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(status.output, &run.job).ok())
      << status.output;
  auto written = ReadSafetensors(output);
  EXPECT_TRUE(written.ok()) << written.status();
  if (!written.ok()) return run;
  auto trained = TensorsToParameters(data.layout, *written, "out");
  EXPECT_TRUE(trained.ok()) << trained.status();
  if (trained.ok()) run.trained = *trained;
  return run;
}

// The same global batch on 2 ranks (one worker's two slots), run once for the whole test.
const std::vector<float>& TwoRankResult(LocalCluster& cluster) {
  static const std::vector<float> result = RunJob(cluster, 2, "two_ranks").trained;
  return result;
}

void ExpectSucceededOnEveryRank(const v1::Job& job, int world_size) {
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.DebugString();
  ASSERT_EQ(job.progress_size(), world_size);
  const std::string checksum = job.progress(0).parameter_checksum();
  EXPECT_FALSE(checksum.empty());
  for (const v1::RankProgress& progress : job.progress()) {
    EXPECT_TRUE(progress.finished()) << "rank " << progress.rank();
    EXPECT_EQ(progress.step(), kSteps) << "rank " << progress.rank();
    EXPECT_EQ(progress.parameter_checksum(), checksum) << "rank " << progress.rank();
  }
}

// Every worker holds `slots` ranks, on distinct devices 0..slots-1.
void ExpectRanksOnEveryWorker(const v1::Job& job, int workers, int slots) {
  ASSERT_EQ(job.placement_size(), workers * slots);
  std::map<std::string, std::set<int>> devices_of;
  for (const v1::RankPlacement& placement : job.placement()) {
    EXPECT_TRUE(devices_of[placement.worker_id()].insert(placement.device_index()).second)
        << "rank " << placement.rank() << " shares device " << placement.device_index();
  }
  EXPECT_EQ(devices_of.size(), static_cast<size_t>(workers)) << job.DebugString();
  for (const auto& [worker, devices] : devices_of) {
    EXPECT_EQ(devices.size(), static_cast<size_t>(slots)) << worker << " " << job.DebugString();
    EXPECT_EQ(*devices.rbegin(), slots - 1) << worker;
  }
}

void ExpectNear(const std::vector<float>& actual, const std::vector<double>& expected,
                double tolerance, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], tolerance * (1 + std::fabs(expected[i])))
        << what << ", parameter " << i;
  }
}

void CheckScaling(int workers, int slots) {
  const int world_size = workers * slots;
  LocalCluster::Options options;
  options.workers = workers;
  options.slots_per_worker = slots;
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  JobRun run = RunJob(cluster, world_size, absl::StrCat(workers, "x", slots));
  ExpectSucceededOnEveryRank(run.job, world_size);
  ExpectRanksOnEveryWorker(run.job, workers, slots);
  ExpectNear(run.trained, Reference(world_size, kRows / world_size / kAccumulation), 1e-6,
             "against the reference");
  const std::vector<float>& two_ranks = TwoRankResult(cluster);
  ExpectNear(run.trained, std::vector<double>(two_ranks.begin(), two_ranks.end()), 1e-6,
             "against 2 ranks with the same global batch");
}

TEST(Scaling, FourRanks_TwoWorkersTwoSlots_MatchesReferenceAndTwoRanks) { CheckScaling(2, 2); }

TEST(Scaling, EightRanks_FourWorkersTwoSlots_MatchesReferenceAndTwoRanks) { CheckScaling(4, 2); }

TEST(Scaling, EightRanks_TwoWorkersFourSlots_MatchesReferenceAndTwoRanks) { CheckScaling(2, 4); }

}  // namespace
}  // namespace mptrain::testing
