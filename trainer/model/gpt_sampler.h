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

// A sample as the job's events show it, in at most max_bytes (>= 16): a byte-level sample's
// bytes (outside printable ASCII as '?': a note is UTF-8), else the ids separated by spaces.
// `tokens` is the prompt (its first prompt_length) and its continuation. When both do not fit,
// the prompt's start gives way ("…" and the prompt's last part, at least a quarter of
// max_bytes where the prompt has that much, then the continuation, cut at its end where it is
// longer than the rest): a long prompt never hides what the model generated.
std::string DescribeSample(const std::vector<int64_t>& tokens, size_t prompt_length,
                           bool byte_level, size_t max_bytes);

class GptSampler {
 public:
  static absl::StatusOr<GptSampler> Create(Backend* backend, const GptConfig& gpt,
                                           const SampleConfig& sample);
  // The prompt and its continuation as token ids. ABORTED as soon as `stop` (when given, asked
  // before each token) says so: a cancelled job does not wait for thousands of tokens.
  absl::StatusOr<std::vector<int64_t>> Generate(Model* model, int64_t step,
                                                const std::function<bool()>& stop = nullptr);
  // DescribeSample of Generate's tokens, for a note of at most max_bytes.
  std::string Describe(const std::vector<int64_t>& tokens, size_t max_bytes) const;

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
