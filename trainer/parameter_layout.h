#pragma once

// Where each Linear layer's weight [out, in] and bias [out] sit in the flat fp32 parameter
// buffer (weights and biases in layer order), plus initialisation and checkpoint conversion.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "io/safetensors.h"

namespace mptrain {

struct LayerLayout {
  int64_t in = 0;
  int64_t out = 0;
  int64_t weight_offset = 0;  // [out, in]
  int64_t bias_offset = 0;    // [out]
};

struct ParameterLayout {
  std::vector<LayerLayout> layers;
  int64_t total = 0;
};

// Linear(widths[i], widths[i + 1]) for each i: [input_dim, hidden..., output_dim].
ParameterLayout MakeParameterLayout(const std::vector<int64_t>& widths);

// torch.nn.Linear's distribution (weight and bias uniform in ±1/sqrt(in)), drawn from `seed`
// with a fixed generator, so every rank computes the same values.
std::vector<float> InitializeParameters(const ParameterLayout& layout, uint64_t seed);

// Tensors named layers.{i}.weight and layers.{i}.bias.
TensorMap ParametersToTensors(const ParameterLayout& layout, const std::vector<float>& flat);
// INVALID_ARGUMENT naming the tensor when one is missing or has the wrong shape.
absl::StatusOr<std::vector<float>> TensorsToParameters(const ParameterLayout& layout,
                                                       const TensorMap& tensors,
                                                       const std::string& source);

// A hex checksum of the parameters' bytes (XXH3-64): equal on every rank iff bit-identical.
std::string ParameterChecksum(const std::vector<float>& flat);

}  // namespace mptrain
