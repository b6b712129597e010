#pragma once

// How trainctl prints jobs, workers and telemetry: aligned tables for people, protobuf JSON
// (field names as in the .proto) for scripts.

#include <string>
#include <vector>

#include "google/protobuf/message.h"
#include "proto/mptrain.pb.h"

namespace mptrain {

std::string ToJson(const google::protobuf::Message& message, bool multiline = true);

// A table with a header row; columns padded to their widest cell.
std::string FormatTable(const std::vector<std::vector<std::string>>& rows);

std::string ShortState(v1::JobState state);
std::string FormatJobTable(const std::vector<v1::Job>& jobs);
std::string FormatJobDetail(const v1::Job& job);
std::string FormatWorkerTable(const std::vector<v1::Worker>& workers);
// One line per telemetry record, as `trainctl watch` prints it.
std::string FormatTelemetryLine(const v1::TelemetryRecord& record);

}  // namespace mptrain
