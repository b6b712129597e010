#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>  // renameat2, RENAME_NOREPLACE (glibc >= 2.28 with _GNU_SOURCE).
#include <cstring>
#include <new>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "io/regular_file.h"
#include "xxhash.h"

namespace mptrain {
namespace {

using json = nlohmann::json;

// The data is copied byte for byte into host floats.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the safetensors reader assumes little-endian");

// A header larger than this is taken as a corrupt length field.
constexpr uint64_t kMaxHeaderBytes = 100 * 1024 * 1024;
constexpr int64_t kMaxTensors = 100000;
// Bounds what a hostile header can make the JSON parser allocate: a shape of millions of 1s
// would pass every other check.
constexpr int64_t kMaxArrayElements = 64;
// Keys of one tensor entry (dtype, shape, data_offsets: a few to spare) and of __metadata__:
// millions of short keys would cost the parser tens of times the file's size.
constexpr size_t kMaxTensorFields = 8;
constexpr size_t kMaxMetadataEntries = 1024;

absl::Status Bad(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid safetensors file: ", why));
}

// ---------------------------------------------------------------------------------------------
// The header.

// A first, SAX pass over the header that builds nothing and stops at the first problem. It
// catches what the DOM parse cannot or should not see: nlohmann::json keeps the last of
// duplicate keys without a word, and would build whatever a 100 MiB header describes. A valid
// header nests no deeper than {name: {field: [numbers]}}, has at most kMaxTensors tensors and
// short arrays, so after this pass the DOM is small. (The DOM parser's own callback could do
// this, but it rescans the parent object after every member: quadratic in the tensor count.)
class HeaderPrecheck {
 public:
  using string_t = json::string_t;

  // Empty when the header passed.
  const std::string& problem() const { return problem_; }

  bool null() { return Value(); }
  bool boolean(bool) { return Value(); }
  bool number_integer(json::number_integer_t) { return Value(); }
  bool number_unsigned(json::number_unsigned_t) { return Value(); }
  bool number_float(json::number_float_t, const string_t&) { return Value(); }
  bool string(string_t&) { return Value(); }
  bool binary(json::binary_t&) { return Value(); }

  bool start_object(std::size_t) {
    if (frames_.size() >= 2) return Refuse(absl::StrCat(Where(), " nests objects too deeply"));
    frames_.push_back(Frame{true, {}, 0});
    return true;
  }
  bool key(string_t& key) {
    Frame& frame = frames_.back();
    if (frames_.size() == 1) {
      top_key_ = key;
      field_key_.clear();
      if (key != "__metadata__" && ++tensors_ > kMaxTensors) {
        return Refuse(absl::StrCat("more than ", kMaxTensors, " tensors"));
      }
    } else {
      field_key_ = key;
    }
    if (!frame.keys.insert(key).second) {
      return Refuse(frames_.size() == 1 ? "a top-level key appears twice"
                                        : absl::StrCat(Entry(), " has a key twice"));
    }
    if (frames_.size() == 2) {
      const size_t limit = top_key_ == "__metadata__" ? kMaxMetadataEntries : kMaxTensorFields;
      if (frame.keys.size() > limit) {
        return Refuse(absl::StrCat(Entry(), " has more than ", limit, " keys"));
      }
    }
    return true;
  }
  bool end_object() {
    frames_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    if (frames_.empty()) return Refuse("the header is a JSON array, expected an object");
    if (frames_.size() == 1) {
      return Refuse(absl::StrCat(Entry(), " is a JSON array, expected an object"));
    }
    if (frames_.size() >= 3) return Refuse(absl::StrCat(Where(), " nests arrays too deeply"));
    frames_.push_back(Frame{false, {}, 0});
    return true;
  }
  bool end_array() {
    frames_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    // Neither the position nor the parser's message (it quotes the bytes it met): both would
    // tell the reader of the error what an unreadable file holds.
    return Refuse("the header is not valid JSON");
  }

 private:
  struct Frame {
    bool is_object;
    std::set<std::string> keys;  // Of an object.
    int64_t elements;            // Of an array.
  };

  bool Value() {
    if (!frames_.empty() && !frames_.back().is_object &&
        ++frames_.back().elements > kMaxArrayElements) {
      return Refuse(absl::StrCat(Where(), " has more than ", kMaxArrayElements, " elements"));
    }
    return true;
  }
  bool Refuse(std::string problem) {
    if (problem_.empty()) problem_ = std::move(problem);
    return false;
  }
  // Keys from the header are never quoted (the file may be anyone's): __metadata__ and the
  // known tensor fields by name, anything else by what it is.
  std::string Entry() const {
    return top_key_ == "__metadata__" ? "'__metadata__'" : "a tensor entry";
  }
  std::string Where() const {
    if (field_key_.empty()) return Entry();
    if (top_key_ != "__metadata__" &&
        (field_key_ == "dtype" || field_key_ == "shape" || field_key_ == "data_offsets")) {
      return absl::StrCat(Entry(), " field '", field_key_, "'");
    }
    return absl::StrCat(Entry(), " field");
  }

  std::vector<Frame> frames_;
  std::string top_key_, field_key_;
  int64_t tensors_ = 0;
  std::string problem_;
};

// Where a tensor's bytes lie within the data section.
struct TensorEntry {
  std::string name;
  uint64_t begin = 0;
  uint64_t end = 0;
  NamedTensor tensor;  // Shape only until the data is read.
};

// Checks one tensor's header entry against the data size. `tensor` says which entry it is in
// errors: never its name, a value or a size from the file (see safetensors.h).
absl::StatusOr<TensorEntry> ParseTensorEntry(const std::string& path, const std::string& tensor,
                                             const std::string& name, const json& info,
                                             uint64_t data_size) {
  if (!info.is_object()) {
    return Bad(path, absl::StrCat(tensor, " is a JSON ", info.type_name(), ", expected an object"));
  }
  auto dtype = info.find("dtype");
  auto shape = info.find("shape");
  auto offsets = info.find("data_offsets");
  if (dtype == info.end() || shape == info.end() || offsets == info.end()) {
    return Bad(path, absl::StrCat(tensor, " lacks ",
                                  dtype == info.end()   ? "dtype"
                                  : shape == info.end() ? "shape"
                                                        : "data_offsets"));
  }
  if (!dtype->is_string() || dtype->get_ref<const std::string&>() != "F32") {
    return Bad(path, absl::StrCat(tensor, " has a dtype other than \"F32\" (the only one read)"));
  }
  if (!shape->is_array()) {
    return Bad(path, absl::StrCat(tensor, " has a shape that is a JSON ", shape->type_name(),
                                  ", expected an array"));
  }
  TensorEntry entry;
  entry.name = name;
  uint64_t count = 1;
  for (size_t i = 0; i < shape->size(); ++i) {
    const json& dim = (*shape)[i];
    const std::string field = absl::StrCat(tensor, " shape[", i, "]");
    if (!dim.is_number_unsigned()) {
      return Bad(path, absl::StrCat(field, " is not a non-negative integer"));
    }
    const uint64_t value = dim.get<uint64_t>();
    if (value > static_cast<uint64_t>(INT64_MAX)) {
      return Bad(path, absl::StrCat(field, " is too large for int64"));
    }
    if (__builtin_mul_overflow(count, value, &count)) {
      return Bad(path, absl::StrCat(tensor, " has a shape with more elements than fit in 64 bits"));
    }
    entry.tensor.shape.push_back(static_cast<int64_t>(value));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(count, uint64_t{sizeof(float)}, &bytes)) {
    return Bad(path,
               absl::StrCat(tensor, " has a shape that needs more bytes than fit in 64 bits"));
  }
  if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned()) {
    return Bad(path, absl::StrCat(tensor, " has data_offsets that are not [begin, end] of "
                                  "non-negative integers"));
  }
  entry.begin = (*offsets)[0].get<uint64_t>();
  entry.end = (*offsets)[1].get<uint64_t>();
  if (entry.begin > entry.end || entry.end > data_size) {
    return Bad(path, absl::StrCat(tensor, " has data_offsets that do not lie within the data "
                                  "section (begin <= end <= its size): truncated or damaged"));
  }
  if (entry.end - entry.begin != bytes) {
    return Bad(path, absl::StrCat(tensor, " has data_offsets that do not span the 4 bytes per "
                                  "element its shape needs"));
  }
  return entry;
}

// XXH3-64 of tensors' values in the order given, as hex: the data section's digest.
class DataDigest {
 public:
  DataDigest() : state_(XXH3_createState()) {
    if (state_ == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(state_);
  }
  ~DataDigest() { XXH3_freeState(state_); }
  DataDigest(const DataDigest&) = delete;
  DataDigest& operator=(const DataDigest&) = delete;
  void Add(const std::vector<float>& values) {
    XXH3_64bits_update(state_, values.data(), values.size() * sizeof(float));
  }
  void AddText(const std::string& text) { XXH3_64bits_update(state_, text.data(), text.size()); }
  std::string Hex() const { return absl::StrFormat("%016x", XXH3_64bits_digest(state_)); }

 private:
  XXH3_state_t* state_;
};

// How errors name a tensor: by name when the caller expects that name, else by position.
std::string TensorLabel(const std::string& name, size_t index,
                        const SafetensorsReadOptions& options) {
  if (options.known_names != nullptr && options.known_names->count(name) != 0) {
    return absl::StrCat("tensor '", name, "'");
  }
  return absl::StrCat("tensor #", index, " (in name order)");
}

// The position of `entry` among `entries`, which are in name order.
size_t TensorIndex(const std::vector<TensorEntry>& entries, const TensorEntry& entry) {
  return static_cast<size_t>(&entry - entries.data());
}

absl::StatusOr<TensorMap> ReadSafetensorsOrThrow(const absl::StatusOr<RegularFile>& file,
                                                 const std::string& path,
                                                 std::map<std::string, std::string>* metadata,
                                                 const SafetensorsReadOptions& options) {
  if (!file.ok()) return file.status();
  // No value read from the file, nor its size, goes into an error: the file may be anyone's
  // (a path under a data root that is not the user's), and "header length N" would spell its
  // first 8 bytes.
  if (file->size < 8) return Bad(path, "it is shorter than the 8-byte header length");
  uint64_t header_len = 0;
  absl::Status status = ReadAt(*file, path, 0, &header_len, 8);
  if (!status.ok()) return status;
  if (header_len > kMaxHeaderBytes || header_len > file->size - 8) {
    return Bad(path, absl::StrCat("its header length (the first 8 bytes) exceeds the rest of "
                                  "the file or the limit of ", kMaxHeaderBytes, " bytes"));
  }
  std::string text(header_len, '\0');
  status = ReadAt(*file, path, 8, text.data(), header_len);
  if (!status.ok()) return status;

  HeaderPrecheck precheck;
  if (!json::sax_parse(text.begin(), text.end(), &precheck)) {
    return Bad(path, precheck.problem().empty() ? "the header is not valid JSON"
                                                : precheck.problem());
  }
  const json header = json::parse(text.begin(), text.end(), /*cb=*/nullptr,
                                  /*allow_exceptions=*/false);
  if (header.is_discarded()) return Bad(path, "the header is not valid JSON");
  if (!header.is_object()) {
    return Bad(path, absl::StrCat("the header is a JSON ", header.type_name(),
                                  ", expected an object"));
  }
  text = std::string();  // The parsed header replaces it.

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file->size - data_start;
  std::map<std::string, std::string> entries;
  std::vector<TensorEntry> tensors;
  int64_t tensor_index = 0;  // In name order, which is the DOM's.
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) {
        return Bad(path, absl::StrCat("__metadata__ is a JSON ", info.type_name(),
                                      ", expected an object of strings"));
      }
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) {
          return Bad(path, absl::StrCat("a __metadata__ value is a JSON ", value.type_name(),
                                        ", expected a string"));
        }
        entries[key] = value.get_ref<const std::string&>();
      }
      continue;
    }
    absl::StatusOr<TensorEntry> entry =
        ParseTensorEntry(path, TensorLabel(name, tensor_index++, options), name, info, data_size);
    if (!entry.ok()) return entry.status();
    tensors.push_back(*std::move(entry));
  }

  // No byte may belong to two tensors (empty tensors hold none).
  std::vector<const TensorEntry*> by_offset;
  for (const TensorEntry& entry : tensors) {
    if (entry.end > entry.begin) by_offset.push_back(&entry);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->begin < b->begin;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorEntry& before = *by_offset[i - 1];
    const TensorEntry& after = *by_offset[i];
    if (after.begin < before.end) {
      return Bad(path, "the data_offsets of two tensors overlap");
    }
  }

  // Every allocation below is bounded by the file's size: the ranges fit in it and are disjoint.
  TensorMap result;
  for (TensorEntry& entry : tensors) {
    NamedTensor& tensor = entry.tensor;
    if (options.header_only) {
      result[entry.name] = std::move(tensor);
      continue;
    }
    tensor.values.resize((entry.end - entry.begin) / sizeof(float));
    status = ReadAt(*file, path, data_start + entry.begin, tensor.values.data(),
                    entry.end - entry.begin);
    if (!status.ok()) return status;
    if (options.require_finite) {
      for (size_t i = 0; i < tensor.values.size(); ++i) {
        if (!std::isfinite(tensor.values[i])) {
          // The position only: the value is the file's.
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": ", TensorLabel(entry.name, TensorIndex(tensors, entry), options),
              " holds a NaN or infinity at index ", i, "; its values must be finite"));
        }
      }
    }
    result[entry.name] = std::move(tensor);
  }
  if (auto digest = entries.find(std::string(kDataDigestKey));
      digest != entries.end() && !options.header_only) {
    // Written with the file: any byte of its data changed since (a bit flip on disk, a partial
    // copy) shows here, where a flipped mantissa bit would otherwise load without a trace.
    DataDigest computed;
    for (const TensorEntry* entry : by_offset) computed.Add(result.at(entry->name).values);
    json unstamped = header;
    unstamped["__metadata__"].erase(std::string(kDataDigestKey));
    computed.AddText(unstamped.dump());
    if (computed.Hex() != digest->second) {
      return Bad(path, absl::StrCat("its data or header does not match the digest written with "
                                    "it (", kDataDigestKey, "): the file is damaged"));
    }
  }
  if (metadata != nullptr) *metadata = std::move(entries);
  return result;
}

absl::Status WriteSafetensorsOrThrow(const std::string& path, const TensorMap& tensors,
                                     const std::map<std::string, std::string>& metadata,
                                     const SafetensorsWriteOptions& options) {
  json header = json::object();
  std::map<std::string, std::string> unstamped = metadata;
  unstamped.erase(std::string(kDataDigestKey));
  header["__metadata__"] = unstamped;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a tensor cannot be named __metadata__"));
    }
    uint64_t count = 1;
    bool fits = true;
    for (int64_t dim : tensor.shape) {
      fits = fits && dim >= 0 && !__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &count);
    }
    if (!fits || count != tensor.values.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "' has shape [", absl::StrJoin(tensor.shape, ", "),
                       "] but ", tensor.values.size(), " values"));
    }
    const uint64_t bytes = count * sizeof(float);
    header[name] = {{"dtype", "F32"},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  {
    // Over the data in the order it is written below, then the header without the digest: a
    // flipped bit in a tensor or in the step, scale or data position shows.
    DataDigest digest;
    for (const auto& [name, tensor] : tensors) digest.Add(tensor.values);
    digest.AddText(header.dump());  // Throws (caught at the boundary) on text that is not UTF-8.
    header["__metadata__"][std::string(kDataDigestKey)] = digest.Hex();
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // Align the data to 8 bytes.
  uint64_t header_len = header_text.size();

  // One file written whole under a temporary name, then renamed (io/regular_file.h).
  return WriteFileAtomically(
      path, options.replace_existing, options.no_symlinks, [&](const WriteBytes& write_all) {
        bool ok = write_all(&header_len, 8) && write_all(header_text.data(), header_text.size());
        for (const auto& [tensor_name, tensor] : tensors) {
          if (!ok) break;
          ok = write_all(tensor.values.data(), tensor.values.size() * sizeof(float));
        }
        return ok;
      });
}

}  // namespace

absl::StatusOr<TensorMap> ReadSafetensors(const std::string& path,
                                          std::map<std::string, std::string>* metadata,
                                          const SafetensorsReadOptions& options) {
  return NoThrow(path, [&] {
    return ReadSafetensorsOrThrow(OpenRegularFile(path), path, metadata, options);
  });
}

absl::StatusOr<std::map<std::string, std::string>> ReadSafetensorsMetadataAt(
    int dir_fd, const std::string& name, const std::string& path) {
  std::map<std::string, std::string> metadata;
  SafetensorsReadOptions header;
  header.header_only = true;
  absl::Status status = NoThrow(path, [&]() -> absl::Status {
    return ReadSafetensorsOrThrow(OpenRegularFileAt(dir_fd, name, path), path, &metadata, header)
        .status();
  });
  if (!status.ok()) return status;
  return metadata;
}

absl::Status WriteSafetensors(const std::string& path, const TensorMap& tensors,
                              const std::map<std::string, std::string>& metadata,
                              const SafetensorsWriteOptions& options) {
  return NoThrow(path, [&] { return WriteSafetensorsOrThrow(path, tensors, metadata, options); });
}

}  // namespace mptrain
