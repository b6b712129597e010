#include "client/client_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

std::string WriteConfig(const std::string& name, const std::string& text, mode_t mode) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", getpid(), "_", name);
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
  return path;
}

TEST(ClientConfig, SavedContexts_LoadBack_WithMode0600) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", getpid(), "_saved");
  ClientConfig config;
  config.current_context = "prod";
  config.contexts.push_back({"prod", "train.example.com:50051", "/etc/ca.pem", "", "", "",
                             "/home/me/token"});
  config.contexts.push_back({"local", "127.0.0.1:50051"});
  ASSERT_TRUE(SaveClientConfig(path, config).ok());
  struct stat info {};
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  absl::StatusOr<ClientConfig> loaded = LoadClientConfig(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->current_context, "prod");
  ASSERT_EQ(loaded->contexts.size(), 2u);
  EXPECT_EQ(loaded->Find("prod")->coordinator, "train.example.com:50051");
  EXPECT_EQ(loaded->Find("prod")->tls_ca, "/etc/ca.pem");
  EXPECT_EQ(loaded->Find("prod")->token_file, "/home/me/token");
  EXPECT_EQ(loaded->Find("local")->coordinator, "127.0.0.1:50051");
}

TEST(ClientConfig, MissingFile_IsAnEmptyConfig) {
  absl::StatusOr<ClientConfig> loaded = LoadClientConfig("/nonexistent/mptrain/config");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->contexts.empty());
}

TEST(ClientConfig, ReadableByOthers_IsRefused) {
  const std::string path = WriteConfig("open", "[context a]\ncoordinator = h:1\n", 0644);
  absl::StatusOr<ClientConfig> loaded = LoadClientConfig(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("chmod 600"), std::string::npos) << loaded.status();
}

// Each hostile line is refused naming the file and the line, and nothing of it is echoed.
TEST(ClientConfig, HostileLines_AreRefusedByFileAndLine_NeverEchoed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"current-context = a\n[context a]\nroot:SECRET-HASH:20000\n", "line 3: not `key = value`"},
      {"[context a]\nSECRET = 1\n", "line 2: unknown key"},
      {"[context a]\ncoordinator = SECRET\x1b[2J\n", "line 2: a value holds a control"},
      {"[context SECRET/../x]\n", "line 1: a context name is"},
      {"[context a]\n[context a]\n", "line 2: a second context of the same name"},
      {"coordinator = SECRET:1\n", "line 1: before the first [context NAME]"},
      {"current-context = SECRET\n", "line 1: current-context names no context"},
      {"[SECRET]\n", "line 1: not a section"},
      {std::string(70 * 1024, '#'), "bytes it may hold"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = WriteConfig(absl::StrCat("hostile", i), cases[i].first, 0600);
    absl::StatusOr<ClientConfig> loaded = LoadClientConfig(path);
    ASSERT_FALSE(loaded.ok()) << i;
    const std::string message(loaded.status().message());
    EXPECT_NE(message.find(absl::StrCat("config file ", path)), std::string::npos) << message;
    EXPECT_NE(message.find(cases[i].second), std::string::npos) << message;
    EXPECT_EQ(message.find("SECRET"), std::string::npos) << message;
  }
}

TEST(ClientConfig, ValuesLoadWouldRefuse_AreNotSaved) {
  ClientConfig config;
  config.contexts.push_back({"a", "host:1\nSECRET"});
  EXPECT_FALSE(SerializeClientConfig(config).ok());
  config.contexts = {{"bad name"}};
  EXPECT_FALSE(SerializeClientConfig(config).ok());
}

}  // namespace
}  // namespace mptrain
