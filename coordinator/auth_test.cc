#include "coordinator/auth.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

constexpr char kTable[] = R"(# role principal token
admin root-admin  admin-token-0123456789
user  alice       alice-token-0123456789
user  bob         bob-token-012345678901   # trailing comment
worker node1      worker-token-012345678
viewer grafana    viewer-token-012345678
)";

Authenticator MakeAuthenticator() {
  auto table = TokenTable::Parse(kTable, "tokens");
  EXPECT_TRUE(table.ok()) << table.status();
  return Authenticator(std::move(*table));
}

TEST(TokenTable, Parse_ValidLines_FindsEachPrincipal) {
  auto table = TokenTable::Parse(kTable, "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 5u);
  ASSERT_NE(table->Find("bob-token-012345678901"), nullptr);
  EXPECT_EQ(table->Find("bob-token-012345678901")->name, "bob");
  EXPECT_EQ(table->Find("worker-token-012345678")->role, Role::kWorker);
  EXPECT_EQ(table->Find("viewer-token-012345678")->role, Role::kViewer);
  EXPECT_EQ(table->Find("bob-token-01234567890"), nullptr) << "a prefix is not the token";
  EXPECT_EQ(table->Find(""), nullptr);
}

TEST(TokenTable, Parse_BadLines_NameFileAndLineWithoutEchoingTheToken) {
  struct Case {
    const char* text;
    const char* expected;
  };
  for (const Case& c : {
           Case{"root x secret-token-01234567\n", "tokens:1: role must be"},
           Case{"\nuser\n", "tokens:2: expected 3 fields"},
           Case{"user a b c d\n", "expected 3 fields, got 5"},
           Case{"user al/ice secret-token-01234567\n", "principal must be"},
           Case{"user alice short\n", "token must be 16 to 256"},
           Case{"user a secret-token-01234567\nuser b secret-token-01234567\n",
                "tokens:2: this token is also on an earlier line"},
           Case{"# nothing\n", "no tokens"},
       }) {
    auto table = TokenTable::Parse(c.text, "tokens");
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(table.status().message().find(c.expected), std::string::npos)
        << table.status() << " for " << c.text;
    EXPECT_EQ(table.status().message().find("secret-token"), std::string::npos)
        << "a token leaked into the error: " << table.status();
  }
}

TEST(TokenTable, Load_MissingFile_NotFoundNamingFlag) {
  auto table = TokenTable::Load("/nonexistent/tokens");
  EXPECT_EQ(table.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(table.status().message().find("--token_file"), std::string::npos);
}

TEST(AccessFor, KnownServices_MapToTheirRoles) {
  EXPECT_EQ(AccessFor("/grpc.health.v1.Health/Check"), MethodAccess::kPublic);
  EXPECT_EQ(AccessFor("/mptrain.v1.Coordinator/SubmitJob"), MethodAccess::kUserWrite);
  EXPECT_EQ(AccessFor("/mptrain.v1.Coordinator/CancelJob"), MethodAccess::kUserWrite);
  for (const char* read : {"GetJob", "ListJobs", "ListWorkers", "WatchJob", "GetJobEvents",
                           "GetRankLog"}) {
    EXPECT_EQ(AccessFor(absl::StrCat("/mptrain.v1.Coordinator/", read)),
              MethodAccess::kUserRead)
        << read;
  }
  EXPECT_EQ(AccessFor("/mptrain.v1.Coordinator/GetJobX"), MethodAccess::kUserWrite)
      << "an unlisted method is not a read";
  EXPECT_EQ(AccessFor("/http/api/jobs"), MethodAccess::kUserRead);
  EXPECT_EQ(AccessFor("/mptrain.v1.WorkerControl/KeyValueSet"), MethodAccess::kWorker);
  EXPECT_EQ(AccessFor("/mptrain.v1.Other/X"), MethodAccess::kDenied);
  EXPECT_EQ(AccessFor(""), MethodAccess::kDenied);
}

TEST(Authenticator, Disabled_AdmitsEverything) {
  Authenticator auth(std::nullopt);
  EXPECT_TRUE(auth.Authorize("/mptrain.v1.WorkerControl/RegisterWorker", "").ok());
  EXPECT_TRUE(auth.Authorize("/unknown/Method", "").ok());
}

TEST(Authenticator, MissingOrUnknownToken_Unauthenticated) {
  Authenticator auth = MakeAuthenticator();
  EXPECT_EQ(auth.Authorize("/mptrain.v1.Coordinator/ListJobs", "").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authorize("/mptrain.v1.Coordinator/ListJobs", "Bearer nope-nope-nope-nope").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authorize("/mptrain.v1.Coordinator/ListJobs", "alice-token-0123456789").code(),
            absl::StatusCode::kUnauthenticated)
      << "the Bearer scheme is required";
}

TEST(Authenticator, Roles_OnlyTheirServices) {
  Authenticator auth = MakeAuthenticator();
  const std::string user = "Bearer alice-token-0123456789";
  const std::string admin = "Bearer admin-token-0123456789";
  const std::string worker = "Bearer worker-token-012345678";
  EXPECT_TRUE(auth.Authorize("/mptrain.v1.Coordinator/SubmitJob", user).ok());
  EXPECT_TRUE(auth.Authorize("/mptrain.v1.Coordinator/CancelJob", admin).ok());
  EXPECT_TRUE(auth.Authorize("/mptrain.v1.WorkerControl/Heartbeat", worker).ok());
  absl::Status denied = auth.Authorize("/mptrain.v1.WorkerControl/RegisterWorker", user);
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.message().find("alice (role user) may not call"), std::string::npos)
      << denied;
  EXPECT_EQ(auth.Authorize("/mptrain.v1.WorkerControl/ReportRankResult", admin).code(),
            absl::StatusCode::kPermissionDenied)
      << "an admin is not a worker";
  EXPECT_EQ(auth.Authorize("/mptrain.v1.Coordinator/SubmitJob", worker).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.Authorize("/mptrain.v1.Secret/Method", admin).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(auth.Authorize("/grpc.health.v1.Health/Check", "").ok());
}

TEST(Authenticator, Viewer_ReadsEverything_ChangesNothing) {
  Authenticator auth = MakeAuthenticator();
  const std::string viewer = "Bearer viewer-token-012345678";
  for (const char* read : {"GetJob", "ListJobs", "ListWorkers", "WatchJob", "GetJobEvents",
                           "GetRankLog"}) {
    EXPECT_TRUE(auth.Authorize(absl::StrCat("/mptrain.v1.Coordinator/", read), viewer).ok())
        << read;
  }
  EXPECT_TRUE(auth.Authorize("/http/metrics", viewer).ok());
  for (const char* write : {"SubmitJob", "CancelJob"}) {
    absl::Status denied = auth.Authorize(absl::StrCat("/mptrain.v1.Coordinator/", write), viewer);
    EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied) << write;
    EXPECT_NE(denied.message().find("grafana (role viewer) may not call"), std::string::npos)
        << denied;
    EXPECT_NE(denied.message().find("it needs the role user or admin"), std::string::npos)
        << denied;
  }
  EXPECT_EQ(auth.Authorize("/mptrain.v1.WorkerControl/Heartbeat", viewer).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(Authenticator, Identify_ReadsAllJobsOnlyForAdminsViewersAndWithoutTokens) {
  Authenticator auth = MakeAuthenticator();
  const CallerIdentity user = auth.Identify("Bearer alice-token-0123456789");
  EXPECT_EQ(user.principal, "alice");
  EXPECT_FALSE(user.admin);
  EXPECT_FALSE(user.reads_all_jobs);
  const CallerIdentity viewer = auth.Identify("Bearer viewer-token-012345678");
  EXPECT_EQ(viewer.principal, "grafana");
  EXPECT_FALSE(viewer.admin);
  EXPECT_TRUE(viewer.reads_all_jobs);
  EXPECT_TRUE(auth.Identify("Bearer admin-token-0123456789").reads_all_jobs);
  EXPECT_FALSE(auth.Identify("Bearer worker-token-012345678").reads_all_jobs);
  const CallerIdentity stranger = auth.Identify("Bearer nope-nope-nope-nope");
  EXPECT_EQ(stranger.principal, "");
  EXPECT_FALSE(stranger.reads_all_jobs);
  const CallerIdentity anonymous = Authenticator(std::nullopt).Identify("");
  EXPECT_EQ(anonymous.principal, "anonymous");
  EXPECT_TRUE(anonymous.admin);
  EXPECT_TRUE(anonymous.reads_all_jobs);
}

TEST(CheckWorkerName, EachCredentialMustNameTheWorker) {
  EXPECT_TRUE(CheckWorkerName("w1", std::nullopt, std::nullopt).ok()) << "quick-start mode";
  EXPECT_TRUE(CheckWorkerName("w1", "w1", std::nullopt).ok());
  EXPECT_TRUE(CheckWorkerName("w1", std::nullopt, "w1").ok());
  EXPECT_TRUE(CheckWorkerName("w1", "w1", "w1").ok());
  absl::Status token = CheckWorkerName("w2", "w1", std::nullopt);
  EXPECT_EQ(token.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(token.message().find("registers under its token's principal"), std::string::npos)
      << token;
  EXPECT_NE(token.message().find("worker w1's, not w2"), std::string::npos) << token;
  absl::Status certificate = CheckWorkerName("w2", "w2", "w1");
  EXPECT_EQ(certificate.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(certificate.message().find("client certificate's subject CN"), std::string::npos)
      << certificate;
  EXPECT_EQ(CheckWorkerName("w1", std::nullopt, "w1#2").code(),
            absl::StatusCode::kPermissionDenied)
      << "names are compared whole";
  EXPECT_EQ(CheckWorkerName("w", "w1", std::nullopt).code(), absl::StatusCode::kPermissionDenied)
      << "nor as prefixes";
}

}  // namespace
}  // namespace mptrain
