#include "coordinator/rpc_metrics_interceptor.h"

#include <chrono>
#include <string>

#include "absl/status/status.h"

namespace mptrain {
namespace {

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(RpcMetrics* metrics, const char* method)
      : metrics_(metrics), method_(method == nullptr ? "" : method),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using Hook = grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(Hook::PRE_SEND_STATUS)) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      const auto code = static_cast<absl::StatusCode>(methods->GetSendStatus().error_code());
      metrics_->Record(method_, absl::StatusCodeToString(code), seconds);
    }
    methods->Proceed();
  }

 private:
  RpcMetrics* metrics_;
  std::string method_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

grpc::experimental::Interceptor* RpcMetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new RpcMetricsInterceptor(metrics_, info->method());
}

}  // namespace mptrain
