#pragma once

// Feeds RpcMetrics from every call the gRPC server answers: its method, its status code and
// the time from its arrival to its status, measured by a server interceptor so that no
// handler carries metrics code.

#include <memory>

#include "coordinator/metrics.h"
#include "grpcpp/support/server_interceptor.h"

namespace mptrain {

class RpcMetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(RpcMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  RpcMetrics* metrics_;
};

}  // namespace mptrain
