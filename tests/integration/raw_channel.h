// Raw gRPC channels to a daemon under test, with the credentials a test picks: TLS (with or
// without a client certificate) or none, and a bearer token per call. The security tests drive
// the daemon this way so that what reaches it is exactly what the test chose, whatever the C++
// client would add.
#ifndef KVCACHE_TESTS_INTEGRATION_RAW_CHANNEL_H_
#define KVCACHE_TESTS_INTEGRATION_RAW_CHANNEL_H_

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "kvcache/v1/kvcache.grpc.pb.h"

namespace kvcache::testing {

struct RawCredentials {
  std::string token;      // sent as "authorization: Bearer <token>" when set
  std::string ca_file;    // TLS when set: the roots the daemon's certificate must chain to
  std::string cert_file;  // client certificate (mutual TLS)
  std::string key_file;
};

inline std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::unique_ptr<v1::KvCache::Stub> RawStub(const std::string& target,
                                                  const RawCredentials& credentials) {
  std::shared_ptr<grpc::ChannelCredentials> channel = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  if (!credentials.ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadTextFile(credentials.ca_file);
    if (!credentials.cert_file.empty()) {
      ssl.pem_cert_chain = ReadTextFile(credentials.cert_file);
      ssl.pem_private_key = ReadTextFile(credentials.key_file);
    }
    channel = grpc::SslCredentials(ssl);
    args.SetSslTargetNameOverride("localhost");
  }
  return v1::KvCache::NewStub(grpc::CreateCustomChannel(target, channel, args));
}

// A context with a deadline and the bearer token, if any.
inline std::unique_ptr<grpc::ClientContext> RawContext(const RawCredentials& credentials) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!credentials.token.empty()) {
    context->AddMetadata("authorization", "Bearer " + credentials.token);
  }
  return context;
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_INTEGRATION_RAW_CHANNEL_H_
