#include "model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "tests/testing/status_matchers.h"
#include "tests/testing/test_files.h"

namespace kvcache::worker {
namespace {

using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::kvcache::worker::testing::SafetensorsBytes;
using ::kvcache::worker::testing::WriteFile;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Le16(uint16_t v) {
  return std::string{static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
}

std::string F32Bytes(std::initializer_list<float> values) {
  std::string bytes;
  for (float v : values) {
    char raw[4];
    std::memcpy(raw, &v, 4);
    bytes.append(raw, 4);
  }
  return bytes;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  // Writes a file with `header` and `data` and opens it.
  absl::StatusOr<SafetensorsFile> OpenWith(const std::string& header, const std::string& data) {
    const std::string path = dir_.File("model.safetensors");
    WriteFile(path, SafetensorsBytes(header, data));
    return SafetensorsFile::Open(path);
  }

  ScopedTempDir dir_;
};

TEST_F(SafetensorsTest, ReadsEveryFloatDtypeExactly) {
  // bf16 [1, -2, 0.5]; f16 [1, 65504, 2^-24]; f32 [3.25, -0.125] (shape [2, 1]).
  const std::string data = Le16(0x3f80) + Le16(0xc000) + Le16(0x3f00) + Le16(0x3c00) +
                           Le16(0x7bff) + Le16(0x0001) + F32Bytes({3.25f, -0.125f});
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},)"
                             R"("h":{"dtype":"F16","shape":[3],"data_offsets":[6,12]},)"
                             R"("f":{"dtype":"F32","shape":[2,1],"data_offsets":[12,20]}})";
  absl::StatusOr<SafetensorsFile> file = OpenWith(header, data);
  ASSERT_OK(file);
  EXPECT_THAT(file->Names(), ElementsAre("b", "f", "h"));

  absl::StatusOr<Tensor> b = file->Get("b", {3});
  ASSERT_OK(b);
  EXPECT_THAT(b->data, ElementsAre(1.0f, -2.0f, 0.5f));
  absl::StatusOr<Tensor> h = file->Get("h", {3});
  ASSERT_OK(h);
  EXPECT_THAT(h->data, ElementsAre(1.0f, 65504.0f, std::ldexp(1.0f, -24)));
  absl::StatusOr<Tensor> f = file->Get("f", {2, 1});
  ASSERT_OK(f);
  EXPECT_THAT(f->shape, ElementsAre(2, 1));
  EXPECT_THAT(f->data, ElementsAre(3.25f, -0.125f));
  const TensorInfo* info = file->Info("f");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->size, 8u);
}

TEST_F(SafetensorsTest, EmptyAndScalarTensorsAreFine) {
  absl::StatusOr<SafetensorsFile> file =
      OpenWith(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
               R"("e":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]}})",
               F32Bytes({7.0f}));
  ASSERT_OK(file);
  absl::StatusOr<Tensor> scalar = file->Get("s", {});
  ASSERT_OK(scalar);
  EXPECT_THAT(scalar->data, ElementsAre(7.0f));
  absl::StatusOr<Tensor> empty = file->Get("e", {0, 5});
  ASSERT_OK(empty);
  EXPECT_TRUE(empty->data.empty());
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  EXPECT_THAT(SafetensorsFile::Open(dir_.File("absent.safetensors")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent.safetensors")));
}

TEST_F(SafetensorsTest, DirectoryIsInvalidArgument) {
  EXPECT_THAT(SafetensorsFile::Open(dir_.path()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
}

TEST_F(SafetensorsTest, FileShorterThanTheLengthPrefixIsInvalid) {
  const std::string path = dir_.File("short.safetensors");
  WriteFile(path, std::string("\x10\x00\x00", 3));
  EXPECT_THAT(SafetensorsFile::Open(path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("need at least 8")));
  WriteFile(path, "");
  EXPECT_THAT(SafetensorsFile::Open(path), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(SafetensorsTest, TruncatedHeaderIsInvalid) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const std::string bytes = SafetensorsBytes(header, F32Bytes({1.0f}));
  const std::string path = dir_.File("truncated.safetensors");
  WriteFile(path, bytes.substr(0, 8 + header.size() / 2));
  EXPECT_THAT(
      SafetensorsFile::Open(path),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("truncated header"), HasSubstr(std::to_string(header.size())))));
}

TEST_F(SafetensorsTest, MalformedJsonIsInvalid) {
  EXPECT_THAT(OpenWith(R"({"a":{"dtype":"F32",)", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid JSON")));
  EXPECT_THAT(OpenWith(R"([1, 2])", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a JSON object")));
  EXPECT_THAT(OpenWith(R"({"a":[1]})", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"a\"")));
  EXPECT_THAT(OpenWith(R"({"__metadata__":[1]})", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("__metadata__")));
}

TEST_F(SafetensorsTest, UnknownDtypeIsInvalid) {
  EXPECT_THAT(OpenWith(R"({"w":{"dtype":"BF17","shape":[2],"data_offsets":[0,4]}})", "abcd"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"w\""), HasSubstr("unknown dtype \"BF17\""))));
  EXPECT_THAT(OpenWith(R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,4]}})", "abcd"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
}

TEST_F(SafetensorsTest, KnownButUnsupportedDtypeOpensButGetRefuses) {
  absl::StatusOr<SafetensorsFile> file =
      OpenWith(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0'));
  ASSERT_OK(file);
  EXPECT_THAT(file->Get("ids", {1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("I64")));
}

TEST_F(SafetensorsTest, OffsetsOutsideTheDataAreInvalid) {
  EXPECT_THAT(
      OpenWith(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", F32Bytes({1, 2})),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("\"w\""), HasSubstr("[4, 12)"), HasSubstr("8-byte"))));
  EXPECT_THAT(
      OpenWith(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", F32Bytes({1, 2})),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("end before")));
  EXPECT_THAT(OpenWith(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", F32Bytes({1})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data_offsets")));
  EXPECT_THAT(OpenWith(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", F32Bytes({1})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data_offsets")));
}

TEST_F(SafetensorsTest, SizeMustMatchTheShape) {
  EXPECT_THAT(OpenWith(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})",
                       std::string(8, '\0')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"w\""), HasSubstr("span 8 bytes"), HasSubstr("[2, 3]"),
                             HasSubstr("needs 12"))));
  EXPECT_THAT(OpenWith(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", F32Bytes({1})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-negative")));
  EXPECT_THAT(
      OpenWith(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})",
               F32Bytes({1})),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
}

TEST_F(SafetensorsTest, OverlappingTensorsAreInvalid) {
  EXPECT_THAT(OpenWith(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       F32Bytes({1, 2, 3})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"a\""), HasSubstr("\"b\""), HasSubstr("overlapping"))));
}

TEST_F(SafetensorsTest, MissingTensorIsNotFound) {
  absl::StatusOr<SafetensorsFile> file =
      OpenWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", F32Bytes({1}));
  ASSERT_OK(file);
  EXPECT_THAT(file->Get("model.norm.weight", {1}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("model.norm.weight")));
  EXPECT_EQ(file->Info("model.norm.weight"), nullptr);
}

TEST_F(SafetensorsTest, MisShapedTensorNamesBothShapes) {
  absl::StatusOr<SafetensorsFile> file =
      OpenWith(R"({"proj":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})",
               F32Bytes({1, 2, 3, 4, 5, 6}));
  ASSERT_OK(file);
  EXPECT_THAT(file->Get("proj", {3, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"proj\""), HasSubstr("has shape [2, 3]"),
                             HasSubstr("expected [3, 2]"))));
  EXPECT_THAT(file->Get("proj", {6}), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(SafetensorsTest, MovedFromFileStaysUsable) {
  absl::StatusOr<SafetensorsFile> file =
      OpenWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", F32Bytes({5}));
  ASSERT_OK(file);
  SafetensorsFile moved = std::move(*file);
  absl::StatusOr<Tensor> a = moved.Get("a", {1});
  ASSERT_OK(a);
  EXPECT_THAT(a->data, ElementsAre(5.0f));
}

}  // namespace
}  // namespace kvcache::worker
