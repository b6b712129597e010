#include "trainer/model/parameter_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/norm_math.h"

namespace mptrain {
namespace {

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

std::string DescribeShape(const std::vector<int64_t>& shape) {
  std::string out;
  for (int64_t d : shape) absl::StrAppend(&out, out.empty() ? "" : ", ", d);
  return absl::StrCat("[", out, "]");
}

// Copies a tensor the table expects into `flat` at `offset`. `missing_ok`: absent is fine.
absl::Status CopyExpected(const std::string& name, const std::vector<int64_t>& shape,
                          int64_t offset, bool missing_ok, const TensorMap& tensors,
                          const std::string& source, std::vector<float>* flat) {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    if (missing_ok) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(source, ": tensor ", name, " is missing"));
  }
  if (it->second.shape != shape) {
    // The model's shape only: the file's is its content (the file may be anyone's).
    return absl::InvalidArgumentError(absl::StrCat(source, ": tensor ", name,
                                                   " does not have the model's shape ",
                                                   DescribeShape(shape)));
  }
  std::copy(it->second.values.begin(), it->second.values.end(), flat->begin() + offset);
  return absl::OkStatus();
}

// A parameter from its checkpoint tensor: transposed back, or its leading rows with the rest
// 0, as its spec says.
absl::Status CopyParameter(const ParameterSpec& spec, bool missing_ok, const TensorMap& tensors,
                           const std::string& source, std::vector<float>* flat) {
  if (spec.checkpoint_rows > 0) {
    auto it = tensors.find(spec.name);
    if (it != tensors.end() && it->second.shape == spec.shape) {  // Every row: as it is.
      return CopyExpected(spec.name, spec.shape, spec.offset, false, tensors, source, flat);
    }
    if (it != tensors.end() && it->second.shape != spec.checkpoint_shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tensor ", spec.name, " has neither the model's shape ",
          DescribeShape(spec.checkpoint_shape()), " nor its padded shape ",
          DescribeShape(spec.shape)));
    }
    std::fill_n(flat->begin() + spec.offset, spec.numel, 0.0f);
    return CopyExpected(spec.name, spec.checkpoint_shape(), spec.offset, missing_ok, tensors,
                        source, flat);
  }
  if (!spec.transposed_in_checkpoint) {
    return CopyExpected(spec.name, spec.shape, spec.offset, missing_ok, tensors, source, flat);
  }
  std::vector<float> stored(spec.numel);
  const std::vector<int64_t> shape = spec.checkpoint_shape();
  auto it = tensors.find(spec.name);
  if (it == tensors.end() && missing_ok) return absl::OkStatus();
  if (absl::Status copied = CopyExpected(spec.name, shape, 0, false, tensors, source, &stored);
      !copied.ok()) {
    return copied;
  }
  // stored [in, out] -> buffer [out, in].
  for (int64_t i = 0; i < shape[0]; ++i) {
    for (int64_t o = 0; o < shape[1]; ++o) {
      (*flat)[spec.offset + o * shape[0] + i] = stored[i * shape[1] + o];
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> ParameterSpec::checkpoint_shape() const {
  std::vector<int64_t> stored = shape;
  if (transposed_in_checkpoint && stored.size() == 2) std::swap(stored[0], stored[1]);
  if (checkpoint_rows > 0 && !stored.empty()) stored[0] = checkpoint_rows;
  return stored;
}

const ParameterSpec& ParameterTable::Add(std::string name, std::vector<int64_t> shape,
                                         bool weight_decay, std::optional<float> default_value) {
  ParameterSpec spec;
  spec.name = std::move(name);
  spec.shape = std::move(shape);
  spec.weight_decay = weight_decay;
  spec.default_value = default_value;
  return Add(std::move(spec));
}

const ParameterSpec& ParameterTable::Add(ParameterSpec spec) {
  spec.numel = Elements(spec.shape);
  spec.offset = total_;
  // One conversion at a time (no parameter needs both); a transposed one is a matrix, and a
  // cut one keeps at most its rows.
  if (spec.transposed_in_checkpoint && (spec.shape.size() != 2 || spec.checkpoint_rows > 0)) {
    spec.transposed_in_checkpoint = false;
  }
  if (spec.shape.empty() || spec.checkpoint_rows >= spec.shape[0]) spec.checkpoint_rows = 0;
  total_ += spec.numel;
  parameters_.push_back(std::move(spec));
  return parameters_.back();
}

void ParameterTable::EndGroup() {
  if (total_ == group_begin_) return;
  groups_.push_back({group_begin_, total_});
  group_begin_ = total_;
}

const BufferSpec& ParameterTable::AddBuffer(std::string name, std::vector<int64_t> shape,
                                            bool variance) {
  BufferSpec spec;
  spec.name = std::move(name);
  spec.numel = Elements(shape);
  spec.shape = std::move(shape);
  spec.offset = buffers_total_;
  spec.variance = variance;
  buffers_total_ += spec.numel;
  buffers_.push_back(std::move(spec));
  return buffers_.back();
}

const ParameterSpec* ParameterTable::Find(const std::string& name) const {
  for (const ParameterSpec& spec : parameters_) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

TensorMap ParameterTable::ToTensors(const std::vector<float>& flat) const {
  TensorMap tensors;
  for (const ParameterSpec& spec : parameters_) {
    NamedTensor tensor;
    tensor.shape = spec.checkpoint_shape();
    const auto first = flat.begin() + spec.offset;
    if (spec.transposed_in_checkpoint) {
      // buffer [out, in] -> stored [in, out].
      const int64_t out = spec.shape[0], in = spec.shape[1];
      tensor.values.resize(spec.numel);
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) tensor.values[i * out + o] = first[o * in + i];
      }
    } else {
      int64_t count = spec.numel;
      if (spec.checkpoint_rows > 0) count = spec.numel / spec.shape[0] * spec.checkpoint_rows;
      tensor.values.assign(first, first + count);
    }
    tensors[spec.name] = std::move(tensor);
  }
  return tensors;
}

absl::StatusOr<std::vector<float>> ParameterTable::FromTensors(const TensorMap& tensors,
                                                               const std::string& source,
                                                               bool use_defaults) const {
  std::vector<float> flat(total_, 0.0f);
  for (const ParameterSpec& spec : parameters_) {
    if (spec.default_value.has_value()) {
      std::fill_n(flat.begin() + spec.offset, spec.numel, *spec.default_value);
    }
  }
  for (const ParameterSpec& spec : parameters_) {
    const bool missing_ok = use_defaults && spec.default_value.has_value();
    if (absl::Status copied = CopyParameter(spec, missing_ok, tensors, source, &flat);
        !copied.ok()) {
      return copied;
    }
  }
  return flat;
}

TensorMap ParameterTable::BuffersToTensors(const std::vector<float>& buffers,
                                           int64_t counter_value) const {
  TensorMap tensors;
  for (const BufferSpec& spec : buffers_) {
    NamedTensor tensor;
    tensor.shape = spec.shape;
    tensor.values.assign(buffers.begin() + spec.offset, buffers.begin() + spec.offset + spec.numel);
    tensors[spec.name] = std::move(tensor);
  }
  for (const std::string& name : counters_) {
    NamedTensor count;  // 0-d, as torch's
    count.values = {static_cast<float>(counter_value)};
    tensors[name] = std::move(count);
  }
  return tensors;
}

absl::StatusOr<std::vector<float>> ParameterTable::BuffersFromTensors(
    const TensorMap& tensors, const std::string& source) const {
  std::vector<float> buffers(buffers_total_);
  for (const BufferSpec& spec : buffers_) {
    if (absl::Status copied = CopyExpected(spec.name, spec.shape, spec.offset,
                                           /*missing_ok=*/false, tensors, source, &buffers);
        !copied.ok()) {
      return copied;
    }
  }
  // (The reader refused non-finite values.) Evaluation normalises by sqrt(running_var + eps):
  // a value at or below -eps is refused. (Tiny negatives, as torch's SyncBatchNorm can leave
  // for a constant feature, are harmless and kept.)
  for (const BufferSpec& spec : buffers_) {
    if (!spec.variance) continue;
    const auto first = buffers.begin() + spec.offset;
    if (std::any_of(first, first + spec.numel, [](float v) { return !(v + kNormEps > 0); })) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tensor ", spec.name, " has a value at or below -eps (-1e-05): ",
          "evaluation would take the square root of a non-positive number"));
    }
  }
  return buffers;
}

std::set<std::string> ParameterTable::Names(const std::vector<std::string>& prefixes) const {
  std::set<std::string> names;
  for (const ParameterSpec& spec : parameters_) names.insert(spec.name);
  for (const BufferSpec& spec : buffers_) names.insert(spec.name);
  for (const std::string& name : counters_) names.insert(name);
  std::set<std::string> prefixed = names;
  for (const std::string& prefix : prefixes) {
    for (const std::string& name : names) prefixed.insert(absl::StrCat(prefix, ".", name));
  }
  return prefixed;
}

}  // namespace mptrain
