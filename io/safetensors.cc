#include "io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace mptrain {
namespace {

// A header larger than this is taken as a corrupt length field.
constexpr uint64_t kMaxHeaderBytes = 100 * 1024 * 1024;

absl::Status Bad(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid safetensors file: ", why));
}

std::string DirectoryOf(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::StatusOr<TensorMap> ReadSafetensors(const std::string& path,
                                          std::map<std::string, std::string>* metadata) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (bytes.size() < 8) return Bad(path, "shorter than the 8-byte header length");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > kMaxHeaderBytes || 8 + header_len > bytes.size()) {
    return Bad(path, absl::StrCat("header length ", header_len, " exceeds the file"));
  }
  nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + header_len,
                                                nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return Bad(path, "header is not JSON");
  const size_t data_start = 8 + header_len;
  const size_t data_size = bytes.size() - data_start;
  TensorMap tensors;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (metadata != nullptr && info.is_object()) {
        for (auto& [key, value] : info.items()) {
          if (value.is_string()) (*metadata)[key] = value.get<std::string>();
        }
      }
      continue;
    }
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets")) {
      return Bad(path, absl::StrCat("tensor ", name, " lacks dtype, shape or data_offsets"));
    }
    if (info["dtype"] != "F32") {
      return Bad(path, absl::StrCat("tensor ", name, " has dtype ", info["dtype"].dump(),
                                    ", expected F32"));
    }
    NamedTensor tensor;
    int64_t count = 1;
    for (const auto& dim : info["shape"]) {
      if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
        return Bad(path, absl::StrCat("tensor ", name, " has a bad shape"));
      }
      tensor.shape.push_back(dim.get<int64_t>());
      count *= dim.get<int64_t>();
    }
    const auto& offsets = info["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return Bad(path, absl::StrCat("tensor ", name, " has bad data_offsets"));
    }
    uint64_t begin = offsets[0].get<uint64_t>();
    uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size || end - begin != count * sizeof(float)) {
      return Bad(path, absl::StrCat("tensor ", name, " data_offsets [", begin, ", ", end,
                                    ") do not fit its shape or the file"));
    }
    tensor.values.resize(count);
    std::memcpy(tensor.values.data(), bytes.data() + data_start + begin, end - begin);
    tensors[name] = std::move(tensor);
  }
  return tensors;
}

absl::Status WriteSafetensors(const std::string& path, const TensorMap& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    uint64_t bytes = tensor.values.size() * sizeof(float);
    header[name] = {{"dtype", "F32"},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // Align the data to 8 bytes.
  uint64_t header_len = header_text.size();

  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", tmp, ": ",
                                                    std::strerror(errno)));
  }
  auto write_all = [&](const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      ssize_t n = write(fd, p, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      p += n;
      size -= n;
    }
    return true;
  };
  bool ok = write_all(&header_len, 8) && write_all(header_text.data(), header_text.size());
  for (const auto& [name, tensor] : tensors) {
    if (!ok) break;
    ok = write_all(tensor.values.data(), tensor.values.size() * sizeof(float));
  }
  ok = ok && fsync(fd) == 0;
  ok = (close(fd) == 0) && ok;
  if (!ok) {
    unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat("writing ", tmp, " failed: ", std::strerror(errno)));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat("renaming ", tmp, " to ", path, " failed: ",
                                            std::strerror(errno)));
  }
  int dir = open(DirectoryOf(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    fsync(dir);
    close(dir);
  }
  return absl::OkStatus();
}

}  // namespace mptrain
