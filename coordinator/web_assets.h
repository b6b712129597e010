#pragma once

// The dashboard's pages, scripts and styles (coordinator/web/, uPlot vendored from npm),
// compiled into the binary by coordinator/web/embed.sh.

#include "absl/strings/string_view.h"

namespace mptrain {

struct WebAsset {
  absl::string_view path;  // "/jobs.html", "/vendor/uplot/uPlot.iife.min.js"
  const char* content_type;
  absl::string_view body;
};

// Null when there is no such asset.
const WebAsset* FindWebAsset(absl::string_view path);

}  // namespace mptrain
