#pragma once

// The activations a GPT rank allocates, tensor by tensor, in one place: GptModel::Create
// allocates exactly these entries (and fails if one is left unbound), and the coordinator's
// admission estimate (common/resource_estimate.cc) adds up the same entries. What depends on
// the backend (the bytes of a low-precision element, what attention keeps for its backward,
// whether the loss is fused in place over the logits) comes in as GptBackendTraits: from the
// Backend itself in the rank, from the job's device in the coordinator (TraitsForDevice);
// the backends' tests check that the two agree.

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/backend_types.h"
#include "trainer/planned_tensor.h"
#include "trainer/training_config.h"

namespace mptrain {

struct GptBackendTraits {
  int64_t low_element_bytes = 4;  // 2 on CUDA; the CPU keeps f16/bf16 values in floats
  // Backend::AttentionSavedShape for one micro-batch: [rows, cols] f32.
  int64_t attention_saved_rows = 0;
  int64_t attention_saved_cols = 0;
  // Backend::HasFusedSoftmaxCrossEntropy. The fused loss also reads the logits as a strided
  // view, so with it the LM head forms the logits of all Vp padded vocabulary rows (GEMM
  // dimensions that are multiples of 64, as llm.c pads them for) and the loss sees the first V
  // columns of each row: LogitsColumns.
  bool fused_loss = false;
};

// The columns of the logits buffer: padded_vocab_size where the loss is fused (above), else
// vocab_size.
int64_t LogitsColumns(const GptConfig& config, const GptBackendTraits& traits);

// What the CPU (cuda = false) or CUDA backend reports, without one.
GptBackendTraits TraitsForDevice(bool cuda, DType compute_dtype, int64_t micro_batch_size,
                                 const GptConfig& config);

struct GptActivationPlan {
  std::vector<PlannedTensor> per_block;  // allocated once per layer
  std::vector<PlannedTensor> shared;     // allocated once
  int64_t layers = 0;
  // Device bytes of every tensor of the plan (low-precision elements at the traits' size).
  double Bytes(const GptBackendTraits& traits) const;
};

// The plan of a GPT with micro-batches of `micro_batch_size` sequences (config's padded
// vocabulary filled in) in `compute_dtype` on a backend with `traits`.
GptActivationPlan PlanGptActivations(const GptConfig& config, DType compute_dtype,
                                     int64_t micro_batch_size, const GptBackendTraits& traits);

}  // namespace mptrain
