#include "client/client_config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace mptrain {
namespace {

constexpr off_t kMaxConfigBytes = 64 * 1024;
constexpr size_t kMaxContexts = 64;
constexpr size_t kMaxValueBytes = 4096;
constexpr size_t kMaxNameBytes = 63;

bool ValidName(absl::string_view name) {
  return !name.empty() && name.size() <= kMaxNameBytes &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
                  c == '-';
         });
}

bool ValidValue(absl::string_view value) {
  return value.size() <= kMaxValueBytes &&
         std::all_of(value.begin(), value.end(), [](char c) {
           return static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f;
         });
}

// The field of `context` that `key` names, or null.
std::string* Field(NamedContext* context, absl::string_view key) {
  if (key == "coordinator") return &context->coordinator;
  if (key == "tls_ca") return &context->tls_ca;
  if (key == "tls_cert") return &context->tls_cert;
  if (key == "tls_key") return &context->tls_key;
  if (key == "tls_server_name") return &context->tls_server_name;
  if (key == "token_file") return &context->token_file;
  return nullptr;
}

}  // namespace

const NamedContext* ClientConfig::Find(const std::string& name) const {
  for (const NamedContext& context : contexts) {
    if (context.name == name) return &context;
  }
  return nullptr;
}

NamedContext* ClientConfig::Find(const std::string& name) {
  for (NamedContext& context : contexts) {
    if (context.name == name) return &context;
  }
  return nullptr;
}

std::string ClientConfigPath() {
  const char* explicit_path = std::getenv("MPTRAIN_CONFIG");
  if (explicit_path != nullptr && *explicit_path != '\0') return explicit_path;
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') return "";
  return absl::StrCat(home, "/.config/mptrain/config");
}

absl::StatusOr<ClientConfig> LoadClientConfig(const std::string& path) {
  ClientConfig config;
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return config;
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", path, ": cannot be read: ", std::strerror(errno)));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": not a regular file"));
  }
  if ((info.st_mode & 077) != 0) {
    // It names the files that prove who one is, and the coordinator they are sent to.
    return absl::InvalidArgumentError(absl::StrCat(
        "config file ", path, ": others may read or write it (chmod 600 ", path, ")"));
  }
  if (info.st_size > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": more than the ",
                                                   kMaxConfigBytes, " bytes it may hold"));
  }
  std::ifstream in(path);
  std::string line;
  NamedContext* context = nullptr;
  int current_context_line = 0;
  for (int number = 1; std::getline(in, line); ++number) {
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("config file ", path, " line ", number,
                                                     ": ", why));
    };
    if (line.size() > kMaxValueBytes + 64) return bad("longer than a line may be");
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    if (text.front() == '[') {
      if (!absl::ConsumePrefix(&text, "[context ") || !absl::ConsumeSuffix(&text, "]")) {
        return bad("not a section (one `[context NAME]`)");
      }
      if (!ValidName(text)) {
        return bad("a context name is 1 to 63 of letters, digits, '.', '_' and '-'");
      }
      const std::string name(text);
      if (config.Find(name) != nullptr) return bad("a second context of the same name");
      if (config.contexts.size() >= kMaxContexts) {
        return bad(absl::StrCat("more than ", kMaxContexts, " contexts"));
      }
      config.contexts.push_back(NamedContext{name});
      context = &config.contexts.back();
      continue;
    }
    const size_t equals = text.find('=');
    if (equals == absl::string_view::npos) return bad("not `key = value`");
    const absl::string_view key = absl::StripAsciiWhitespace(text.substr(0, equals));
    const absl::string_view value = absl::StripAsciiWhitespace(text.substr(equals + 1));
    if (!ValidValue(value)) return bad("a value holds a control or non-ASCII character");
    if (context == nullptr) {
      if (key != "current-context") {
        return bad("before the first [context NAME], only `current-context = NAME`");
      }
      if (!ValidName(value)) {
        return bad("a context name is 1 to 63 of letters, digits, '.', '_' and '-'");
      }
      config.current_context = std::string(value);
      current_context_line = number;
      continue;
    }
    std::string* field = Field(context, key);
    if (field == nullptr) {
      return bad(
          "unknown key (coordinator, tls_ca, tls_cert, tls_key, tls_server_name, token_file)");
    }
    *field = std::string(value);
  }
  if (!config.current_context.empty() && config.Find(config.current_context) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("config file ", path, " line ",
                                                   current_context_line,
                                                   ": current-context names no context"));
  }
  return config;
}

absl::StatusOr<std::string> SerializeClientConfig(const ClientConfig& config) {
  std::string out = "# trainctl contexts (trainctl config set-context / use-context)\n";
  if (!config.current_context.empty()) {
    absl::StrAppend(&out, "current-context = ", config.current_context, "\n");
  }
  if (config.contexts.size() > kMaxContexts) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxContexts, " contexts"));
  }
  for (NamedContext context : config.contexts) {
    if (!ValidName(context.name)) {
      return absl::InvalidArgumentError(
          "a context name is 1 to 63 of letters, digits, '.', '_' and '-'");
    }
    absl::StrAppend(&out, "\n[context ", context.name, "]\n");
    for (const char* key :
         {"coordinator", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "token_file"}) {
      const std::string& value = *Field(&context, key);
      if (value.empty()) continue;
      if (!ValidValue(value) || absl::StripAsciiWhitespace(value) != value) {
        return absl::InvalidArgumentError(absl::StrCat(
            "context ", context.name, ": ", key,
            " must be printable ASCII without leading or trailing spaces"));
      }
      absl::StrAppend(&out, key, " = ", value, "\n");
    }
  }
  return out;
}

absl::Status SaveClientConfig(const std::string& path, const ClientConfig& config) {
  absl::StatusOr<std::string> text = SerializeClientConfig(config);
  if (!text.ok()) return text.status();
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    // ~/.config/mptrain: made here if missing (its parent is expected to exist).
    const std::string directory = path.substr(0, slash);
    if (mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": cannot make ",
                                                     directory, ": ", std::strerror(errno)));
    }
  }
  const std::string temporary = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", path, ": cannot write: ", std::strerror(errno)));
  }
  const bool written = write(fd, text->data(), text->size()) == static_cast<ssize_t>(text->size()) &&
                       fsync(fd) == 0;
  close(fd);
  if (!written || rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    unlink(temporary.c_str());
    return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": cannot write: ", why));
  }
  return absl::OkStatus();
}

}  // namespace mptrain
