#include "coordinator/prometheus_text.h"

#include <limits>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(PrometheusText, WritesFamiliesAndEscapedLabels) {
  PrometheusText text;
  text.Family("mptrain_jobs", "Jobs by state.", "gauge");
  text.Sample({{"state", "running"}}, 2);
  text.Sample({{"name", "a \"quoted\"\\ name\nnext"}}, 0.25);
  EXPECT_EQ(text.text(),
            "# HELP mptrain_jobs Jobs by state.\n# TYPE mptrain_jobs gauge\n"
            "mptrain_jobs{state=\"running\"} 2\n"
            "mptrain_jobs{name=\"a \\\"quoted\\\"\\\\ name\\nnext\"} 0.25\n");
}

TEST(PrometheusText, FormatsSpecialValuesAndShortestDecimals) {
  EXPECT_EQ(PrometheusText::FormatValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(PrometheusText::FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(PrometheusText::FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(PrometheusText::FormatValue(0.005), "0.005");
  EXPECT_EQ(PrometheusText::FormatValue(65536), "65536");
}

TEST(PrometheusText, HistogramHasBucketsSumAndCount) {
  PrometheusText text;
  text.Family("mptrain_rpc_duration_seconds", "Latency.", "histogram");
  text.Histogram({{"method", "GetJob"}}, {0.001, 0.01}, {1, 3}, 0.02, 4);
  EXPECT_EQ(text.text(),
            "# HELP mptrain_rpc_duration_seconds Latency.\n"
            "# TYPE mptrain_rpc_duration_seconds histogram\n"
            "mptrain_rpc_duration_seconds_bucket{method=\"GetJob\",le=\"0.001\"} 1\n"
            "mptrain_rpc_duration_seconds_bucket{method=\"GetJob\",le=\"0.01\"} 3\n"
            "mptrain_rpc_duration_seconds_bucket{method=\"GetJob\",le=\"+Inf\"} 4\n"
            "mptrain_rpc_duration_seconds_sum{method=\"GetJob\"} 0.02\n"
            "mptrain_rpc_duration_seconds_count{method=\"GetJob\"} 4\n");
}

}  // namespace
}  // namespace mptrain
