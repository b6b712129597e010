#include "worker/process_title.h"

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

int g_argc = 0;
char** g_argv = nullptr;

std::string Cmdline() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

// The run's own argv: this binary was started with room to spare (see main below).
TEST(ProcessTitle, ReplacesWhatProcCmdlineShows) {
  ASSERT_TRUE(SetProcessTitle(g_argc, g_argv, {"worker", "--run_rank=/w0/job-0001-rank0-1.pb"}));
  const std::string shown = Cmdline();
  EXPECT_EQ(shown.substr(0, shown.find_last_not_of('\0') + 1),
            std::string("worker\0--run_rank=/w0/job-0001-rank0-1.pb", 41));
  EXPECT_EQ(shown.find("--room"), std::string::npos) << "the old arguments are gone";
}

TEST(ProcessTitle, ATitleTooLong_IsTruncatedAndSaidSo) {
  EXPECT_FALSE(SetProcessTitle(g_argc, g_argv, {std::string(1 << 16, 'x')}));
  const std::string shown = Cmdline();
  EXPECT_GT(shown.size(), 10u);
  EXPECT_EQ(shown.find_first_not_of('x'), shown.size() - 1) << "x...x then one NUL";
}

}  // namespace
}  // namespace mptrain

int main(int argc, char** argv) {
  // Re-run with a long argument (room for the titles) unless this is that run.
  if (argc < 2 || std::string(argv[argc - 1]).rfind("--room=", 0) != 0) {
    std::string self = "/proc/self/exe";
    std::string room = "--room=" + std::string(200, 'r');
    char* args[] = {argv[0], room.data(), nullptr};
    execv(self.c_str(), args);
    return 127;
  }
  ::testing::InitGoogleTest(&argc, argv);
  mptrain::g_argc = argc;
  mptrain::g_argv = argv;
  return RUN_ALL_TESTS();
}
