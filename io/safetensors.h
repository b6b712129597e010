#pragma once

// safetensors files of fp32 tensors (the checkpoint format): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}}, then the raw data. Files written
// here load with safetensors.torch.load_file.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mptrain {

struct NamedTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

using TensorMap = std::map<std::string, NamedTensor>;

// NOT_FOUND when the file cannot be opened; INVALID_ARGUMENT for a malformed file or a tensor
// that is not F32, naming the file and the tensor.
// `metadata`, when given, receives the header's "__metadata__" entries.
absl::StatusOr<TensorMap> ReadSafetensors(const std::string& path,
                                          std::map<std::string, std::string>* metadata = nullptr);

// Writes atomically: a temporary file beside `path`, fsync, rename, fsync of the directory.
// `metadata` goes into the header's "__metadata__" (string values only, per the format).
absl::Status WriteSafetensors(const std::string& path, const TensorMap& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace mptrain
