#include "server/metrics_http_server.h"

#include <CivetServer.h>
#include <prometheus/text_serializer.h>

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvcache {

class MetricsHttpServer::Handler final : public CivetHandler {
 public:
  explicit Handler(std::shared_ptr<prometheus::Collectable> collectable)
      : collectable_(std::move(collectable)) {}

  bool handleGet(CivetServer* /*server*/, mg_connection* connection) override {
    const std::string body = prometheus::TextSerializer().Serialize(collectable_->Collect());
    const std::string head = absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: ", kMetricsContentType,
                                          "\r\nContent-Length: ", body.size(), "\r\n\r\n");
    mg_write(connection, head.data(), head.size());
    mg_write(connection, body.data(), body.size());
    return true;
  }

 private:
  const std::shared_ptr<prometheus::Collectable> collectable_;
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, std::shared_ptr<prometheus::Collectable> collectable) {
  auto server = std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer());
  server->handler_ = std::make_unique<Handler>(std::move(collectable));
  try {
    server->server_ = std::make_unique<CivetServer>(
        std::vector<std::string>{"listening_ports", listen, "num_threads", "2"});
  } catch (const std::exception& error) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, ": ", error.what()));
  }
  server->server_->addHandler("/metrics", server->handler_.get());
  const std::vector<int> ports = server->server_->getListeningPorts();
  const size_t colon = listen.rfind(':');
  server->address_ = ports.empty() || colon == std::string::npos
                         ? listen
                         : absl::StrCat(listen.substr(0, colon + 1), ports[0]);
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (server_ != nullptr) server_->close();
}

}  // namespace kvcache
