#include "coordinator/prometheus_text.h"

#include <charconv>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace mptrain {

void PrometheusText::Family(const std::string& name, const std::string& help,
                            const std::string& type) {
  family_ = name;
  absl::StrAppend(&text_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

std::string PrometheusText::EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string PrometheusText::FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // The shortest text that reads back as the same double ("0.005", not "0.0050000000000000001").
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::general);
  return std::string(buffer, result.ptr);
}

void PrometheusText::Sample(const Labels& labels, double value, const std::string& suffix) {
  absl::StrAppend(&text_, family_, suffix);
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&text_, i == 0 ? "" : ",", labels[i].first, "=\"",
                      EscapeLabelValue(labels[i].second), "\"");
    }
    text_ += '}';
  }
  absl::StrAppend(&text_, " ", FormatValue(value), "\n");
}

void PrometheusText::Histogram(const Labels& labels, const std::vector<double>& bounds,
                               const std::vector<uint64_t>& cumulative_counts, double sum,
                               uint64_t count) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    Labels with_le = labels;
    with_le.emplace_back("le", FormatValue(bounds[i]));
    Sample(with_le, static_cast<double>(cumulative_counts[i]), "_bucket");
  }
  Labels with_inf = labels;
  with_inf.emplace_back("le", "+Inf");
  Sample(with_inf, static_cast<double>(count), "_bucket");
  Sample(labels, sum, "_sum");
  Sample(labels, static_cast<double>(count), "_count");
}

}  // namespace mptrain
