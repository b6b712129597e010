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
    if (layer.has_norm()) {
      for (const auto& [suffix, offset] : {std::pair<const char*, int64_t>{"weight",
                                                                          layer.norm_weight_offset},
                                           {"bias", layer.norm_bias_offset}}) {
        NamedTensor tensor;
        tensor.shape = {layer.norm_features};
        tensor.values.assign(flat.begin() + offset, flat.begin() + offset + layer.norm_features);
        tensors[absl::StrCat("norms.", i, ".", suffix)] = std::move(tensor);
      }
    }
  }
  return tensors;
}

TensorMap BuffersToTensors(const ParameterLayout& layout, const std::vector<float>& buffers,
                           int64_t num_batches_tracked) {
  TensorMap tensors;
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const LayerLayout& layer = layout.layers[i];
    if (!layer.has_running_stats()) continue;
    for (const auto& [suffix, offset] :
         {std::pair<const char*, int64_t>{"running_mean", layer.running_offset},
          {"running_var", layer.running_offset + layer.out}}) {
      NamedTensor tensor;
      tensor.shape = {layer.out};
      tensor.values.assign(buffers.begin() + offset, buffers.begin() + offset + layer.out);
      tensors[absl::StrCat("norms.", i, ".", suffix)] = std::move(tensor);
    }
    NamedTensor count;  // 0-d, as torch's
    count.values = {static_cast<float>(num_batches_tracked)};
    tensors[absl::StrCat("norms.", i, ".num_batches_tracked")] = std::move(count);
  }
  return tensors;
}

std::set<std::string> TensorNames(const ParameterLayout& layout,
                                  const std::vector<std::string>& prefixes) {
  std::set<std::string> names;
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const LayerLayout& layer = layout.layers[i];
    names.insert(absl::StrCat("layers.", i, ".weight"));
    names.insert(absl::StrCat("layers.", i, ".bias"));
    if (layer.has_norm()) {
      names.insert(absl::StrCat("norms.", i, ".weight"));
      names.insert(absl::StrCat("norms.", i, ".bias"));
    }
    if (layer.has_running_stats()) {
      for (const char* suffix : {"running_mean", "running_var", "num_batches_tracked"}) {
        names.insert(absl::StrCat("norms.", i, ".", suffix));
      }
    }
  }
  std::set<std::string> prefixed = names;
  for (const std::string& prefix : prefixes) {
    for (const std::string& name : names) prefixed.insert(absl::StrCat(prefix, ".", name));
  }
  return prefixed;
}

namespace {

struct Expected {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset;
  bool optional = false;  // Missing: left as it is.
};

absl::Status CopyExpected(const std::vector<Expected>& expected_tensors, const TensorMap& tensors,
                          const std::string& source, std::vector<float>* flat) {
  for (const Expected& expected : expected_tensors) {
    auto it = tensors.find(expected.name);
    if (it == tensors.end()) {
      if (expected.optional) continue;
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor ", expected.name, " is missing"));
    }
    if (it->second.shape != expected.shape) {
      // The model's shape only: the file's is its content (the file may be anyone's).
      std::string want;
      for (int64_t d : expected.shape) absl::StrAppend(&want, want.empty() ? "" : ", ", d);
      return absl::InvalidArgumentError(absl::StrCat(source, ": tensor ", expected.name,
                                                     " does not have the model's shape [", want,
                                                     "]"));
    }
    std::copy(it->second.values.begin(), it->second.values.end(),
              flat->begin() + expected.offset);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<float>> TensorsToParameters(const ParameterLayout& layout,
                                                       const TensorMap& tensors,
                                                       const std::string& source,
                                                       bool norm_defaults) {
  // The initial values (norm weights 1, biases 0) stand where an optional tensor is missing.
  std::vector<float> flat(layout.total, 0.0f);
  for (const LayerLayout& layer : layout.layers) {
    std::fill_n(flat.begin() + layer.norm_weight_offset, layer.norm_features, 1.0f);
  }
  std::vector<Expected> expected;
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const LayerLayout& layer = layout.layers[i];
    expected.push_back({absl::StrCat("layers.", i, ".weight"), {layer.out, layer.in},
                        layer.weight_offset});
    expected.push_back({absl::StrCat("layers.", i, ".bias"), {layer.out}, layer.bias_offset});
    if (layer.has_norm()) {
      expected.push_back({absl::StrCat("norms.", i, ".weight"), {layer.norm_features},
                          layer.norm_weight_offset, norm_defaults});
      expected.push_back({absl::StrCat("norms.", i, ".bias"), {layer.norm_features},
                          layer.norm_bias_offset, norm_defaults});
    }
  }
  RETURN_IF_ERROR(CopyExpected(expected, tensors, source, &flat));
  return flat;
}

absl::StatusOr<std::vector<float>> TensorsToBuffers(const ParameterLayout& layout,
                                                    const TensorMap& tensors,
                                                    const std::string& source) {
  std::vector<float> buffers(layout.buffers_total);
  std::vector<Expected> expected;
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const LayerLayout& layer = layout.layers[i];
    if (!layer.has_running_stats()) continue;
    expected.push_back({absl::StrCat("norms.", i, ".running_mean"), {layer.out},
                        layer.running_offset});
    expected.push_back({absl::StrCat("norms.", i, ".running_var"), {layer.out},
                        layer.running_offset + layer.out});
  }
  RETURN_IF_ERROR(CopyExpected(expected, tensors, source, &buffers));
  // (The reader refused non-finite values.) Evaluation normalises by sqrt(running_var + eps):
  // a value at or below -eps is refused. (Tiny negatives, as torch's SyncBatchNorm can leave
  // for a constant feature, are harmless and kept.)
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const LayerLayout& layer = layout.layers[i];
    if (!layer.has_running_stats()) continue;
    const auto first = buffers.begin() + layer.running_offset + layer.out;
    if (std::any_of(first, first + layer.out,
                    [](float v) { return !(v + kNormEps > 0); })) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tensor norms.", i, ".running_var has a value at or below -eps (-1e-05): ",
          "evaluation would take the square root of a non-positive number"));
    }
  }
  return buffers;
}

std::string ParameterChecksum(const std::vector<float>& flat) {
  return absl::StrFormat("%016x", XXH3_64bits(flat.data(), flat.size() * sizeof(float)));
}

}  // namespace mptrain
