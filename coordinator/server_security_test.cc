#include "coordinator/server_security.h"

#include <fstream>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

std::string TempFile(const std::string& name, const std::string& content) {
  const char* dir = getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << content;
  return path;
}

TEST(IsLoopbackListenAddress, Forms) {
  EXPECT_TRUE(IsLoopbackListenAddress("127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackListenAddress("127.3.2.1:0"));
  EXPECT_TRUE(IsLoopbackListenAddress("localhost:1"));
  EXPECT_TRUE(IsLoopbackListenAddress("[::1]:50051"));
  EXPECT_FALSE(IsLoopbackListenAddress("0.0.0.0:50051"));
  EXPECT_FALSE(IsLoopbackListenAddress("[::]:50051"));
  EXPECT_FALSE(IsLoopbackListenAddress("10.0.0.5:50051"));
  EXPECT_FALSE(IsLoopbackListenAddress("myhost:50051"));
}

TEST(MakeServerSecurity, Loopback_NoTlsNoTokens_Allowed) {
  auto security = MakeServerSecurity({"127.0.0.1:0", "", "", "", "", false});
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_FALSE(security->authenticator->enabled());
  EXPECT_TRUE(security->warnings.empty());
}

TEST(MakeServerSecurity, Network_NoTlsNoTokens_RefusedUnlessInsecure) {
  auto refused = MakeServerSecurity({"0.0.0.0:50051", "", "", "", "", false});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--insecure"), std::string::npos) << refused.status();
  auto insecure = MakeServerSecurity({"0.0.0.0:50051", "", "", "", "", true});
  ASSERT_TRUE(insecure.ok()) << insecure.status();
  ASSERT_EQ(insecure->warnings.size(), 1u);
  EXPECT_NE(insecure->warnings[0].find("--insecure"), std::string::npos);
}

TEST(MakeServerSecurity, Loopback_TokensWithoutTls_UseLocalCredentials) {
  const std::string tokens = TempFile("tokens", "user alice alice-token-0123456789\n");
  auto security = MakeServerSecurity({"127.0.0.1:0", "", "", "", tokens, false});
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_TRUE(security->authenticator->enabled());
}

TEST(MakeServerSecurity, Network_TokensWithoutTls_Refused) {
  const std::string tokens = TempFile("tokens2", "user alice alice-token-0123456789\n");
  auto refused = MakeServerSecurity({"0.0.0.0:1", "", "", "", tokens, false});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  auto also_refused = MakeServerSecurity({"0.0.0.0:1", "", "", "", tokens, true});
  EXPECT_EQ(also_refused.status().code(), absl::StatusCode::kFailedPrecondition)
      << "a token in clear text over a network is given away, --insecure or not";
}

TEST(MakeServerSecurity, BadFiles_NameTheFlag) {
  const std::string not_pem = TempFile("not_pem", "hello");
  auto missing = MakeServerSecurity({"127.0.0.1:0", "/nonexistent.pem", not_pem, "", "", false});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("--tls_cert"), std::string::npos);
  auto half = MakeServerSecurity({"127.0.0.1:0", not_pem, "", "", "", false});
  EXPECT_EQ(half.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = MakeServerSecurity({"127.0.0.1:0", not_pem, not_pem, "", "", false});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("not a PEM file"), std::string::npos) << bad.status();
  auto directory = MakeServerSecurity({"127.0.0.1:0", "", "", "", "/", false});
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mptrain
