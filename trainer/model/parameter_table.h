#pragma once

// A model's parameters as a table: every tensor's name (as checkpoints store it), shape, place in
// the flat fp32 buffer, weight-decay group and what it starts at, and the groups of consecutive
// parameters the backward pass finishes together (DDP's buckets are cut along them). Checkpoints,
// resume, initialisation and the gradient reducer read this table, never a model's own layout
// (issue: the loop was welded to the MLP's LayerLayout). Buffers (batch norms' running
// statistics) are a second flat fp32 array described the same way.
//
// Parameters are added in flat order: each one right after the previous, so a group is one
// contiguous span of the gradients.

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "io/safetensors.h"

namespace mptrain {

struct ParameterSpec {
  std::string name;             // "layers.0.weight", "transformer.h.3.attn.c_attn.weight", ...
  // As the flat buffer holds it (row-major); a checkpoint holds checkpoint_shape().
  std::vector<int64_t> shape;
  int64_t offset = 0;           // Of its first element in the flat buffer.
  int64_t numel = 0;
  // A 2-D parameter whose checkpoint tensor is the transpose of the buffer's matrix: the
  // buffer holds nn.Linear's [out, in] (what the GEMMs read), Hugging Face's GPT-2 files hold
  // Conv1D's [in, out].
  bool transposed_in_checkpoint = false;
  // > 0: a checkpoint holds only the first checkpoint_rows rows (the GPT's wte cut to the
  // vocabulary, its padded rows never observable); a file holding every row is taken as it is,
  // and a file holding checkpoint_rows leaves the other rows 0.
  int64_t checkpoint_rows = 0;
  std::vector<int64_t> checkpoint_shape() const;
  // AdamW's decay group: nanoGPT decays 2-D weights and embeddings, not biases or norms; the
  // MLP (torch.optim over model.parameters()) decays every parameter.
  bool weight_decay = true;
  // An init_checkpoint may leave it out; it then starts at this value (norm weights 1, biases 0).
  std::optional<float> default_value;
};

struct BufferSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t numel = 0;
  // A variance (batch norm's running_var): evaluation takes sqrt(v + eps), so a value at or
  // below -eps is refused when read.
  bool variance = false;
};

// A span of the flat gradients the backward pass finishes at once.
struct GradientGroup {
  int64_t begin = 0;
  int64_t end = 0;
};

class ParameterTable {
 public:
  // Appends a parameter after the last one; returns its spec (offset filled in).
  const ParameterSpec& Add(std::string name, std::vector<int64_t> shape, bool weight_decay = true,
                           std::optional<float> default_value = std::nullopt);
  // The same, for a spec whose checkpoint form differs (transposed_in_checkpoint,
  // checkpoint_rows); offset and numel are filled in.
  const ParameterSpec& Add(ParameterSpec spec);
  // Closes the group of the parameters added since the last call (or the start).
  void EndGroup();
  const BufferSpec& AddBuffer(std::string name, std::vector<int64_t> shape, bool variance = false);
  // A 0-d counter written with the buffers (batch norms' num_batches_tracked: the value comes
  // from the step, so it is written, never read back).
  void AddCounter(std::string name) { counters_.push_back(std::move(name)); }

  const std::vector<ParameterSpec>& parameters() const { return parameters_; }
  const std::vector<BufferSpec>& buffers() const { return buffers_; }
  const std::vector<GradientGroup>& groups() const { return groups_; }
  int64_t total() const { return total_; }
  int64_t buffers_total() const { return buffers_total_; }
  // The parameter named `name`, or nullptr.
  const ParameterSpec* Find(const std::string& name) const;

  // The flat parameters as named tensors (copies).
  TensorMap ToTensors(const std::vector<float>& flat) const;
  // The flat parameters from named tensors. INVALID_ARGUMENT naming `source` and the tensor when
  // one is missing (unless it has a default and `use_defaults`) or does not have the table's
  // shape (only the table's shape is named: the file's is its content).
  absl::StatusOr<std::vector<float>> FromTensors(const TensorMap& tensors,
                                                 const std::string& source,
                                                 bool use_defaults = false) const;
  // Buffers, and each counter at `counter_value`.
  TensorMap BuffersToTensors(const std::vector<float>& buffers, int64_t counter_value) const;
  absl::StatusOr<std::vector<float>> BuffersFromTensors(const TensorMap& tensors,
                                                        const std::string& source) const;
  // Every tensor name of the parameters, buffers and counters, each also after each of
  // `prefixes` + "." (optimizer state: "momentum.layers.0.weight").
  std::set<std::string> Names(const std::vector<std::string>& prefixes = {}) const;

 private:
  std::vector<ParameterSpec> parameters_;
  std::vector<BufferSpec> buffers_;
  std::vector<std::string> counters_;
  std::vector<GradientGroup> groups_;
  int64_t total_ = 0;
  int64_t buffers_total_ = 0;
  int64_t group_begin_ = 0;
};

}  // namespace mptrain
