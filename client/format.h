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
// JOB NAME OWNER STATE DEVICE RANKS STEP LOSS AGE DURATION REASON (a pending job's reason, an
// ended one's error), in the order given; "No jobs." for none.
std::string FormatJobTable(const std::vector<v1::Job>& jobs, int64_t now_unix_ms);
// "1m", "3h": the age and run time columns.
std::string FormatDuration(int64_t ms);
// "2026-12-02 02:10:08 UTC".
std::string FormatUnixMs(int64_t unix_ms);
std::string FormatJobDetail(const v1::Job& job);
std::string FormatWorkerTable(const std::vector<v1::Worker>& workers);
// What an ended job came to, on one line (`trainctl watch` of a job that had already ended):
// "3/3 steps in 4s; final loss 0.500000, eval_loss 0.400000 (acc 0.9750); 2 skipped;
// 2 ranks, identical parameters (checksum 1a2b3c4d)" — the parts it has.
std::string FormatJobSummary(const v1::Job& job);
// One line per telemetry record, as `trainctl watch` prints it.
std::string FormatTelemetryLine(const v1::TelemetryRecord& record);

}  // namespace mptrain
