#pragma once

// Prometheus' text exposition format (version 0.0.4), written by hand because Debian 12 has no
// prometheus-cpp: one `# HELP` and `# TYPE` per family, then its samples. Label values are
// escaped (backslash, double quote, newline) since job names come from users; values print
// as Prometheus reads them (NaN, +Inf, -Inf). `promtool check metrics` passes on the output
// (tests/observability_test).

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace mptrain {

using Labels = std::vector<std::pair<std::string, std::string>>;

class PrometheusText {
 public:
  // Starts a family; `type` is counter, gauge or histogram.
  void Family(const std::string& name, const std::string& help, const std::string& type);
  // A sample of the current family (`suffix` for histograms: _bucket, _sum, _count).
  void Sample(const Labels& labels, double value, const std::string& suffix = "");
  // A histogram's samples from cumulative bucket counts (bounds ascending, +Inf added).
  void Histogram(const Labels& labels, const std::vector<double>& bounds,
                 const std::vector<uint64_t>& cumulative_counts, double sum, uint64_t count);
  const std::string& text() const { return text_; }

  static std::string EscapeLabelValue(const std::string& value);
  static std::string FormatValue(double value);

 private:
  std::string family_;
  std::string text_;
};

}  // namespace mptrain
