#pragma once

// safetensors files of fp32 tensors (the checkpoint format): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}}, then the raw data. Files written
// here load with safetensors.torch.load_file.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mptrain {

struct NamedTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

using TensorMap = std::map<std::string, NamedTensor>;

// The __metadata__ key of the file's digest (XXH3-64, hex, of every tensor's bytes in file
// order and then of the JSON header without this key). Every file written here has one; a read of a file that has one (not
// header_only) checks it, so a damaged file is an error instead of wrong weights. Files
// without one (other writers, older builds) are read unchecked.
inline constexpr char kDataDigestKey[] = "mptrain_data_xxh3";

struct SafetensorsReadOptions {
  // Refuse a tensor holding NaN or ±Inf (naming its position and the first such index): for
  // weights that a run starts or resumes from, where one NaN would silently poison every step.
  bool require_finite = false;
  // Tensor names the caller expects (a model's): an error about a tensor so named quotes the
  // name, which is the caller's word (saying a file holds it tells no more than the error
  // itself). Any other tensor is named by its position only. Not owned; may be null.
  const std::set<std::string>* known_names = nullptr;
  // Check the whole header (every rule below) but read no tensor data: the tensors come back
  // with their shapes and no values. For the metadata of a large file.
  bool header_only = false;
};

struct SafetensorsWriteOptions {
  // false: fail with ALREADY_EXISTS instead of replacing a file at `path` (the final rename is
  // renameat2(RENAME_NOREPLACE), so two writers cannot both win).
  bool replace_existing = true;
  // true: every directory of an absolute `path` is opened from "/" without following symbolic
  // links, and a link there is PERMISSION_DENIED. For paths resolved earlier (a rank's confined
  // output paths): a directory swapped for a link since cannot redirect the write.
  bool no_symlinks = false;
};

// The reader is total: no file makes it throw, crash or block, and it allocates no more than
// the file's size plus the parsed JSON header (at most 100 MiB of text, checked before parsing).
//
// NOT_FOUND when the file does not exist; PERMISSION_DENIED when it is a symbolic link
// ("<path>: is a symbolic link") or unreadable; INVALID_ARGUMENT, naming the file (and the
// tensor or field), when it is not a regular file ("<path>: not a regular file"), or the header
// length exceeds the file or 100 MiB, or the header is not a JSON object, has a duplicate key,
// more than 100,000 tensors, more than 1,024 __metadata__ entries or 8 keys in a tensor's entry,
// a __metadata__ that is not an object of strings, a tensor that is
// not F32, has a shape that is not non-negative integers or whose size overflows, data_offsets
// outside the data or not matching its shape, or overlapping another tensor's; or, with
// `options.require_finite`, a tensor holds a non-finite value.
// `metadata`, when given, receives the header's "__metadata__" entries.
//
// No error quotes or derives a value from the file: not a byte, a key, a tensor name, a dtype,
// a shape, an offset, a digest, a value, nor the file's size (the file may be anyone's, e.g.
// /etc/shadow under a data root of "/"). An error names the path as given, the rule broken and
// its limit, and at most a position: a tensor as "tensor #k (in name order)" (or by its name
// when it is one of options.known_names), an element index.
absl::StatusOr<TensorMap> ReadSafetensors(const std::string& path,
                                          std::map<std::string, std::string>* metadata = nullptr,
                                          const SafetensorsReadOptions& options = {});

// The "__metadata__" of `name` in the directory `dir_fd` is open on, with every check of the
// header as above and no tensor data read (a checkpoint may be gigabytes); the last component is
// not followed if it is a link. Messages name `path`.
absl::StatusOr<std::map<std::string, std::string>> ReadSafetensorsMetadataAt(
    int dir_fd, const std::string& name, const std::string& path);

// Writes atomically: a temporary file beside `path`, fsync, rename, fsync of the directory.
// `metadata` goes into the header's "__metadata__" (string values only, per the format).
// INVALID_ARGUMENT when a tensor's values do not match its shape or a tensor is named
// "__metadata__"; ALREADY_EXISTS "<path> exists" when `options.replace_existing` is false and
// `path` exists; when the file cannot be created, the code of its cause with the path (NOT_FOUND
// "... (directory D does not exist)", PERMISSION_DENIED "... (no write permission in D)",
// FAILED_PRECONDITION for a read-only file system, RESOURCE_EXHAUSTED for a full disk);
// DATA_LOSS when writing or renaming fails.
absl::Status WriteSafetensors(const std::string& path, const TensorMap& tensors,
                              const std::map<std::string, std::string>& metadata = {},
                              const SafetensorsWriteOptions& options = {});

}  // namespace mptrain
