// grpc_health_check HOST:PORT [SERVICE]: asks grpc.health.v1.Health/Check over plaintext, as
// kubelet's gRPC probe does, and exits 0 when the answer is SERVING, 1 for any other answer or
// an error (printed), 2 for bad arguments. The request and the answer are written as raw
// protobuf bytes (HealthCheckRequest {1: service}, HealthCheckResponse {1: status}), so no
// health .proto is needed.

#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: grpc_health_check HOST:PORT [SERVICE]\n");
    return 2;
  }
  const std::string service = argc == 3 ? argv[2] : "";
  if (service.size() > 100) {
    std::fprintf(stderr, "SERVICE must be at most 100 bytes, got %zu\n", service.size());
    return 2;
  }
  std::string request_bytes;
  if (!service.empty()) {  // Field 1, length-delimited; the length fits one varint byte.
    request_bytes.push_back('\x0a');
    request_bytes.push_back(static_cast<char>(service.size()));
    request_bytes += service;
  }
  auto channel = grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&done](grpc::Status status) { done.set_value(status); });
  const grpc::Status status = done.get_future().get();
  if (!status.ok()) {
    std::printf("error: %d %s\n", static_cast<int>(status.error_code()),
                status.error_message().c_str());
    return 1;
  }
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);
  std::string bytes;
  for (const grpc::Slice& part : slices) {
    bytes.append(reinterpret_cast<const char*>(part.begin()), part.size());
  }
  // ServingStatus: 0 UNKNOWN, 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN; 0 is encoded as
  // an empty message.
  int serving_status = 0;
  if (bytes.size() == 2 && bytes[0] == '\x08') serving_status = bytes[1];
  static const char* const kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  if (serving_status < 0 || serving_status > 3 || (!bytes.empty() && bytes.size() != 2)) {
    std::printf("error: an answer that is no HealthCheckResponse (%zu bytes)\n", bytes.size());
    return 1;
  }
  std::printf("%s\n", kNames[serving_status]);
  return serving_status == 1 ? 0 : 1;
}
