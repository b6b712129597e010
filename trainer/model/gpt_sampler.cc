#include "trainer/model/gpt_sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "trainer/data/token_shards.h"

namespace mptrain {

absl::StatusOr<GptSampler> GptSampler::Create(Backend* backend, const GptConfig& gpt,
                                              const SampleConfig& sample) {
  if (sample.prompt.empty() || sample.max_new_tokens < 1 || !(sample.temperature > 0)) {
    return absl::InvalidArgumentError("sample: needs a prompt, max_new_tokens and temperature");
  }
  for (int64_t id : sample.prompt) {
    if (id < 0 || id >= gpt.vocab_size) {
      return absl::InvalidArgumentError("sample: a prompt token is outside the vocabulary");
    }
  }
  GptSampler sampler(backend, gpt, sample);
  ASSIGN_OR_RETURN(sampler.ids_, backend->Allocate(DType::kF32, gpt.context_length, 1));
  sampler.host_ids_.resize(gpt.context_length);
  sampler.logits_.resize(gpt.vocab_size);
  return sampler;
}

absl::StatusOr<std::vector<int64_t>> GptSampler::Generate(Model* model, int64_t step,
                                                          const std::function<bool()>& stop) {
  const int64_t T = gpt_.context_length, V = gpt_.vocab_size;
  std::vector<int64_t> tokens = sample_.prompt;
  SplitMix64 random(sample_.seed + static_cast<uint64_t>(step));
  std::vector<double> weights(V);
  std::vector<int64_t> order(V);
  for (int64_t i = 0; i < sample_.max_new_tokens; ++i) {
    if (stop && stop()) {
      return absl::AbortedError(absl::StrCat("stopped while sampling after step ", step, " (",
                                             i, " of ", sample_.max_new_tokens, " tokens)"));
    }
    const int64_t length = std::min<int64_t>(T, static_cast<int64_t>(tokens.size()));
    std::fill(host_ids_.begin(), host_ids_.end(), 0.0f);
    for (int64_t t = 0; t < length; ++t) {
      host_ids_[t] = static_cast<float>(tokens[tokens.size() - length + t]);
    }
    RETURN_IF_ERROR(backend_->Upload(host_ids_.data(), ids_));
    RETURN_IF_ERROR(model->Forward(ids_, /*x_unchanged=*/false, /*training=*/false));
    // Only the last real position's logits leave the device.
    RETURN_IF_ERROR(backend_->Download(model->output().RowSlice(length - 1, 1), logits_.data()));
    const float* row = logits_.data();
    int64_t next = 0;
    if (sample_.top_k == 1) {
      next = std::max_element(row, row + V) - row;  // The first maximum.
    } else {
      std::iota(order.begin(), order.end(), 0);
      const int64_t keep = sample_.top_k > 0 ? std::min(sample_.top_k, V) : V;
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return row[a] > row[b]; });
      const double top = row[order[0]] / sample_.temperature;
      std::fill(weights.begin(), weights.end(), 0.0);
      double sum = 0;
      for (int64_t k = 0; k < keep; ++k) {
        const double w = std::exp(row[order[k]] / sample_.temperature - top);
        weights[order[k]] = w;
        sum += w;
      }
      const double u = static_cast<double>(random.Next() >> 11) * 0x1.0p-53 * sum;
      double cumulative = 0;
      next = order[0];
      for (int64_t id = 0; id < V; ++id) {
        if (weights[id] == 0) continue;
        cumulative += weights[id];
        next = id;
        if (u < cumulative) break;
      }
    }
    tokens.push_back(next);
  }
  return tokens;
}

namespace {

// tokens[begin, end) as text: bytes, or ids each preceded by a space but the sample's first.
std::string TokensText(const std::vector<int64_t>& tokens, size_t begin, size_t end,
                       bool byte_level) {
  std::string text;
  for (size_t i = begin; i < end; ++i) {
    const int64_t id = tokens[i];
    if (byte_level) {
      const bool printable = (id >= 0x20 && id < 0x7f) || id == '\n';
      text.push_back(printable ? static_cast<char>(id) : '?');
    } else {
      absl::StrAppend(&text, i == 0 ? "" : " ", id);
    }
  }
  return text;
}

}  // namespace

std::string DescribeSample(const std::vector<int64_t>& tokens, size_t prompt_length,
                           bool byte_level, size_t max_bytes) {
  prompt_length = std::min(prompt_length, tokens.size());
  std::string prompt = TokensText(tokens, 0, prompt_length, byte_level);
  const std::string continuation = TokensText(tokens, prompt_length, tokens.size(), byte_level);
  if (prompt.size() + continuation.size() <= max_bytes) return prompt + continuation;
  static constexpr char kElided[] = "\u2026";  // "…", 3 bytes of UTF-8.
  const size_t elided_bytes = sizeof(kElided) - 1;
  const size_t prompt_budget =
      std::max(max_bytes / 4, max_bytes - std::min(max_bytes, continuation.size()));
  if (prompt.size() > prompt_budget) {
    size_t start = prompt.size() - (prompt_budget - elided_bytes);
    // Ids: from the first whole id on (the one cut is dropped with the separator before it).
    if (!byte_level) start = std::min(prompt.find(' ', start), prompt.size());
    prompt = absl::StrCat(kElided, prompt.substr(start));
  }
  std::string text = prompt + continuation;
  text.resize(std::min(text.size(), max_bytes));  // Only ASCII after the marker: no split char.
  return text;
}

std::string GptSampler::Describe(const std::vector<int64_t>& tokens, size_t max_bytes) const {
  return DescribeSample(tokens, sample_.prompt.size(), sample_.byte_level, max_bytes);
}

}  // namespace mptrain
