#include "trainer/parameter_layout.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "trainer/norm_math.h"
#include "xxhash.h"

namespace mptrain {

ParameterLayout MakeParameterLayout(const std::vector<int64_t>& widths, NormKind norm) {
  ParameterLayout layout;
  layout.norm = norm;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    LayerLayout layer;
    layer.in = widths[i];
    layer.out = widths[i + 1];
    layer.weight_offset = layout.total;
    layer.bias_offset = layout.total + layer.in * layer.out;
    const bool hidden = i + 2 < widths.size();
    if (hidden && norm != NormKind::kNone) {
      layer.norm_features = layer.out;
      layer.norm_weight_offset = layer.bias_offset + layer.out;
      layer.norm_bias_offset = layer.norm_weight_offset + layer.out;
      if (IsBatchNorm(norm)) {
        layer.running_offset = layout.buffers_total;
        layout.buffers_total += 2 * layer.out;
      }
    }
    layout.total = layer.end();
    layout.layers.push_back(layer);
  }
  return layout;
}

std::vector<float> InitialLayoutParameters(const ParameterLayout& layout, uint64_t seed) {
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
    for (int64_t i = 0; i < layer.norm_features; ++i) {
      flat[layer.norm_weight_offset + i] = 1.0f;
      flat[layer.norm_bias_offset + i] = 0.0f;
    }
  }
  return flat;
}

std::vector<float> InitializeBuffers(const ParameterLayout& layout) {
  std::vector<float> buffers(layout.buffers_total, 0.0f);
  for (const LayerLayout& layer : layout.layers) {
    if (!layer.has_running_stats()) continue;
    for (int64_t i = 0; i < layer.out; ++i) buffers[layer.running_offset + layer.out + i] = 1.0f;
  }
  return buffers;
}

ParameterTable MlpParameterTable(const ParameterLayout& layout) {
  ParameterTable table;
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const LayerLayout& layer = layout.layers[i];
    table.Add(absl::StrCat("layers.", i, ".weight"), {layer.out, layer.in});
    table.Add(absl::StrCat("layers.", i, ".bias"), {layer.out});
    if (layer.has_norm()) {
      table.Add(absl::StrCat("norms.", i, ".weight"), {layer.norm_features}, true, 1.0f);
      table.Add(absl::StrCat("norms.", i, ".bias"), {layer.norm_features}, true, 0.0f);
    }
    table.EndGroup();  // One layer's gradients: one span, finished together.
    if (layer.has_running_stats()) {
      table.AddBuffer(absl::StrCat("norms.", i, ".running_mean"), {layer.out});
      table.AddBuffer(absl::StrCat("norms.", i, ".running_var"), {layer.out}, /*variance=*/true);
      table.AddCounter(absl::StrCat("norms.", i, ".num_batches_tracked"));
    }
  }
  return table;
}

TensorMap ParametersToTensors(const ParameterLayout& layout, const std::vector<float>& flat) {
  return MlpParameterTable(layout).ToTensors(flat);
}

TensorMap BuffersToTensors(const ParameterLayout& layout, const std::vector<float>& buffers,
                           int64_t num_batches_tracked) {
  return MlpParameterTable(layout).BuffersToTensors(buffers, num_batches_tracked);
}

std::set<std::string> TensorNames(const ParameterLayout& layout,
                                  const std::vector<std::string>& prefixes) {
  return MlpParameterTable(layout).Names(prefixes);
}

absl::StatusOr<std::vector<float>> TensorsToParameters(const ParameterLayout& layout,
                                                       const TensorMap& tensors,
                                                       const std::string& source,
                                                       bool norm_defaults) {
  return MlpParameterTable(layout).FromTensors(tensors, source, norm_defaults);
}

absl::StatusOr<std::vector<float>> TensorsToBuffers(const ParameterLayout& layout,
                                                    const TensorMap& tensors,
                                                    const std::string& source) {
  return MlpParameterTable(layout).BuffersFromTensors(tensors, source);
}

std::string ParameterChecksum(const std::vector<float>& flat) {
  return absl::StrFormat("%016x", XXH3_64bits(flat.data(), flat.size() * sizeof(float)));
}

}  // namespace mptrain
