// ToGrpcStatus / FromGrpcStatus: the one place the daemon converts statuses. Every absl code maps
// to the gRPC code of the same name (and number), and the message travels unchanged, so the codes
// the proto documents are the codes clients see.
#include "common/rpc/grpc_status.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvcache {
namespace {

struct CodePair {
  absl::StatusCode absl_code;
  grpc::StatusCode grpc_code;
};

// Written out by name, not by number: a cast between mismatched enumerators would still pass a
// loop over 0..16.
const std::vector<CodePair>& AllCodes() {
  static const auto* codes = new std::vector<CodePair>{
      {absl::StatusCode::kOk, grpc::StatusCode::OK},
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  return *codes;
}

TEST(GrpcStatusTest, CoversAllSeventeenCodes) {
  ASSERT_EQ(AllCodes().size(), 17u);
  for (size_t i = 0; i < AllCodes().size(); ++i) {
    EXPECT_EQ(static_cast<int>(AllCodes()[i].absl_code), static_cast<int>(i));
    EXPECT_EQ(static_cast<int>(AllCodes()[i].grpc_code), static_cast<int>(i));
  }
}

TEST(GrpcStatusTest, ToGrpcStatusKeepsCodeAndMessage) {
  for (const CodePair& pair : AllCodes()) {
    if (pair.absl_code == absl::StatusCode::kOk) continue;
    const std::string message = "pool 'default': " + absl::StatusCodeToString(pair.absl_code);
    const grpc::Status converted = ToGrpcStatus(absl::Status(pair.absl_code, message));
    EXPECT_EQ(converted.error_code(), pair.grpc_code) << message;
    EXPECT_EQ(converted.error_message(), message);
  }
}

TEST(GrpcStatusTest, FromGrpcStatusKeepsCodeAndMessage) {
  for (const CodePair& pair : AllCodes()) {
    if (pair.grpc_code == grpc::StatusCode::OK) continue;
    const std::string message = "from the wire: " + absl::StatusCodeToString(pair.absl_code);
    const absl::Status converted = FromGrpcStatus(grpc::Status(pair.grpc_code, message));
    EXPECT_EQ(converted.code(), pair.absl_code) << message;
    EXPECT_EQ(converted.message(), message);
  }
}

TEST(GrpcStatusTest, OkIsOkBothWays) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_EQ(ToGrpcStatus(absl::OkStatus()).error_message(), "");
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

// The conversion copies the message's bytes, not a C string: a NUL or a non-UTF-8 byte survives.
TEST(GrpcStatusTest, MessageBytesAreNotReencoded) {
  const std::string message("\xff\x00 raw", 6);
  EXPECT_EQ(ToGrpcStatus(absl::DataLossError(message)).error_message(), message);
}

}  // namespace
}  // namespace kvcache
