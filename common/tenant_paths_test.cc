#include "common/tenant_paths.h"

#include "gtest/gtest.h"

namespace mptrain {
namespace {

const std::vector<std::string> kRoots = {"/srv/out", "/scratch"};

TEST(TenantPaths, AUserWritesOnlyInItsOwnPartOfEachRoot) {
  const Tenancy alice{"alice", false};
  EXPECT_TRUE(MayWrite("/srv/out/alice/run1/final.safetensors", kRoots, alice));
  EXPECT_TRUE(MayWrite("/scratch/alice/x", kRoots, alice));
  EXPECT_FALSE(MayWrite("/srv/out/bob/run1/final.safetensors", kRoots, alice));
  EXPECT_FALSE(MayWrite("/srv/out/final.safetensors", kRoots, alice)) << "the shared level";
  EXPECT_FALSE(MayWrite("/srv/out/alice2/x", kRoots, alice)) << "a prefix is not a part";
  EXPECT_FALSE(MayWrite("/srv/out/alice/../bob/x", kRoots, alice)) << "fails closed on '..'";
}

TEST(TenantPaths, AnAdminWritesAnywhereUnderTheRoots) {
  const Tenancy admin{"root-ops", true};
  EXPECT_TRUE(MayWrite("/srv/out/final.safetensors", kRoots, admin));
  EXPECT_TRUE(MayWrite("/srv/out/bob/x", kRoots, admin));
  EXPECT_FALSE(MayWrite("/etc/passwd", kRoots, admin));
}

TEST(TenantPaths, PartDirectoryOf_IsTheFirstComponentBelowTheRoot) {
  EXPECT_EQ(PartDirectoryOf("/srv/out/bob/step-00000200.safetensors", "/srv/out"), "bob");
  EXPECT_EQ(PartDirectoryOf("/srv/out//bob/run/x", "/srv/out/"), "bob");
  EXPECT_EQ(PartDirectoryOf("/srv/out/loose.npy", "/srv/out"), "") << "directly in the root";
  EXPECT_EQ(PartDirectoryOf("/srv/out", "/srv/out"), "");
  EXPECT_EQ(PartDirectoryOf("/srv/data/x/y", "/srv/out"), "") << "not under it";
  EXPECT_EQ(PartDirectoryOf("/a/b", "/"), "a");
}

TEST(TenantPaths, PrincipalsThatCannotNameADirectoryOwnNoPart) {
  for (const char* name : {"", ".", "..", "a/b", "x y", "é"}) {
    EXPECT_FALSE(CheckPrincipalPathName("owner", name).ok()) << name;
    const Tenancy odd{name, false};
    EXPECT_FALSE(MayWrite("/srv/out/x", kRoots, odd)) << name;
    EXPECT_FALSE(MayWrite(std::string("/srv/out/") + name + "/x", kRoots, odd)) << name;
  }
  EXPECT_TRUE(CheckPrincipalPathName("owner", "alice@corp.example").ok());
  EXPECT_TRUE(CheckPrincipalPathName("owner", "...").ok()) << "only . and .. are special";
}

}  // namespace
}  // namespace mptrain
