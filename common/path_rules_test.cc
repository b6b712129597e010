#include "common/path_rules.h"

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

bool Contains(absl::string_view haystack, std::string_view needle) {
  return std::string_view(haystack.data(), haystack.size()).find(needle) != std::string_view::npos;
}

void ExpectInvalid(std::string_view path, std::string_view wanted) {
  absl::Status status = CheckPathSyntax("output_checkpoint", path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(Contains(status.message(), "output_checkpoint")) << status;
  EXPECT_TRUE(Contains(status.message(), wanted))
      << "got: " << status.message() << "\nwanted: " << wanted;
}

TEST(CheckPathSyntax, AbsolutePaths_AreAccepted) {
  for (const char* path : {"/", "/a", "/a/b.bin", "/a//b", "/a/b/", "//a///b//", "/a/.hidden",
                           "/a/..b", "/a/b..", "/a/.../b"}) {
    EXPECT_TRUE(CheckPathSyntax("features_path", path).ok()) << path;
  }
}

TEST(CheckPathSyntax, Empty_IsRefusedNamingField) {
  ExpectInvalid("", "output_checkpoint must not be empty");
}

TEST(CheckPathSyntax, Relative_IsRefused) {
  ExpectInvalid("a/b", R"(must be an absolute path (starting with '/'), got "a/b")");
  ExpectInvalid("./a", "must be an absolute path");
  ExpectInvalid("../etc/shadow", "must be an absolute path");
  ExpectInvalid("~/x", "must be an absolute path");
}

TEST(CheckPathSyntax, DotDotComponent_IsRefused) {
  ExpectInvalid("/a/../b", R"(output_checkpoint must not contain '..' components, got "/a/../b")");
  ExpectInvalid("/..", "'..' components");
  ExpectInvalid("/a/..", "'..' components");
  ExpectInvalid("/a/../", "'..' components");
  ExpectInvalid("/a//..//b", "'..' components");
}

TEST(CheckPathSyntax, DotComponent_IsRefused) {
  ExpectInvalid("/a/./b", R"(must not contain '.' components, got "/a/./b")");
  ExpectInvalid("/.", "'.' components");
  ExpectInvalid("/a/.", "'.' components");
}

TEST(CheckPathSyntax, NulByte_IsRefused) {
  const std::string path("/data/x\0/../../etc/shadow", 25);
  ExpectInvalid(path, "must not contain a NUL byte");
  // The NUL is escaped, not copied into the message.
  EXPECT_FALSE(Contains(CheckPathSyntax("f", path).message(), std::string_view("\0", 1)));
}

TEST(CheckPathSyntax, LengthLimit_IsInclusive) {
  std::string path = "/" + std::string(kMaxPathBytes - 1, 'a');
  EXPECT_TRUE(CheckPathSyntax("f", path).ok());
  path.push_back('a');
  ExpectInvalid(path, "must be at most 4096 bytes, got 4097 bytes");
}

TEST(CheckPathSyntax, HugePath_EchoIsTruncated) {
  const std::string path = "/" + std::string(1 << 20, 'a');
  absl::Status status = CheckPathSyntax("features_path", path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(status.message().size(), 400u) << status.message().size();
  EXPECT_TRUE(Contains(status.message(), "...\"")) << status;
}

TEST(CheckPathSyntax, LongRelativePath_EchoIsTruncated) {
  const std::string path(kMaxPathBytes, 'a');
  absl::Status status = CheckPathSyntax("features_path", path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status.message(), "\"" + std::string(kMaxEchoedPathChars, 'a') + "...\""))
      << status;
  EXPECT_FALSE(Contains(status.message(), std::string(kMaxEchoedPathChars + 1, 'a')));
}

// The file the issue's tester created: "ü\nx\u202e.safetensors".
TEST(CheckPathSyntax, ControlAndBidirectionalCharacters_AreRefused) {
  ExpectInvalid("/out/\xc3\xbc\nx\xe2\x80\xae.safetensors",
                "must not contain U+000A (a control character), at byte 7 of "
                "\"/out/\\xc3\\xbc\\nx\\xe2\\x80\\xae.safetensors\"");
  ExpectInvalid("/out/x\xe2\x80\xae.safetensors",
                "must not contain U+202E (a bidirectional formatting character), at byte 6");
  ExpectInvalid("/out/a\tb", "U+0009 (a control character)");
  ExpectInvalid("/out/a\x1b[31mb", "U+001B (a control character)");
  ExpectInvalid("/out/a\x7f", "U+007F (a control character)");
  ExpectInvalid("/out/a\xc2\x85", "U+0085 (a control character)");
  ExpectInvalid("/out/a\xe2\x80\xa8", "U+2028 (a line or paragraph separator)");
  for (const char* bidi : {"\xe2\x80\xaa", "\xe2\x80\xab", "\xe2\x80\xac", "\xe2\x80\xad",
                           "\xe2\x81\xa6", "\xe2\x81\xa7", "\xe2\x81\xa8", "\xe2\x81\xa9",
                           "\xe2\x80\x8e", "\xe2\x80\x8f", "\xd8\x9c"}) {
    ExpectInvalid(std::string("/out/a") + bidi, "(a bidirectional formatting character)");
  }
  for (const char* invisible : {"\xe2\x80\x8b", "\xe2\x80\x8d", "\xe2\x81\xa0", "\xef\xbb\xbf",
                                "\xc2\xad", "\xf3\xa0\x80\x81"}) {
    ExpectInvalid(std::string("/out/a") + invisible, "(an invisible formatting character)");
  }
}

TEST(CheckPathSyntax, InvalidUtf8_IsRefused) {
  ExpectInvalid("/out/\xff", "must be valid UTF-8, got byte 5 of");
  ExpectInvalid("/out/\xc3", "must be valid UTF-8");            // Truncated sequence.
  ExpectInvalid("/out/\xc0\xaf", "must be valid UTF-8");        // Overlong '/'.
  ExpectInvalid("/out/\xe0\x80\xaf", "must be valid UTF-8");    // Overlong '/'.
  ExpectInvalid("/out/\xed\xa0\x80", "must be valid UTF-8");    // A surrogate.
  ExpectInvalid("/out/\xf4\x90\x80\x80", "must be valid UTF-8");  // Above U+10FFFF.
  ExpectInvalid("/out/\xe2\x80x", "must be valid UTF-8");       // A bad continuation.
}

TEST(CheckPathSyntax, PrintableUnicode_IsAccepted) {
  for (const char* path : {"/data/\xc3\xbc.npy", "/data/\xe6\x97\xa5\xe6\x9c\xac/x.npy",
                           "/data/\xf0\x9f\x98\x80.npy", "/data/a b.npy", "/data/\xc2\xa0x"}) {
    EXPECT_TRUE(CheckPathSyntax("features_path", path).ok()) << path;
  }
}

TEST(CheckNameSyntax, OptionAndDirectoryLookalikes_AreRefused) {
  for (const char* name : {"-rf", ".", "..", "-", ".hidden", "_x"}) {
    const absl::Status status = CheckNameSyntax("name", name);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_TRUE(Contains(status.message(), "name must start with a letter or a digit")) << status;
  }
  for (const char* name : {"", "a", "run-1", "Run_2.b", "0", "a..b", "a-"}) {
    EXPECT_TRUE(CheckNameSyntax("name", name).ok()) << name;
  }
}

TEST(CheckNameSyntax, TheCharacterRuleAndTheSetAndTheLength_Apply) {
  EXPECT_TRUE(Contains(CheckNameSyntax("name", "a\nb").message(),
                       "name must not contain U+000A (a control character)"));
  EXPECT_TRUE(Contains(CheckNameSyntax("name", "a\xe2\x80\xae" "b").message(), "U+202E"));
  EXPECT_TRUE(Contains(CheckNameSyntax("name", "a\xff").message(), "must be valid UTF-8"));
  EXPECT_TRUE(Contains(CheckNameSyntax("name", "a b").message(),
                       "name must be characters of [A-Za-z0-9._-], got \"a b\""));
  EXPECT_TRUE(Contains(CheckNameSyntax("name", "\xc3\xbc").message(), "[A-Za-z0-9._-]"));
  EXPECT_TRUE(CheckNameSyntax("name", std::string(kMaxNameBytes, 'a')).ok());
  EXPECT_TRUE(Contains(CheckNameSyntax("name", std::string(kMaxNameBytes + 1, 'a')).message(),
                       "name must be at most 128 bytes, got 129 bytes"));
}

TEST(QuotePathForMessage, ShortPath_IsQuotedUnchanged) {
  EXPECT_EQ(QuotePathForMessage("/a/b"), "\"/a/b\"");
}

TEST(QuotePathForMessage, ControlCharacters_AreEscaped) {
  EXPECT_EQ(QuotePathForMessage("/a\nFAKE LOG LINE\"x"), R"("/a\nFAKE LOG LINE\"x")");
}

TEST(QuotePathForMessage, ExactlyLimit_IsNotTruncated) {
  const std::string path(kMaxEchoedPathChars, 'b');
  EXPECT_EQ(QuotePathForMessage(path), "\"" + path + "\"");
}

TEST(NormalizePath, CollapsesSlashesAndDropsTrailing) {
  EXPECT_EQ(NormalizePath("/"), "/");
  EXPECT_EQ(NormalizePath("//"), "/");
  EXPECT_EQ(NormalizePath("///"), "/");
  EXPECT_EQ(NormalizePath("/a"), "/a");
  EXPECT_EQ(NormalizePath("/a/"), "/a");
  EXPECT_EQ(NormalizePath("//a//b///"), "/a/b");
  EXPECT_EQ(NormalizePath("/a/b/c.bin"), "/a/b/c.bin");
}

TEST(IsUnderRoot, ComponentBoundary_IsRespected) {
  EXPECT_TRUE(IsUnderRoot("/data/x", "/data"));
  EXPECT_TRUE(IsUnderRoot("/data/x", "/data/"));
  EXPECT_TRUE(IsUnderRoot("/data/x", "/"));
  EXPECT_TRUE(IsUnderRoot("/data/x/y/z", "/data/x"));
  EXPECT_FALSE(IsUnderRoot("/data/x", "/dat"));
  EXPECT_FALSE(IsUnderRoot("/database/x", "/data"));
  EXPECT_FALSE(IsUnderRoot("/dat", "/data"));
  EXPECT_FALSE(IsUnderRoot("/etc/shadow", "/data"));
}

TEST(IsUnderRoot, PathEqualToRoot_IsUnder) {
  EXPECT_TRUE(IsUnderRoot("/data", "/data"));
  EXPECT_TRUE(IsUnderRoot("/data/", "/data"));
  EXPECT_TRUE(IsUnderRoot("/data", "/data//"));
  EXPECT_TRUE(IsUnderRoot("/", "/"));
}

TEST(IsUnderRoot, UnnormalizedInputs_AreNormalizedFirst) {
  EXPECT_TRUE(IsUnderRoot("//data///x", "/data"));
  EXPECT_TRUE(IsUnderRoot("/data/x", "//data//"));
  EXPECT_FALSE(IsUnderRoot("//dat//x", "/data"));
}

TEST(IsUnderRoot, InvalidInputs_FailClosed) {
  EXPECT_FALSE(IsUnderRoot("/data/../etc/shadow", "/data"));
  EXPECT_FALSE(IsUnderRoot("/data/./x", "/data"));
  EXPECT_FALSE(IsUnderRoot("data/x", "data"));
  EXPECT_FALSE(IsUnderRoot("/data/x", "data"));
  EXPECT_FALSE(IsUnderRoot("", "/"));
  EXPECT_FALSE(IsUnderRoot("/data/x", ""));
  EXPECT_FALSE(IsUnderRoot(std::string("/data/x\0y", 9), "/data"));
  EXPECT_FALSE(IsUnderRoot("/data/x", "/data/.."));
}

TEST(IsUnderAnyRoot, MultipleRoots_AnyMatches) {
  const std::vector<std::string> roots = {"/srv/data", "/mnt/shared/"};
  EXPECT_TRUE(IsUnderAnyRoot("/srv/data/a.bin", roots));
  EXPECT_TRUE(IsUnderAnyRoot("/mnt/shared/b/c.bin", roots));
  EXPECT_FALSE(IsUnderAnyRoot("/srv/database", roots));
  EXPECT_FALSE(IsUnderAnyRoot("/mnt/other", roots));
}

TEST(IsUnderAnyRoot, NoRoots_IsFalse) { EXPECT_FALSE(IsUnderAnyRoot("/a", {})); }

TEST(DescribeRoots, ListsRootsInBrackets) {
  EXPECT_EQ(DescribeRoots({"/a", "/b"}), "[/a, /b]");
  EXPECT_EQ(DescribeRoots({"/srv/data"}), "[/srv/data]");
  EXPECT_EQ(DescribeRoots({}), "[]");
}

}  // namespace
}  // namespace mptrain
