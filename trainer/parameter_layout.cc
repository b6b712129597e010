#include "trainer/parameter_layout.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "xxhash.h"

namespace mptrain {

ParameterLayout MakeParameterLayout(const std::vector<int64_t>& widths) {
  ParameterLayout layout;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    LayerLayout layer;
    layer.in = widths[i];
    layer.out = widths[i + 1];
    layer.weight_offset = layout.total;
    layer.bias_offset = layout.total + layer.in * layer.out;
    layout.total = layer.bias_offset + layer.out;
    layout.layers.push_back(layer);
  }
  return layout;
}

std::vector<float> InitializeParameters(const ParameterLayout& layout, uint64_t seed) {
  std::vector<float> flat(layout.total);
  std::mt19937_64 generator(seed);
  // Uniform in [-bound, bound) from 53 random bits: the same on every platform, unlike
  // std::uniform_real_distribution.
  auto uniform = [&](double bound) {
    double unit = static_cast<double>(generator() >> 11) * 0x1.0p-53;
    return static_cast<float>((2.0 * unit - 1.0) * bound);
  };
  for (const LayerLayout& layer : layout.layers) {
    double bound = 1.0 / std::sqrt(static_cast<double>(layer.in));
    for (int64_t i = 0; i < layer.in * layer.out; ++i) flat[layer.weight_offset + i] = uniform(bound);
    for (int64_t i = 0; i < layer.out; ++i) flat[layer.bias_offset + i] = uniform(bound);
  }
  return flat;
}

TensorMap ParametersToTensors(const ParameterLayout& layout, const std::vector<float>& flat) {
  TensorMap tensors;
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const LayerLayout& layer = layout.layers[i];
    NamedTensor weight;
    weight.shape = {layer.out, layer.in};
    weight.values.assign(flat.begin() + layer.weight_offset,
                         flat.begin() + layer.weight_offset + layer.in * layer.out);
    NamedTensor bias;
    bias.shape = {layer.out};
    bias.values.assign(flat.begin() + layer.bias_offset,
                       flat.begin() + layer.bias_offset + layer.out);
    tensors[absl::StrCat("layers.", i, ".weight")] = std::move(weight);
    tensors[absl::StrCat("layers.", i, ".bias")] = std::move(bias);
  }
  return tensors;
}

absl::StatusOr<std::vector<float>> TensorsToParameters(const ParameterLayout& layout,
                                                       const TensorMap& tensors,
                                                       const std::string& source) {
  std::vector<float> flat(layout.total);
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const LayerLayout& layer = layout.layers[i];
    struct Expected {
      std::string name;
      std::vector<int64_t> shape;
      int64_t offset;
    };
    for (const Expected& expected :
         {Expected{absl::StrCat("layers.", i, ".weight"), {layer.out, layer.in},
                   layer.weight_offset},
          Expected{absl::StrCat("layers.", i, ".bias"), {layer.out}, layer.bias_offset}}) {
      auto it = tensors.find(expected.name);
      if (it == tensors.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": tensor ", expected.name, " is missing"));
      }
      if (it->second.shape != expected.shape) {
        std::string got, want;
        for (int64_t d : it->second.shape) absl::StrAppend(&got, got.empty() ? "" : ", ", d);
        for (int64_t d : expected.shape) absl::StrAppend(&want, want.empty() ? "" : ", ", d);
        return absl::InvalidArgumentError(absl::StrCat(source, ": tensor ", expected.name,
                                                       " has shape [", got, "], the model needs [",
                                                       want, "]"));
      }
      std::copy(it->second.values.begin(), it->second.values.end(),
                flat.begin() + expected.offset);
    }
  }
  return flat;
}

std::string ParameterChecksum(const std::vector<float>& flat) {
  return absl::StrFormat("%016x", XXH3_64bits(flat.data(), flat.size() * sizeof(float)));
}

}  // namespace mptrain
