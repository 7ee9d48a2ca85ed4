#include "server/rpc_metrics.h"

#include <google/protobuf/descriptor.h>

#include "absl/strings/str_cat.h"
#include "kvcache/v1/kvcache.grpc.pb.h"

namespace kvcache {
namespace {

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit RpcMetricsInterceptor(RpcMetrics::Method* method)
      : method_(method), start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const int code = static_cast<int>(methods->GetSendStatus().error_code());
      if (code >= 0 && code < kNumGrpcCodes) {
        method_->calls[code].fetch_add(1, std::memory_order_relaxed);
      }
      method_->duration.Observe(absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  RpcMetrics::Method* const method_;
  const absl::Time start_;
};

class RpcMetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(RpcMetrics* metrics) : metrics_(metrics) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    RpcMetrics::Method* method = metrics_->Find(info->method());
    return method == nullptr ? nullptr : new RpcMetricsInterceptor(method);
  }

 private:
  RpcMetrics* const metrics_;
};

}  // namespace

const char* GrpcCodeName(int code) {
  static constexpr const char* kNames[kNumGrpcCodes] = {"OK",
                                                        "CANCELLED",
                                                        "UNKNOWN",
                                                        "INVALID_ARGUMENT",
                                                        "DEADLINE_EXCEEDED",
                                                        "NOT_FOUND",
                                                        "ALREADY_EXISTS",
                                                        "PERMISSION_DENIED",
                                                        "RESOURCE_EXHAUSTED",
                                                        "FAILED_PRECONDITION",
                                                        "ABORTED",
                                                        "OUT_OF_RANGE",
                                                        "UNIMPLEMENTED",
                                                        "INTERNAL",
                                                        "UNAVAILABLE",
                                                        "DATA_LOSS",
                                                        "UNAUTHENTICATED"};
  return code >= 0 && code < kNumGrpcCodes ? kNames[code] : "UNKNOWN";
}

RpcMetrics::RpcMetrics() {
  const auto add = [this](const std::string& path, std::string label) {
    auto method = std::make_unique<Method>();
    method->label = std::move(label);
    by_path_[path] = method.get();
    methods_.push_back(std::move(method));
  };
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::KvCache::service_full_name());
  if (service != nullptr) {
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string& name = service->method(i)->name();
      add(absl::StrCat("/", v1::KvCache::service_full_name(), "/", name), name);
    }
  }
  for (const char* other : {"grpc.health.v1.Health/Check", "grpc.health.v1.Health/Watch",
                            "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"}) {
    add(absl::StrCat("/", other), other);
  }
}

RpcMetrics::Method* RpcMetrics::Find(absl::string_view path) {
  auto it = by_path_.find(path);
  return it == by_path_.end() ? nullptr : it->second;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RpcMetrics::InterceptorFactory() {
  return std::make_unique<RpcMetricsInterceptorFactory>(this);
}

}  // namespace kvcache
