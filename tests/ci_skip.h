// A test that cannot run its case here (a tool, a privilege or an address missing) skips with
// the reason, except under CI (the environment variable CI set and not empty; .bazelrc passes it
// to the tests with --test_env=CI): CI ran scripts/setup.sh, so there what is missing fails the
// test instead of passing it unrun.
#ifndef MPTRAIN_TESTS_CI_SKIP_H_
#define MPTRAIN_TESTS_CI_SKIP_H_

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace mptrain::testing {

// The value of CI, "" when unset.
inline std::string CiValue() {
  const char* ci = std::getenv("CI");
  return ci == nullptr ? "" : ci;
}

}  // namespace mptrain::testing

// Skips the test saying MESSAGE (an ostream chain: "needs " << tool), or fails it under CI.
#define SKIP_OR_FAIL_UNDER_CI(message)                                                       \
  switch (0)                                                                                 \
  case 0:                                                                                    \
  default:                                                                                   \
    if (!::mptrain::testing::CiValue().empty()) {                                            \
      GTEST_FAIL() << message << " (CI=" << ::mptrain::testing::CiValue()                    \
                   << ": under CI this test must run, not skip)";                            \
    } else                                                                                   \
      GTEST_SKIP() << message

#endif  // MPTRAIN_TESTS_CI_SKIP_H_
