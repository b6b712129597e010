#include "trainer/model/gpt_memory_plan.h"

#include <algorithm>

namespace mptrain {

GptBackendTraits TraitsForDevice(bool cuda, DType compute_dtype, int64_t micro_batch_size,
                                 const GptConfig& config) {
  GptBackendTraits traits;
  const bool low = compute_dtype != DType::kF32;
  traits.low_element_bytes = cuda && low ? 2 : 4;
  traits.attention_saved_rows = micro_batch_size * config.heads * config.context_length;
  // cuDNN's fused attention keeps each row's log-sum-exp; our fp32 kernels and the CPU keep
  // the probabilities (backends/cuda/cuda_language_model_ops.cc, backends/cpu).
  traits.attention_saved_cols = cuda && low ? 1 : config.context_length;
  traits.fused_loss = cuda;
  return traits;
}

int64_t LogitsColumns(const GptConfig& config, const GptBackendTraits& traits) {
  return traits.fused_loss ? std::max(config.padded_vocab_size, config.vocab_size)
                           : config.vocab_size;
}

double GptActivationPlan::Bytes(const GptBackendTraits& traits) const {
  return static_cast<double>(layers) * PlannedBytes(per_block, traits.low_element_bytes) +
         PlannedBytes(shared, traits.low_element_bytes);
}

GptActivationPlan PlanGptActivations(const GptConfig& config, DType compute_dtype,
                                     int64_t micro_batch_size, const GptBackendTraits& traits) {
  const int64_t N = micro_batch_size * config.context_length, C = config.width;
  const int64_t V = LogitsColumns(config, traits);
  const DType f32 = DType::kF32, low = compute_dtype;
  GptActivationPlan plan;
  plan.layers = config.layers;
  plan.per_block = {
      {"ln1_stats", f32, N, 2},
      {"ln1", low, N, C},
      {"qkv", low, N, 3 * C},
      {"attention", f32, traits.attention_saved_rows, traits.attention_saved_cols},
      {"att", low, N, C},
      {"mid", f32, N, C},
      {"ln2_stats", f32, N, 2},
      {"ln2", low, N, C},
      {"fc_pre", low, N, 4 * C},
      // GELU(fc_pre), kept for mlp.c_proj's weight gradient as PyTorch's autograd keeps it
      // (recomputing it cost a pass per block: 3 ms of a GPT-2 124M step on an H100).
      {"fc_gelu", low, N, 4 * C},
      {"out", f32, N, C},
  };
  plan.shared = {
      {"encoded", f32, N, C},
      {"lnf_stats", f32, N, 2},
      {"lnf", low, N, C},
      {"logits", low, N, V},
  };
  // The logits' gradient is written over the logits where the loss is fused in place.
  if (!traits.fused_loss) plan.shared.push_back({"d_logits", low, N, V});
  // d_fc_pre also serves as GELU's output gradient where the backward is composed
  // (elementwise, in place).
  const std::vector<PlannedTensor> scratch = {
      {"branch_out", low, N, C}, {"d_resid", f32, N, C}, {"d_branch", low, N, C},
      {"d_ln_low", low, N, C},   {"d_ln_in", f32, N, C}, {"d_att", low, N, C},
      {"d_qkv", low, N, 3 * C},  {"d_fc_pre", low, N, 4 * C},
  };
  plan.shared.insert(plan.shared.end(), scratch.begin(), scratch.end());
  return plan;
}

}  // namespace mptrain
