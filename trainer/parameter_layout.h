#pragma once

// Where each Linear layer's weight [out, in] and bias [out] sit in the flat fp32 parameter
// buffer (weights and biases in layer order), plus initialisation and checkpoint conversion.
// With a normalization (ModelConfig::norm), each hidden layer's norm weight [out] and bias [out]
// follow its Linear's bias: the flat order is layers.0.weight, layers.0.bias, norms.0.weight,
// norms.0.bias, layers.1.weight, ... (every tensor of layer i before layer i + 1's, so that
// one layer's gradients are one span). Batch norms' running statistics are buffers, not
// parameters: a second flat f32 array, per hidden layer running_mean [out] then
// running_var [out].

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "io/safetensors.h"
#include "trainer/model/parameter_table.h"
#include "trainer/training_config.h"

namespace mptrain {

struct LayerLayout {
  int64_t in = 0;
  int64_t out = 0;
  int64_t weight_offset = 0;  // [out, in]
  int64_t bias_offset = 0;    // [out]
  // The normalization after this Linear: 0 features when it has none (the output layer, or a
  // model without norm). Its affine weight and bias [norm_features] are parameters.
  int64_t norm_features = 0;
  int64_t norm_weight_offset = 0;
  int64_t norm_bias_offset = 0;
  // Batch norms: running_mean [out] at running_offset, running_var [out] right after it, in the
  // buffer array; -1 when none.
  int64_t running_offset = -1;

  // One past this layer's last parameter: its gradients are [weight_offset, end()).
  int64_t end() const {
    return norm_features > 0 ? norm_bias_offset + norm_features : bias_offset + out;
  }
  bool has_norm() const { return norm_features > 0; }
  bool has_running_stats() const { return running_offset >= 0; }
};

struct ParameterLayout {
  std::vector<LayerLayout> layers;
  int64_t total = 0;
  NormKind norm = NormKind::kNone;
  int64_t buffers_total = 0;  // Running statistics (batch norms): 2 · Σ hidden widths.
};

// Linear(widths[i], widths[i + 1]) for each i: [input_dim, hidden..., output_dim], with `norm`
// after each hidden Linear.
ParameterLayout MakeParameterLayout(const std::vector<int64_t>& widths,
                                    NormKind norm = NormKind::kNone);

// torch.nn.Linear's distribution (weight and bias uniform in ±1/sqrt(in)), drawn from `seed`
// with a fixed generator, so every rank computes the same values; norm weights 1, biases 0
// (drawing nothing: the Linear layers get the same values with or without norms).
std::vector<float> InitialLayoutParameters(const ParameterLayout& layout, uint64_t seed);
// The running statistics' initial values: running_mean 0, running_var 1 (as torch).
std::vector<float> InitializeBuffers(const ParameterLayout& layout);

// The MLP's parameter table: per layer i, layers.{i}.weight [out, in], layers.{i}.bias [out]
// and, with a norm, norms.{i}.weight (default 1) and norms.{i}.bias (default 0), one gradient
// group per layer; batch norms' buffers norms.{i}.running_mean, .running_var and the counter
// .num_batches_tracked. Every parameter is weight-decayed (torch.optim over
// model.parameters()). The functions below are this table's conversions.
ParameterTable MlpParameterTable(const ParameterLayout& layout);

// Tensors named layers.{i}.weight and layers.{i}.bias, and norms.{i}.weight and norms.{i}.bias
// for the norm after Linear i.
TensorMap ParametersToTensors(const ParameterLayout& layout, const std::vector<float>& flat);
// INVALID_ARGUMENT naming the tensor when one is missing or has the wrong shape. With
// `norm_defaults`, a missing norms.{i}.weight / .bias takes its initial value (1 / 0) instead:
// an init_checkpoint may hold the Linear layers only.
absl::StatusOr<std::vector<float>> TensorsToParameters(const ParameterLayout& layout,
                                                       const TensorMap& tensors,
                                                       const std::string& source,
                                                       bool norm_defaults = false);

// norms.{i}.running_mean, norms.{i}.running_var [out] and norms.{i}.num_batches_tracked (a
// 0-d F32 tensor; torch's is int64, and load_state_dict converts) for each batch norm.
TensorMap BuffersToTensors(const ParameterLayout& layout, const std::vector<float>& buffers,
                           int64_t num_batches_tracked);
// The running statistics of `tensors` (num_batches_tracked is not read: it follows from the
// step). INVALID_ARGUMENT naming the tensor when one is missing or has the wrong shape.
absl::StatusOr<std::vector<float>> TensorsToBuffers(const ParameterLayout& layout,
                                                    const TensorMap& tensors,
                                                    const std::string& source);

// Every tensor name the two functions above give for `layout` (without copying a value: a
// model may be gigabytes), each also with each of `prefixes` + "." before it (optimizer state:
// "momentum.layers.0.weight").
std::set<std::string> TensorNames(const ParameterLayout& layout,
                                  const std::vector<std::string>& prefixes = {});

// A hex checksum of the parameters' bytes (XXH3-64): equal on every rank iff bit-identical.
std::string ParameterChecksum(const std::vector<float>& flat);

}  // namespace mptrain
