#include "trainer/data/token_file_list.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/data/token_shards.h"
#include "worker/path_policy.h"

namespace mptrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  mkdir(path.c_str(), 0755);
  return path;
}

void Touch(const std::string& path) { std::ofstream(path) << "xy"; }

class TokenFileListTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = TempDir("data");
    outside_ = TempDir("outside");
    for (const char* name :
         {"train_002.bin", "train_000.bin", "train_010.bin", "val_000.bin", "train_001.txt"}) {
      Touch(data_ + "/" + name);
    }
    Touch(outside_ + "/train_000.bin");
    absl::StatusOr<PathPolicy> policy = PathPolicy::Create({data_}, {TempDir("out")});
    ASSERT_TRUE(policy.ok()) << policy.status();
    policy_ = std::make_unique<PathPolicy>(*std::move(policy));
    check_read_ = [this](const std::string& field, const std::string& path) {
      return policy_->CheckRead(field, path);
    };
  }

  absl::StatusOr<std::vector<std::string>> Expand(const std::vector<std::string>& entries) {
    return ExpandTokenFiles("data.tokens.files", entries, check_read_);
  }

  std::string data_, outside_;
  std::unique_ptr<PathPolicy> policy_;
  CheckReadFunction check_read_;
};

TEST_F(TokenFileListTest, Pattern_ExpandsSortedBytewiseBesidePlainEntries) {
  absl::StatusOr<std::vector<std::string>> files =
      Expand({data_ + "/val_000.bin", data_ + "/train_*.bin", data_ + "/train_00?.txt"});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(data_ + "/val_000.bin", data_ + "/train_000.bin",
                                  data_ + "/train_002.bin", data_ + "/train_010.bin",
                                  data_ + "/train_001.txt"));
}

TEST_F(TokenFileListTest, PatternOutsideTheRoots_IsRefusedBeforeItIsMatched) {
  absl::Status status = Expand({outside_ + "/train_*.bin"}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("data.tokens.files[0]"));
  // The same answer where nothing matches: whether a directory outside holds files is not told.
  EXPECT_EQ(Expand({outside_ + "/none_*.bin"}).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(TokenFileListTest, DirectoryLinkLeadingOutside_IsRefused) {
  const std::string link = data_ + "/escape";
  unlink(link.c_str());
  ASSERT_EQ(symlink(outside_.c_str(), link.c_str()), 0);
  EXPECT_EQ(Expand({link + "/train_*.bin"}).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(TokenFileListTest, MatchThatIsASymbolicLink_FailsTheList) {
  const std::string dir = TempDir("data/linked");
  Touch(dir + "/a_0.bin");
  unlink((dir + "/a_1.bin").c_str());
  ASSERT_EQ(symlink((dir + "/a_0.bin").c_str(), (dir + "/a_1.bin").c_str()), 0);
  absl::Status status = Expand({dir + "/a_*.bin"}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("a_1.bin"));
}

TEST_F(TokenFileListTest, NoMatchAndBadPatterns_AreInvalidArgument) {
  absl::Status none = Expand({data_ + "/missing_*.bin"}).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message(), HasSubstr("matches no file"));
  for (const std::string& bad : {data_ + "/*/train_000.bin", data_ + "/train_[0].bin*",
                                 data_ + "/train_\\*.bin", std::string("relative_*.bin")}) {
    absl::Status status = Expand({bad}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("data.tokens.files[0]")) << bad;
  }
  EXPECT_EQ(Expand({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TokenFileListTest, MoreThanTheLimit_IsInvalidArgument) {
  std::vector<std::string> entries(kMaxTokenFiles, data_ + "/val_000.bin");
  EXPECT_TRUE(Expand(entries).ok());
  entries.push_back(data_ + "/train_*.bin");
  absl::Status status = Expand(entries).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("more than 4096"));
}

}  // namespace
}  // namespace mptrain
