#pragma once

// Text generation from a GPT (SampleConfig): the prompt continued one token at a time, each
// from the logits at the last position of a forward over the last context_length tokens
// (shorter contexts are padded with id 0 after their end: the attention is causal, so the
// padding changes no logit at or before the last real position). top_k 1: greedy (the first
// maximal logit). Otherwise: logits / temperature in double, the top_k largest kept (ties to
// the lower id; 0 keeps all), softmax, and a draw u = (SplitMix64(seed + step).Next() >> 11)
// · 2^-53 against the cumulative probabilities in id order. Evaluation mode: nothing is
// updated, and the caller's next training forward recomputes every activation.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/model/model.h"
#include "trainer/training_config.h"

namespace mptrain {

class GptSampler {
 public:
  static absl::StatusOr<GptSampler> Create(Backend* backend, const GptConfig& gpt,
                                           const SampleConfig& sample);
  // The prompt and its continuation as token ids. ABORTED as soon as `stop` (when given, asked
  // before each token) says so: a cancelled job does not wait for thousands of tokens.
  absl::StatusOr<std::vector<int64_t>> Generate(Model* model, int64_t step,
                                                const std::function<bool()>& stop = nullptr);
  // As the job's events show it: a byte-level prompt's bytes (outside printable ASCII as '?':
  // a note is UTF-8), else the ids separated by spaces.
  std::string Describe(const std::vector<int64_t>& tokens) const;

 private:
  GptSampler(Backend* backend, GptConfig gpt, SampleConfig sample)
      : backend_(backend), gpt_(std::move(gpt)), sample_(std::move(sample)) {}

  Backend* backend_;
  GptConfig gpt_;
  SampleConfig sample_;
  Tensor ids_;  // [T, 1] f32
  std::vector<float> host_ids_;
  std::vector<float> logits_;  // [V]: the last real position's
};

}  // namespace mptrain
