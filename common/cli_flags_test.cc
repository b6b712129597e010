#include "common/cli_flags.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", getpid(), "_", name);
  std::ofstream(path) << text;
  return path;
}

// A worker's roots given in a flag file count (absl kept only the file's last value of a
// flag, and the roots were read from the command line alone: the worker fell back to its
// current directory as both roots).
TEST(CliFlags, RootsInAFlagFile_AllCount_NestedFilesToo) {
  const std::string inner = WriteFile("inner.flags", "--output-root=/out\n");
  const std::string outer = WriteFile(
      "outer.flags", absl::StrCat("# the worker's roots\n--data_root=/a\n\n  -data_root=/b  \n",
                                  "--flagfile=", inner, "\n"));
  ExpandedArguments expanded = ExpandFlagFiles(
      {"worker", "--device=cpu", "--flagfile", outer, "--data_root=/c,/d", "--", "--data_root=x"});
  ASSERT_EQ(expanded.error, "");
  EXPECT_EQ(RepeatedFlagValues(expanded.args, "data_root"),
            (std::vector<std::string>{"/a", "/b", "/c", "/d"}));
  EXPECT_EQ(RepeatedFlagValues(expanded.args, "output_root"), std::vector<std::string>{"/out"});
  EXPECT_EQ(expanded.args.front(), "worker");
  EXPECT_EQ(expanded.args.back(), "--data_root=x") << "arguments after -- are left alone";
}

// absl's one-dash spellings count too: `-flagfile=F` was left for absl to expand, and the
// roots in F were lost again.
TEST(CliFlags, OneDashSpellings_AreExpandedAndCounted) {
  const std::string file = WriteFile("one_dash.flags", "-data_root=/a\n");
  ExpandedArguments expanded =
      ExpandFlagFiles({"worker", "-flagfile=" + file, "-data-root", "/b", "-output_root=/o"});
  ASSERT_EQ(expanded.error, "");
  EXPECT_EQ(RepeatedFlagValues(expanded.args, "data_root"),
            (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(RepeatedFlagValues(expanded.args, "output_root"), std::vector<std::string>{"/o"});
}

TEST(CliFlags, BadFlagFiles_AreRefusedNamingTheFileAndLine) {
  EXPECT_NE(ExpandFlagFiles({"worker", "--flagfile=/nonexistent/flags"}).error.find(
                "--flagfile /nonexistent/flags: not a readable regular file"),
            std::string::npos);
  const std::string prose = WriteFile("prose.flags", "--slots=2\ndata_root /a\n");
  EXPECT_NE(ExpandFlagFiles({"worker", "--flagfile=" + prose}).error.find("line 2: not a flag"),
            std::string::npos);
  // Neither a line nor the size of a file the user may not be able to read is echoed.
  const std::string secret = WriteFile("secret.flags", "root:SECRET-HASH:20000:0:99999\n");
  const std::string line_error = ExpandFlagFiles({"worker", "--flagfile=" + secret}).error;
  EXPECT_NE(line_error.find("line 1: not a flag"), std::string::npos) << line_error;
  EXPECT_EQ(line_error.find("SECRET"), std::string::npos) << line_error;
  const std::string big = WriteFile("big.flags", std::string(3'333'333, '#'));
  const std::string size_error = ExpandFlagFiles({"worker", "--flagfile=" + big}).error;
  EXPECT_NE(size_error.find("bytes a flag file may hold"), std::string::npos) << size_error;
  EXPECT_EQ(size_error.find("3333333"), std::string::npos) << size_error;
  const std::string looping = WriteFile("loop.flags", "");
  std::ofstream(looping) << "--flagfile=" << looping << "\n";
  EXPECT_NE(ExpandFlagFiles({"worker", "--flagfile=" + looping}).error.find("nested more than"),
            std::string::npos);
  // `--` in a file would turn every later flag of the command line into a positional one.
  const std::string terminator = WriteFile("terminator.flags", "--slots=2\n--\n");
  EXPECT_NE(ExpandFlagFiles({"worker", "--flagfile=" + terminator, "--coordinator=c:1"})
                .error.find("may not hold `--`"),
            std::string::npos);
  const std::string bare = WriteFile("bare.flags", "--flagfile\n--slots=1\n");
  EXPECT_NE(ExpandFlagFiles({"worker", "--flagfile=" + bare}).error.find("on the same line"),
            std::string::npos);
  // A file naming itself twice doubles at every level: bounded.
  const std::string doubling = WriteFile("doubling.flags", "");
  std::ofstream(doubling) << "--slots=1\n--flagfile=" << doubling << "," << doubling << "\n";
  const std::string error = ExpandFlagFiles({"worker", "--flagfile=" + doubling}).error;
  EXPECT_TRUE(error.find("more than 10000 arguments") != std::string::npos ||
              error.find("nested more than") != std::string::npos)
      << error;
}

TEST(CheckFlags, UnknownFlagsAndBadValues_AreNamed_ValuesNeverEchoed) {
  EXPECT_EQ(CheckFlags({"prog", "--nosuch_flag=1"}), "unknown flag --nosuch_flag");
  // A name that is not a flag's (a flag file's line, say) is not repeated.
  EXPECT_EQ(CheckFlags({"prog", "--SECRET:HASH=1"}), "unknown flag a flag (name not shown)");
  EXPECT_EQ(CheckFlags({"prog", "--flagfile"}), "--flagfile needs a value");
  EXPECT_EQ(CheckFlags({"prog", "positional", "--", "--anything"}), "");
}

TEST(FlagListing, ListsOurFlags_NotAbsls) {
  const std::string listing = FlagListing();
  EXPECT_EQ(listing.find("--flagfile"), std::string::npos) << listing;
  EXPECT_EQ(listing.find("--helpfull"), std::string::npos) << listing;
}

TEST(VersionLine, NamesTheProgramAndTheBuildsVersion) {
  const std::string line = VersionLine("trainctl");
  EXPECT_EQ(line.rfind("trainctl ", 0), 0u) << line;
  EXPECT_EQ(line.find("NDEBUG not #defined"), std::string::npos) << line;
  EXPECT_NE(line.find(" build"), std::string::npos) << line;
}

}  // namespace
}  // namespace mptrain
