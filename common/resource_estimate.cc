#include "common/resource_estimate.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/job_spec.h"
#include "trainer/model/gpt_memory_plan.h"

namespace mptrain {
namespace {

// CUDA context, cuBLASLt workspace (64 MiB) and NCCL's buffers; a CPU rank's process, gloo
// and OpenBLAS buffers.
constexpr double kCudaWorkspaceBytes = 1.0 * (1 << 30);
constexpr double kCpuWorkspaceBytes = 128.0 * (1 << 20);
// trainer/mlp.h: per-micro-batch low-precision gradients are kept only within this budget.
constexpr double kDeferredGradientBudgetBytes = 8.0 * (int64_t{1} << 30);

int64_t Saturate(double bytes) {
  constexpr double kMax = static_cast<double>(std::numeric_limits<int64_t>::max());
  return bytes >= kMax ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(bytes);
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%d B", bytes) : absl::StrFormat("%.1f %s", value, units[unit]);
}

std::string RankMemoryEstimate::Describe() const {
  return absl::StrFormat("%s (parameters %s, gradients %s, optimizer %s, activations %s, "
                         "workspace %s)",
                         FormatBytes(total), FormatBytes(parameters), FormatBytes(gradients),
                         FormatBytes(optimizer), FormatBytes(activations), FormatBytes(workspace));
}

namespace {

// model.gpt: the parameters, gradients and optimizer state GptModel::Create and the optimizer
// allocate, the activation plan the model allocates from, and the cross-entropy's scratch, the
// token micro-batches and the evaluator's buffers.
RankMemoryEstimate EstimateGptRankMemory(const v1::JobSpec& spec) {
  const v1::GptSpec& gpt = spec.model().gpt();
  const double V = static_cast<double>(gpt.vocab_size());
  const double Vp = std::max(V, static_cast<double>(gpt.padded_vocab_size()));
  const double T = static_cast<double>(gpt.context_length());
  const double L = static_cast<double>(gpt.layers());
  const double C = static_cast<double>(gpt.width());
  const double B = static_cast<double>(spec.micro_batch_size());
  const double N = B * T;
  const double n = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
  // The compute dtype's element: 2 bytes on the GPU; the CPU backend keeps low-precision
  // values in 4-byte floats.
  const bool fp32 = spec.precision() == v1::FP32;
  const bool cuda = spec.device() == v1::CUDA;
  const double e = cuda && !fp32 ? 2 : 4;
  // The activations: the model's plan itself (trainer/model/gpt_memory_plan.h), for the traits
  // the job's backend reports.
  GptConfig config;
  config.vocab_size = gpt.vocab_size();
  config.padded_vocab_size = std::max(gpt.vocab_size(), gpt.padded_vocab_size());
  config.context_length = gpt.context_length();
  config.layers = gpt.layers();
  config.heads = gpt.heads();
  config.width = gpt.width();
  const DType compute = fp32 ? DType::kF32
                             : (spec.precision() == v1::BF16 ? DType::kBF16 : DType::kF16);
  const GptBackendTraits traits =
      TraitsForDevice(cuda, compute, spec.micro_batch_size(), config);
  const double plan =
      PlanGptActivations(config, compute, spec.micro_batch_size(), traits).Bytes(traits);
  const double activations =
      plan
      // The cross-entropy's f32 scratch where the loss is not fused (loss/cross_entropy.cc):
      // log-probabilities, target distribution, probabilities, and the gradient before its cast.
      + (traits.fused_loss ? 0 : (fp32 ? 3 : 4) * N * V * 4)
      + 2 * 2 * N * 4  // ids and targets, training and eval
      + 2 * 4;         // the evaluator's sums
  // cuDNN's deterministic attention backward keeps dP in its workspace: B·H·T² 2-byte values
  // (backends/cuda/cudnn_attention.h); the default fused backward needs next to nothing.
  const double attention_workspace =
      cuda && !fp32 && spec.deterministic() ? B * gpt.heads() * T * T * 2 : 0;
  const double workspace =
      cuda ? kCudaWorkspaceBytes + attention_workspace
           : kCpuWorkspaceBytes + 4 * std::max(V * C, 4 * C * C) + 2 * T * T * 4;
  const bool compressed = spec.grad_comm_dtype() == v1::FP16 || spec.grad_comm_dtype() == v1::BF16;
  const double wire = compressed ? n * (spec.device() == v1::CUDA ? 2 : 4) : 0;
  const v1::OptimizerKind kind = spec.optimizer().kind();
  const double state_buffers = kind == v1::ADAM || kind == v1::ADAMW ? 2 : 1;
  RankMemoryEstimate estimate;
  estimate.parameters = Saturate(n * (4 + e));
  estimate.gradients = Saturate((n + 2) * 4 + wire);
  estimate.optimizer = Saturate(n * 4 * state_buffers);
  estimate.activations = Saturate(activations);
  estimate.workspace = Saturate(workspace);
  estimate.total = Saturate(n * (4 + e) + (n + 2) * 4 + wire + n * 4 * state_buffers +
                            activations + workspace);
  return estimate;
}

}  // namespace

RankMemoryEstimate EstimateRankMemory(const v1::JobSpec& spec) {
  if (spec.model().has_gpt()) return EstimateGptRankMemory(spec);
  // Doubles: a hostile spec (three layers 2^20 wide) is ~10^13 bytes, far from double's limits,
  // and nothing here can overflow.
  const std::vector<int64_t> widths = LayerWidths(spec.model());
  const bool norm = spec.model().norm() == v1::LAYER_NORM ||
                    spec.model().norm() == v1::BATCH_NORM ||
                    spec.model().norm() == v1::SYNC_BATCH_NORM;
  double n = 0, largest_layer = 0, outputs = 0, gelu_outputs = 0, norm_outputs = 0;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const double weights = static_cast<double>(widths[i]) * widths[i + 1];
    n += weights + widths[i + 1];
    largest_layer = std::max(largest_layer, weights);
    outputs += widths[i + 1];
    const bool hidden = i + 2 < widths.size();
    if (hidden && spec.model().activation() == v1::GELU) gelu_outputs += widths[i + 1];
    if (hidden && norm) {
      n += 2.0 * widths[i + 1];  // the norm's weight and bias
      norm_outputs += widths[i + 1];
    }
  }
  const double element = spec.precision() == v1::FP32 ? 4 : 2;  // the compute dtype
  const double batch = static_cast<double>(spec.micro_batch_size());
  const double accumulation = static_cast<double>(spec.accumulation_steps());

  double gradient_slots = 0;  // None with a norm (trainer/mlp.cc).
  if (!norm && spec.precision() != v1::FP32 && accumulation > 1 &&
      accumulation * n * element <= kDeferredGradientBudgetBytes) {
    gradient_slots = accumulation * n * element;
  }
  const double in = static_cast<double>(widths.front());
  const double out = static_cast<double>(widths.back());
  const double activations =
      batch * in * element                          // the input cast to the compute dtype
      + batch * (2 * outputs + gelu_outputs) * element  // outputs, their gradients, pre-GELU
      + 2 * batch * (in + out) * 4                  // the fp32 micro-batch and its data
      + 3 * batch * norm_outputs * 4;               // norms: z, its output and gradient
  const double workspace = spec.device() == v1::CUDA
                               ? kCudaWorkspaceBytes
                               : kCpuWorkspaceBytes + 4 * largest_layer;  // GEMM scratch

  // grad_comm_dtype fp16/bf16: the compressed copy that travels (trainer/gradient_communicator.h),
  // 2 bytes per gradient on the GPU, a 4-byte float on the CPU backend.
  const bool compressed = spec.grad_comm_dtype() == v1::FP16 || spec.grad_comm_dtype() == v1::BF16;
  const double wire = compressed ? n * (spec.device() == v1::CUDA ? 2 : 4) : 0;

  RankMemoryEstimate estimate;
  estimate.parameters = Saturate(n * (4 + element));
  // + loss and correct count, + the compressed copy.
  estimate.gradients = Saturate((n + 2) * 4 + gradient_slots + wire);
  // SGD's momentum buffer, or Adam's two moments.
  const v1::OptimizerKind kind = spec.optimizer().kind();
  const double state_buffers = kind == v1::ADAM || kind == v1::ADAMW ? 2 : 1;
  estimate.optimizer = Saturate(n * 4 * state_buffers);
  estimate.activations = Saturate(activations);
  estimate.workspace = Saturate(workspace);
  estimate.total = Saturate(n * (4 + element) + (n + 2) * 4 + gradient_slots + wire +
                            n * 4 * state_buffers + activations + workspace);
  return estimate;
}

}  // namespace mptrain
