#include "worker/path_policy.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "tests/ci_skip.h"

namespace mptrain {
namespace {

constexpr char kSecret[] = "TOPSECRET-CONTENTS";

std::string Str(absl::string_view s) { return std::string(s); }

bool Contains(absl::string_view haystack, std::string_view needle) {
  return Str(haystack).find(needle) != std::string::npos;
}

std::string RealPathOf(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  EXPECT_NE(resolved, nullptr) << path;
  if (resolved == nullptr) return "";
  std::string out(resolved);
  ::free(resolved);
  return out;
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path);
  out << contents;
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void MakeDir(const std::string& path) { ASSERT_EQ(::mkdir(path.c_str(), 0755), 0) << path; }

void MakeSymlink(const std::string& target, const std::string& link) {
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0) << link << " -> " << target;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Each test gets its own tree under $TEST_TMPDIR:
//   data/      data root, holding x.bin and sub/y.bin
//   out/       output root, holding ckpt.bin
//   outside/   outside every root, holding secret (and no "missing")
class PathPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/path_policy_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    base_ = pattern;
    data_ = base_ + "/data";
    out_ = base_ + "/out";
    outside_ = base_ + "/outside";
    MakeDir(data_);
    MakeDir(data_ + "/sub");
    MakeDir(out_);
    MakeDir(outside_);
    WriteFile(data_ + "/x.bin", "x");
    WriteFile(data_ + "/sub/y.bin", "y");
    WriteFile(out_ + "/ckpt.bin", "ckpt");
    WriteFile(outside_ + "/secret", kSecret);
  }

  PathPolicy Policy() {
    auto policy = PathPolicy::Create({data_}, {out_});
    EXPECT_TRUE(policy.ok()) << policy.status();
    return *std::move(policy);
  }

  std::string base_, data_, out_, outside_;
};

void ExpectCode(const absl::Status& status, absl::StatusCode code, std::string_view wanted) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_TRUE(Contains(status.message(), wanted))
      << "got: " << status.message() << "\nwanted: " << wanted;
  EXPECT_FALSE(Contains(status.message(), kSecret)) << status;
}

// --- Create ---

TEST_F(PathPolicyTest, Create_ValidRoots_ResolvesThem) {
  PathPolicy policy = Policy();
  EXPECT_EQ(policy.data_roots(), std::vector<std::string>{RealPathOf(data_)});
  EXPECT_EQ(policy.output_roots(), std::vector<std::string>{RealPathOf(out_)});
}

TEST_F(PathPolicyTest, Create_EmptyDataRoots_IsInvalidArgumentNamingFlag) {
  auto policy = PathPolicy::Create({}, {out_});
  ExpectCode(policy.status(), absl::StatusCode::kInvalidArgument, "--data_root");
}

TEST_F(PathPolicyTest, Create_EmptyOutputRoots_IsInvalidArgumentNamingFlag) {
  auto policy = PathPolicy::Create({data_}, {});
  ExpectCode(policy.status(), absl::StatusCode::kInvalidArgument, "--output_root");
}

TEST_F(PathPolicyTest, Create_MissingRoot_IsInvalidArgumentNamingFlag) {
  auto policy = PathPolicy::Create({data_}, {base_ + "/nope"});
  ExpectCode(policy.status(), absl::StatusCode::kInvalidArgument,
             "--output_root \"" + base_ + "/nope\" does not exist");
}

TEST_F(PathPolicyTest, Create_RootIsFile_IsInvalidArgument) {
  auto policy = PathPolicy::Create({data_ + "/x.bin"}, {out_});
  ExpectCode(policy.status(), absl::StatusCode::kInvalidArgument, "is not a directory");
  EXPECT_TRUE(Contains(policy.status().message(), "--data_root")) << policy.status();
}

TEST_F(PathPolicyTest, Create_RelativeRoot_IsInvalidArgument) {
  auto policy = PathPolicy::Create({"data"}, {out_});
  ExpectCode(policy.status(), absl::StatusCode::kInvalidArgument,
             "--data_root must be an absolute path");
}

TEST_F(PathPolicyTest, Create_RootThroughSymlink_ResolvesAndAcceptsBothSpellings) {
  MakeSymlink(data_, base_ + "/data_link");
  auto policy = PathPolicy::Create({base_ + "/data_link"}, {out_});
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->data_roots(), std::vector<std::string>{RealPathOf(data_)});
  const std::string want = RealPathOf(data_) + "/x.bin";
  auto through_link = policy->CheckRead("features_path", base_ + "/data_link/x.bin");
  ASSERT_TRUE(through_link.ok()) << through_link.status();
  EXPECT_EQ(*through_link, want);
  auto through_target = policy->CheckRead("features_path", RealPathOf(data_) + "/x.bin");
  ASSERT_TRUE(through_target.ok()) << through_target.status();
  EXPECT_EQ(*through_target, want);
}

// A worker started in / (a unit without WorkingDirectory, a container) once got the whole
// file system as its roots: system directories are refused, through a link too.
TEST_F(PathPolicyTest, Create_SystemDirectories_AreRefusedAsRoots) {
  for (const char* system : {"/", "/etc", "/usr", "/usr/lib", "/proc", "/sys", "/dev", "/boot",
                             "/root", "/home", "/var", "/tmp"}) {
    struct stat st;
    if (::stat(system, &st) != 0) continue;  // A minimal container may lack one.
    auto as_data = PathPolicy::Create({system}, {out_});
    ExpectCode(as_data.status(), absl::StatusCode::kInvalidArgument, "is a system directory");
    EXPECT_TRUE(Contains(as_data.status().message(), "--data_root")) << as_data.status();
    auto as_output = PathPolicy::Create({data_}, {system});
    ExpectCode(as_output.status(), absl::StatusCode::kInvalidArgument, "is a system directory");
  }
  MakeSymlink("/etc", base_ + "/etc_link");
  ExpectCode(PathPolicy::Create({base_ + "/etc_link"}, {out_}).status(),
             absl::StatusCode::kInvalidArgument, "is a system directory");
  EXPECT_TRUE(PathPolicy::Create({data_}, {out_}).ok()) << "a directory of its own is fine";
}

// --- ForTenancy: each principal's part of the output roots ---

TEST_F(PathPolicyTest, ForTenancy_AUserWritesOnlyInItsPart_WhichIsCreated) {
  auto alice = Policy().ForTenancy({"alice", false});
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_TRUE(IsDirectory(out_ + "/alice")) << "created on first use";
  EXPECT_EQ(alice->output_roots(), std::vector<std::string>{RealPathOf(out_) + "/alice"});
  auto own = alice->CheckWrite("output_checkpoint", out_ + "/alice/final.safetensors", false);
  ASSERT_TRUE(own.ok()) << own.status();
  ExpectCode(alice->CheckWrite("output_checkpoint", out_ + "/final.safetensors", true).status(),
             absl::StatusCode::kPermissionDenied, "outside alice's part");
  MakeDir(out_ + "/bob");
  ExpectCode(alice->CheckWrite("output_checkpoint", out_ + "/bob/final.safetensors", true).status(),
             absl::StatusCode::kPermissionDenied, "<output root>/<principal>/");
  ExpectCode(alice->CheckOutputDirectory("checkpoint_dir", out_ + "/bob/run").status(),
             absl::StatusCode::kPermissionDenied, "outside alice's part");
  EXPECT_FALSE(IsDirectory(out_ + "/bob/run")) << "nothing created in bob's part";
  auto run = alice->CheckOutputDirectory("checkpoint_dir", out_ + "/alice/run/a");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(*run, RealPathOf(out_) + "/alice/run/a");
  // An admin's job: the whole roots, no part made.
  auto admin = Policy().ForTenancy({"ops", true});
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_TRUE(admin->CheckWrite("output_checkpoint", out_ + "/bob/x", false).ok());
  EXPECT_FALSE(IsDirectory(out_ + "/ops"));
}

TEST_F(PathPolicyTest, ForTenancy_ReadsInAnotherPrincipalsPartAreRefused_EvenThroughADataRoot) {
  MakeDir(out_ + "/bob");
  WriteFile(out_ + "/bob/step-00000200.safetensors", "bob's");
  MakeDir(out_ + "/alice");
  WriteFile(out_ + "/alice/init.safetensors", "alice's");
  // The data root is the output root's parent: everything below is lexically readable data.
  auto policy = PathPolicy::Create({base_}, {out_});
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto alice = policy->ForTenancy({"alice", false});
  ASSERT_TRUE(alice.ok()) << alice.status();
  // bob's directory is an ordinary directory until bob's job makes it his part.
  EXPECT_TRUE(alice->CheckRead("init_checkpoint", out_ + "/bob/step-00000200.safetensors").ok());
  ASSERT_TRUE(policy->ForTenancy({"bob", false}).ok());
  EXPECT_TRUE(Contains(ReadFile(out_ + "/bob/.mptrain-principal"), "bob"));
  ExpectCode(alice->CheckRead("init_checkpoint", out_ + "/bob/step-00000200.safetensors").status(),
             absl::StatusCode::kPermissionDenied, "outside alice's part");
  ExpectCode(alice->CheckRead("resume checkpoint", out_ + "/bob/step-00000200.safetensors",
                              ReadScope::kDataOrOutput)
                 .status(),
             absl::StatusCode::kPermissionDenied, "outside alice's part");
  EXPECT_TRUE(alice->CheckRead("init_checkpoint", out_ + "/alice/init.safetensors").ok());
  EXPECT_TRUE(alice->CheckRead("init_checkpoint", out_ + "/ckpt.bin").ok())
      << "a file directly in the root is nobody's part";
  MakeDir(out_ + "/imagenet");
  WriteFile(out_ + "/imagenet/x.npy", "data");
  EXPECT_TRUE(alice->CheckRead("features_path", out_ + "/imagenet/x.npy").ok())
      << "a directory of data, not a part";
  EXPECT_TRUE(alice->CheckRead("features_path", data_ + "/x.bin").ok());
  // Through a link in alice's own part into bob's: the resolved path decides.
  MakeSymlink(out_ + "/bob", out_ + "/alice/to_bob");
  ExpectCode(alice->CheckRead("init_checkpoint", out_ + "/alice/to_bob/step-00000200.safetensors")
                 .status(),
             absl::StatusCode::kPermissionDenied, "alice's part");
  // bob himself reads his own.
  auto bob = policy->ForTenancy({"bob", false});
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_TRUE(bob->CheckRead("init_checkpoint", out_ + "/bob/step-00000200.safetensors").ok());
}

TEST_F(PathPolicyTest, ForTenancy_APartThatIsALinkOrAnOddName_IsRefused) {
  MakeDir(out_ + "/bob");
  MakeSymlink(out_ + "/bob", out_ + "/mallory");
  ExpectCode(Policy().ForTenancy({"mallory", false}).status(),
             absl::StatusCode::kFailedPrecondition, "is not a directory (it is a symbolic link)");
  for (const char* odd : {"", ".", "..", "a/b"}) {
    ExpectCode(Policy().ForTenancy({odd, false}).status(), absl::StatusCode::kInvalidArgument,
               "not '.' or '..'");
  }
}

// --- CheckRead ---

TEST_F(PathPolicyTest, CheckRead_RegularFile_ReturnsResolvedPath) {
  auto path = Policy().CheckRead("features_path", data_ + "//sub//y.bin");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, RealPathOf(data_ + "/sub/y.bin"));
}

TEST_F(PathPolicyTest, CheckRead_DotDot_IsInvalidArgument) {
  auto path = Policy().CheckRead("features_path", data_ + "/../outside/secret");
  ExpectCode(path.status(), absl::StatusCode::kInvalidArgument,
             "features_path must not contain '..' components");
}

TEST_F(PathPolicyTest, CheckRead_Relative_IsInvalidArgument) {
  auto path = Policy().CheckRead("targets_path", "data/x.bin");
  ExpectCode(path.status(), absl::StatusCode::kInvalidArgument,
             "targets_path must be an absolute path");
}

TEST_F(PathPolicyTest, CheckRead_NulByte_IsInvalidArgument) {
  auto path = Policy().CheckRead("features_path", data_ + std::string("/x.bin\0/../../secret", 21));
  ExpectCode(path.status(), absl::StatusCode::kInvalidArgument, "NUL");
}

TEST_F(PathPolicyTest, CheckRead_OutsideRoots_IsPermissionDeniedWithExactMessage) {
  auto path = Policy().CheckRead("init_checkpoint", outside_ + "/secret");
  EXPECT_EQ(path.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Str(path.status().message()), "init_checkpoint \"" + outside_ +
                                              "/secret\" is outside the worker's data roots [" +
                                              RealPathOf(data_) + "]");
}

TEST_F(PathPolicyTest, CheckRead_OutsideRoots_SameAnswerWhetherOrNotItExists) {
  PathPolicy policy = Policy();
  // An existing file, a missing file, and a file in a missing directory, all outside the roots.
  const std::vector<std::string> paths = {outside_ + "/secret", outside_ + "/missing",
                                          outside_ + "/nodir/missing", "/etc/passwd"};
  std::vector<absl::Status> statuses;
  for (const std::string& p : paths)
    statuses.push_back(policy.CheckRead("init_checkpoint", p).status());
  for (size_t i = 0; i < paths.size(); ++i) {
    EXPECT_EQ(statuses[i].code(), absl::StatusCode::kPermissionDenied) << statuses[i];
    EXPECT_EQ(absl::StrReplaceAll(statuses[i].message(), {{paths[i], "<path>"}}),
              absl::StrReplaceAll(statuses[0].message(), {{paths[0], "<path>"}}))
        << paths[i];
    EXPECT_FALSE(Contains(statuses[i].message(), kSecret));
  }
}

TEST_F(PathPolicyTest, CheckRead_SiblingWithRootPrefix_IsPermissionDenied) {
  MakeDir(data_ + "base");
  WriteFile(data_ + "base/z.bin", "z");
  auto path = Policy().CheckRead("features_path", data_ + "base/z.bin");
  ExpectCode(path.status(), absl::StatusCode::kPermissionDenied,
             "is outside the worker's data roots");
}

TEST_F(PathPolicyTest, CheckRead_SymlinkInMiddleEscapes_IsPermissionDenied) {
  MakeSymlink(outside_, data_ + "/escape");
  auto path = Policy().CheckRead("features_path", data_ + "/escape/secret");
  ExpectCode(path.status(), absl::StatusCode::kPermissionDenied,
             "features_path \"" + data_ +
                 "/escape/secret\" resolves outside the worker's data roots through a symbolic "
                 "link");
}

TEST_F(PathPolicyTest, CheckRead_SymlinkInMiddleEscapesToMissingFile_IsPermissionDenied) {
  MakeSymlink(outside_, data_ + "/escape");
  auto path = Policy().CheckRead("features_path", data_ + "/escape/missing");
  ExpectCode(path.status(), absl::StatusCode::kPermissionDenied, "through a symbolic link");
}

TEST_F(PathPolicyTest, CheckRead_SymlinkEscape_SameAnswerWhetherOutsideDirectoryExists) {
  // Otherwise a link planted inside a root would tell which directories exist outside.
  MakeSymlink(outside_, data_ + "/escape");
  MakeDir(outside_ + "/real");
  PathPolicy policy = Policy();
  auto existing = policy.CheckRead("features_path", data_ + "/escape/real/f").status();
  auto missing = policy.CheckRead("features_path", data_ + "/escape/none/f").status();
  ExpectCode(existing, absl::StatusCode::kPermissionDenied, "through a symbolic link");
  EXPECT_EQ(existing.code(), missing.code());
  EXPECT_EQ(absl::StrReplaceAll(existing.message(), {{"/real/", "/X/"}}),
            absl::StrReplaceAll(missing.message(), {{"/none/", "/X/"}}));
}

TEST_F(PathPolicyTest, CheckRead_DanglingSymlinkInMiddle_IsPermissionDenied) {
  MakeSymlink(outside_ + "/missing", data_ + "/dangling");
  auto path = Policy().CheckRead("features_path", data_ + "/dangling/f");
  ExpectCode(path.status(), absl::StatusCode::kPermissionDenied, "through a symbolic link");
}

TEST_F(PathPolicyTest, CheckRead_SymlinkLoopInMiddle_IsRefused) {
  MakeSymlink(data_ + "/loop", data_ + "/loop");
  auto path = Policy().CheckRead("features_path", data_ + "/loop/f");
  EXPECT_FALSE(path.ok());
  EXPECT_TRUE(Contains(path.status().message(), "features_path")) << path.status();
}

TEST_F(PathPolicyTest, CheckRead_MissingDeepDirectory_IsNotFoundNamingDirectory) {
  auto path = Policy().CheckRead("features_path", data_ + "/a/b/c/f");
  ExpectCode(path.status(), absl::StatusCode::kNotFound,
             "directory \"" + data_ + "/a/b/c\" of features_path does not exist");
}

TEST_F(PathPolicyTest, CheckRead_RootRemovedAfterCreate_IsFailedPrecondition) {
  const std::string gone = base_ + "/gone";
  MakeDir(gone);
  auto policy = PathPolicy::Create({gone}, {out_});
  ASSERT_TRUE(policy.ok()) << policy.status();
  ASSERT_EQ(::rmdir(gone.c_str()), 0);
  auto path = policy->CheckRead("features_path", gone + "/sub/f");
  ExpectCode(path.status(), absl::StatusCode::kFailedPrecondition, "no longer exists");
}

TEST_F(PathPolicyTest, CheckRead_SymlinkInMiddleStayingInside_IsAccepted) {
  MakeSymlink(data_ + "/sub", data_ + "/alias");
  auto path = Policy().CheckRead("features_path", data_ + "/alias/y.bin");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, RealPathOf(data_ + "/sub/y.bin"));
}

TEST_F(PathPolicyTest, CheckRead_FinalSymlinkOutside_IsPermissionDenied) {
  MakeSymlink(outside_ + "/secret", data_ + "/link.bin");
  auto path = Policy().CheckRead("features_path", data_ + "/link.bin");
  ExpectCode(path.status(), absl::StatusCode::kPermissionDenied, "is a symbolic link");
}

TEST_F(PathPolicyTest, CheckRead_FinalSymlinkInside_IsPermissionDenied) {
  MakeSymlink(data_ + "/x.bin", data_ + "/link.bin");
  auto path = Policy().CheckRead("features_path", data_ + "/link.bin");
  ExpectCode(path.status(), absl::StatusCode::kPermissionDenied, "is a symbolic link");
}

TEST_F(PathPolicyTest, CheckRead_Directory_IsInvalidArgument) {
  auto path = Policy().CheckRead("features_path", data_ + "/sub");
  ExpectCode(path.status(), absl::StatusCode::kInvalidArgument,
             "is not a regular file (it is a directory)");
}

TEST_F(PathPolicyTest, CheckRead_RootItself_IsInvalidArgument) {
  auto path = Policy().CheckRead("features_path", data_ + "/");
  ExpectCode(path.status(), absl::StatusCode::kInvalidArgument, "names a root directory");
}

TEST_F(PathPolicyTest, CheckRead_Fifo_IsInvalidArgumentWithoutBlocking) {
  const std::string fifo = data_ + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  PathPolicy policy = Policy();
  auto result = std::async(std::launch::async,
                           [&] { return policy.CheckRead("features_path", fifo).status(); });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // Opening the other end releases a reader blocked in open(), so the test fails instead of
    // hanging.
    int fd = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
    ADD_FAILURE() << "CheckRead blocked on a FIFO";
    result.wait();
    if (fd >= 0) ::close(fd);
    return;
  }
  ExpectCode(result.get(), absl::StatusCode::kInvalidArgument,
             "is not a regular file (it is a FIFO)");
}

TEST_F(PathPolicyTest, CheckRead_MissingFile_IsNotFound) {
  auto path = Policy().CheckRead("features_path", data_ + "/missing.bin");
  ExpectCode(path.status(), absl::StatusCode::kNotFound,
             "features_path \"" + data_ + "/missing.bin\" does not exist");
}

TEST_F(PathPolicyTest, CheckRead_MissingDirectory_IsNotFoundNamingDirectory) {
  auto path = Policy().CheckRead("features_path", data_ + "/nodir/x.bin");
  ExpectCode(path.status(), absl::StatusCode::kNotFound,
             "directory \"" + data_ + "/nodir\" of features_path does not exist");
}

TEST_F(PathPolicyTest, CheckRead_ParentIsFile_IsInvalidArgument) {
  auto path = Policy().CheckRead("features_path", data_ + "/x.bin/y");
  ExpectCode(path.status(), absl::StatusCode::kInvalidArgument, "is not a directory");
}

TEST_F(PathPolicyTest, CheckRead_FileUnderOutputRoot_RefusedForDataAcceptedForDataOrOutput) {
  PathPolicy policy = Policy();
  auto data_only = policy.CheckRead("init_checkpoint", out_ + "/ckpt.bin", ReadScope::kData);
  ExpectCode(data_only.status(), absl::StatusCode::kPermissionDenied,
             "is outside the worker's data roots");
  auto resume = policy.CheckRead("resume_checkpoint", out_ + "/ckpt.bin", ReadScope::kDataOrOutput);
  ASSERT_TRUE(resume.ok()) << resume.status();
  EXPECT_EQ(*resume, RealPathOf(out_ + "/ckpt.bin"));
}

TEST_F(PathPolicyTest, CheckRead_DataOrOutputOutside_NamesBothRootLists) {
  auto path =
      Policy().CheckRead("resume_checkpoint", outside_ + "/secret", ReadScope::kDataOrOutput);
  ExpectCode(path.status(), absl::StatusCode::kPermissionDenied,
             "is outside the worker's data or output roots [" + RealPathOf(data_) + ", " +
                 RealPathOf(out_) + "]");
}

TEST_F(PathPolicyTest, CheckRead_MultipleRoots_AcceptsEachRefusesOthers) {
  const std::string data2 = base_ + "/data2";
  MakeDir(data2);
  WriteFile(data2 + "/w.bin", "w");
  auto policy = PathPolicy::Create({data_, data2}, {out_});
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_TRUE(policy->CheckRead("features_path", data_ + "/x.bin").ok());
  EXPECT_TRUE(policy->CheckRead("targets_path", data2 + "/w.bin").ok());
  auto outside = policy->CheckRead("features_path", outside_ + "/secret");
  ExpectCode(outside.status(), absl::StatusCode::kPermissionDenied,
             "data roots [" + RealPathOf(data_) + ", " + RealPathOf(data2) + "]");
}

TEST_F(PathPolicyTest, CheckRead_HugePath_MessageIsBounded) {
  auto path = Policy().CheckRead("features_path", "/" + std::string(100000, 'a'));
  EXPECT_EQ(path.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(path.status().message().size(), 400u);
}

// --- CheckWrite ---

TEST_F(PathPolicyTest, CheckWrite_FreshFile_ReturnsResolvedPath) {
  auto path = Policy().CheckWrite("output_checkpoint", out_ + "/new.bin", /*overwrite=*/false);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, RealPathOf(out_) + "/new.bin");
  EXPECT_FALSE(Exists(out_ + "/new.bin"));  // Checking creates nothing.
}

TEST_F(PathPolicyTest, CheckWrite_ExistingFile_AlreadyExistsUnlessOverwrite) {
  PathPolicy policy = Policy();
  auto refused = policy.CheckWrite("output_checkpoint", out_ + "/ckpt.bin", /*overwrite=*/false);
  ExpectCode(refused.status(), absl::StatusCode::kAlreadyExists,
             "output_checkpoint \"" + out_ +
                 "/ckpt.bin\" already exists; set overwrite_output: true to replace it");
  auto allowed = policy.CheckWrite("output_checkpoint", out_ + "/ckpt.bin", /*overwrite=*/true);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ(*allowed, RealPathOf(out_ + "/ckpt.bin"));
}

TEST_F(PathPolicyTest, CheckWrite_ExistingDirectory_IsInvalidArgumentEvenWithOverwrite) {
  MakeDir(out_ + "/d");
  auto path = Policy().CheckWrite("output_checkpoint", out_ + "/d", /*overwrite=*/true);
  ExpectCode(path.status(), absl::StatusCode::kInvalidArgument,
             "exists and is not a regular file (it is a directory)");
}

TEST_F(PathPolicyTest, CheckWrite_ExistingFifo_IsInvalidArgumentEvenWithOverwrite) {
  ASSERT_EQ(::mkfifo((out_ + "/pipe").c_str(), 0644), 0);
  auto path = Policy().CheckWrite("output_checkpoint", out_ + "/pipe", /*overwrite=*/true);
  ExpectCode(path.status(), absl::StatusCode::kInvalidArgument, "(it is a FIFO)");
}

TEST_F(PathPolicyTest, CheckWrite_UnderDataRoot_IsPermissionDenied) {
  auto path = Policy().CheckWrite("output_checkpoint", data_ + "/x.bin", /*overwrite=*/true);
  ExpectCode(path.status(), absl::StatusCode::kPermissionDenied,
             "is outside the worker's output roots [" + RealPathOf(out_) + "]");
}

TEST_F(PathPolicyTest, CheckWrite_OutsideRoots_SameAnswerWhetherOrNotItExists) {
  PathPolicy policy = Policy();
  auto existing = policy.CheckWrite("output_checkpoint", outside_ + "/secret", false).status();
  auto missing = policy.CheckWrite("output_checkpoint", outside_ + "/missing", false).status();
  EXPECT_EQ(existing.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(existing.code(), missing.code());
  EXPECT_EQ(absl::StrReplaceAll(existing.message(), {{"secret", "X"}}),
            absl::StrReplaceAll(missing.message(), {{"missing", "X"}}));
}

TEST_F(PathPolicyTest, CheckWrite_DotDot_IsInvalidArgument) {
  auto path = Policy().CheckWrite("output_checkpoint", out_ + "/../outside/x", true);
  ExpectCode(path.status(), absl::StatusCode::kInvalidArgument,
             "output_checkpoint must not contain '..' components");
}

TEST_F(PathPolicyTest, CheckWrite_FinalSymlink_IsPermissionDeniedEvenWithOverwrite) {
  // A dangling link: writing through it would create a file outside the roots.
  MakeSymlink(outside_ + "/planted", out_ + "/link.bin");
  auto path = Policy().CheckWrite("output_checkpoint", out_ + "/link.bin", /*overwrite=*/true);
  ExpectCode(path.status(), absl::StatusCode::kPermissionDenied, "is a symbolic link");
}

TEST_F(PathPolicyTest, CheckWrite_SymlinkInMiddleEscapes_IsPermissionDenied) {
  MakeSymlink(outside_, out_ + "/escape");
  auto path = Policy().CheckWrite("output_checkpoint", out_ + "/escape/new.bin", true);
  ExpectCode(path.status(), absl::StatusCode::kPermissionDenied,
             "resolves outside the worker's output roots through a symbolic link");
}

TEST_F(PathPolicyTest, CheckWrite_MissingDirectory_IsNotFound) {
  auto path = Policy().CheckWrite("output_checkpoint", out_ + "/nodir/new.bin", false);
  ExpectCode(path.status(), absl::StatusCode::kNotFound,
             "directory \"" + out_ + "/nodir\" of output_checkpoint does not exist");
}

// --- CheckOutputDirectory ---

TEST_F(PathPolicyTest, CheckOutputDirectory_Missing_CreatesItInsideRoot) {
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", out_ + "/run1/step//ckpts/");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, RealPathOf(out_) + "/run1/step/ckpts");
  EXPECT_TRUE(IsDirectory(out_ + "/run1/step/ckpts"));
}

TEST_F(PathPolicyTest, CheckOutputDirectory_Existing_ReturnsIt) {
  MakeDir(out_ + "/run");
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", out_ + "/run");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, RealPathOf(out_ + "/run"));
}

TEST_F(PathPolicyTest, CheckOutputDirectory_RootItself_IsAccepted) {
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", out_);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, RealPathOf(out_));
}

TEST_F(PathPolicyTest, CheckOutputDirectory_Outside_IsPermissionDeniedAndCreatesNothing) {
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", outside_ + "/new/deeper");
  ExpectCode(dir.status(), absl::StatusCode::kPermissionDenied,
             "checkpoint_dir \"" + outside_ +
                 "/new/deeper\" is outside the worker's output roots [" + RealPathOf(out_) + "]");
  EXPECT_FALSE(Exists(outside_ + "/new"));
}

TEST_F(PathPolicyTest, CheckOutputDirectory_UnderDataRoot_IsPermissionDenied) {
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", data_ + "/ckpts");
  ExpectCode(dir.status(), absl::StatusCode::kPermissionDenied, "output roots");
  EXPECT_FALSE(Exists(data_ + "/ckpts"));
}

TEST_F(PathPolicyTest, CheckOutputDirectory_SymlinkEscape_IsPermissionDeniedAndCreatesNothing) {
  MakeSymlink(outside_, out_ + "/escape");
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", out_ + "/escape/new/deeper");
  ExpectCode(dir.status(), absl::StatusCode::kPermissionDenied,
             "resolves outside the worker's output roots through a symbolic link");
  EXPECT_FALSE(Exists(outside_ + "/new"));
}

TEST_F(PathPolicyTest, CheckOutputDirectory_FinalSymlinkEscape_IsPermissionDenied) {
  MakeSymlink(outside_, out_ + "/escape");
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", out_ + "/escape");
  ExpectCode(dir.status(), absl::StatusCode::kPermissionDenied, "through a symbolic link");
}

TEST_F(PathPolicyTest, CheckOutputDirectory_DanglingSymlink_IsPermissionDeniedAndCreatesNothing) {
  MakeSymlink(outside_ + "/planted", out_ + "/dangling");
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", out_ + "/dangling/x");
  ExpectCode(dir.status(), absl::StatusCode::kPermissionDenied, "through a symbolic link");
  EXPECT_FALSE(Exists(outside_ + "/planted"));
}

TEST_F(PathPolicyTest, CheckOutputDirectory_SymlinkInsideRoot_IsFollowed) {
  MakeDir(out_ + "/real");
  MakeSymlink(out_ + "/real", out_ + "/alias");
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", out_ + "/alias/new");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, RealPathOf(out_) + "/real/new");
  EXPECT_TRUE(IsDirectory(out_ + "/real/new"));
}

TEST_F(PathPolicyTest, CheckOutputDirectory_ComponentIsFile_IsFailedPreconditionNamingIt) {
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", out_ + "/ckpt.bin/sub");
  ExpectCode(dir.status(), absl::StatusCode::kFailedPrecondition,
             "directory \"" + RealPathOf(out_) +
                 "/ckpt.bin\" of checkpoint_dir exists and is not a directory (it is a regular "
                 "file)");
}

TEST_F(PathPolicyTest, CheckOutputDirectory_ItselfAFile_IsFailedPrecondition) {
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", out_ + "/ckpt.bin");
  ExpectCode(dir.status(), absl::StatusCode::kFailedPrecondition,
             "ckpt.bin\" of checkpoint_dir exists and is not a directory");
}

TEST_F(PathPolicyTest, CheckOutputDirectory_SymlinkToFileInsideRoot_IsFailedPrecondition) {
  MakeSymlink(out_ + "/ckpt.bin", out_ + "/to_file");
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", out_ + "/to_file/run");
  ExpectCode(dir.status(), absl::StatusCode::kFailedPrecondition,
             "is a symbolic link to something that is not a directory");
}

TEST_F(PathPolicyTest, CheckOutputDirectory_RootRemoved_IsFailedPreconditionAndCreatesNothing) {
  PathPolicy policy = Policy();
  ASSERT_EQ(::unlink((out_ + "/ckpt.bin").c_str()), 0);
  ASSERT_EQ(::rmdir(out_.c_str()), 0);
  auto dir = policy.CheckOutputDirectory("checkpoint_dir", out_ + "/run/ckpts");
  ExpectCode(dir.status(), absl::StatusCode::kFailedPrecondition,
             "checkpoint_dir \"" + out_ + "/run/ckpts\": the worker's output root");
  EXPECT_TRUE(Contains(dir.status().message(), "no longer exists")) << dir.status();
  EXPECT_FALSE(Exists(out_)) << "a root is never created";
}

// Runs `check` in a child process without the privilege to write where only root may (root
// ignores file modes): it drops to uid/gid 65534 when run as root. Returns the status it got,
// or nullopt when privileges cannot be dropped here.
std::optional<absl::Status> RunUnprivileged(const std::function<absl::Status()>& check) {
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      out = "nopriv";
    } else {
      absl::Status status = check();
      out = std::to_string(static_cast<int>(status.code())) + "\n" + Str(status.message());
    }
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buffer, sizeof(buffer))) > 0) out.append(buffer, n);
  ::close(fds[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  const size_t newline = out.find('\n');
  if (out == "nopriv" || newline == std::string::npos) return std::nullopt;
  return absl::Status(static_cast<absl::StatusCode>(std::stoi(out.substr(0, newline))),
                      out.substr(newline + 1));
}

TEST(PathPolicyPermissions, CheckOutputDirectory_NotPermitted_IsPermissionDeniedSayingWhy) {
  // A tree the unprivileged child can walk (under /tmp, mode 0755) but not write into.
  std::string base = "/tmp/path_policy_perm_XXXXXX";
  ASSERT_NE(::mkdtemp(base.data()), nullptr);
  ASSERT_EQ(::chmod(base.c_str(), 0755), 0);
  const std::string data = base + "/data";
  const std::string out = base + "/out";
  MakeDir(data);
  MakeDir(out);
  MakeDir(out + "/locked");
  ASSERT_EQ(::chmod((out + "/locked").c_str(), 0555), 0);
  auto policy = PathPolicy::Create({data}, {out});
  ASSERT_TRUE(policy.ok()) << policy.status();
  std::optional<absl::Status> status = RunUnprivileged([&] {
    return policy->CheckOutputDirectory("checkpoint_dir", out + "/locked/run/ckpts").status();
  });
  const bool created = Exists(out + "/locked/run");
  ::chmod((out + "/locked").c_str(), 0755);
  ::rmdir((out + "/locked/run/ckpts").c_str());
  ::rmdir((out + "/locked/run").c_str());
  ::rmdir((out + "/locked").c_str());
  ::rmdir(out.c_str());
  ::rmdir(data.c_str());
  ::rmdir(base.c_str());
  if (!status.has_value()) {
    SKIP_OR_FAIL_UNDER_CI("running as root, but setgid/setuid(65534) failed: cannot drop "
                          "privileges here to test a directory this worker may not write");
  }
  ExpectCode(*status, absl::StatusCode::kPermissionDenied,
             "directory \"" + RealPathOf("/tmp") + base.substr(4) +
                 "/out/locked/run\" of checkpoint_dir does not exist and this worker (uid ");
  EXPECT_TRUE(Contains(status->message(), "may not create it: no write permission in \"" +
                                              RealPathOf("/tmp") + base.substr(4) +
                                              "/out/locked\""))
      << *status;
  EXPECT_FALSE(created);
}

TEST_F(PathPolicyTest, CheckOutputDirectory_DotDot_IsInvalidArgument) {
  auto dir = Policy().CheckOutputDirectory("checkpoint_dir", out_ + "/../outside/new");
  ExpectCode(dir.status(), absl::StatusCode::kInvalidArgument,
             "checkpoint_dir must not contain '..' components");
  EXPECT_FALSE(Exists(outside_ + "/new"));
}

TEST_F(PathPolicyTest, CheckOutputDirectory_RootThroughSymlink_CreatesUnderTarget) {
  MakeSymlink(out_, base_ + "/out_link");
  auto policy = PathPolicy::Create({data_}, {base_ + "/out_link"});
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto dir = policy->CheckOutputDirectory("checkpoint_dir", base_ + "/out_link/a/b");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, RealPathOf(out_) + "/a/b");
  EXPECT_TRUE(IsDirectory(out_ + "/a/b"));
}

TEST_F(PathPolicyTest, CheckOutputDirectory_MultipleRoots_CreatesInTheMatchingOne) {
  const std::string out2 = base_ + "/out2";
  MakeDir(out2);
  auto policy = PathPolicy::Create({data_}, {out_, out2});
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto dir = policy->CheckOutputDirectory("checkpoint_dir", out2 + "/run");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, RealPathOf(out2) + "/run");
  EXPECT_FALSE(Exists(out_ + "/run"));
}

}  // namespace
}  // namespace mptrain
