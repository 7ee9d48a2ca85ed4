// libFuzzer target: every KvCache request handler through a real in-process daemon (Daemon::Start
// on a Unix socket in a temp dir, one per process, reused across inputs). Each input decodes into
// a few calls: a method of kvcache.v1.KvCache (any of them, found through the service's
// descriptor, so a handler added later is fuzzed too), a credential (the socket's uid, a bearer
// token of another tenant, of a reader, of an admin, or an unknown one), and its messages as raw
// bytes sent with grpc::GenericStub (client/block_stream.h): a request built field by field
// from the input — session and sequence ids the input's earlier calls got back, the daemon's
// epoch, its pools, prompts that share prefixes — then sent as built, or mutated, or bytes that
// need not parse at all; zero, one or two messages, half-closed or cut off. PutBlocks gets raw
// streams: a header and data chunks, mostly with the right checksums so puts can land and later
// GetBlocks read them back, sometimes short, long, with a wrong checksum or a stray message.
//
// After each input every session is closed; then the daemon must still answer Ping, every pool
// must return to no referenced block and no open sequence, no put bytes may stay counted against
// a quota, no AwaitRendezvous may stay parked, and every pool's invariants must hold
// (FUZZ_CHECK aborts otherwise, which libFuzzer records as a crash). The daemon runs on a fake
// clock that inputs advance, so leases expire when an input says so, and the reaper sweeps them.
//
// Thread safety: libFuzzer calls LLVMFuzzerTestOneInput from one thread; the daemon serves on
// gRPC's threads.
#include <fuzzer/FuzzedDataProvider.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <sanitizer/lsan_interface.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "auth/identity_file.h"
#include "client/block_stream.h"
#include "common/block_checksum.h"
#include "common/rpc/manifest_proto.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "server/daemon.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_inputs.h"
#include "tests/testing/fake_clock.h"

namespace kvcache {
namespace {

using ::google::protobuf::Descriptor;
using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;
using ::google::protobuf::MethodDescriptor;
using ::google::protobuf::Reflection;
using ::kvcache::testing::FakeClock;

constexpr int kMaxCalls = 12;
constexpr int kMaxFieldDepth = 3;
// Bearer tokens the identity file maps (kTokens[i] is tenant kTokenTenants[i]), and one it does
// not; the socket's own uid is tenant "default", worker.
const char* const kTokens[] = {"globex-token", "reader-token", "admin-token", "unknown-token"};
const char* const kTenantNames[] = {"", "default", "globex", "ops", "nobody"};
const char* const kPoolNames[] = {"p0", "p1"};
const char* const kRendezvousKeys[] = {"k0", "k1"};
// Page keys (an engine's own names for its pages): a few short ones, two of the 64 bytes a key
// may have that share their first 16 (the bytes a hit compares beside the key's digest).
const char* const kPageKeys[] = {"page-0",
                                 "page-1",
                                 "page-2",
                                 "page-3",
                                 "0123456789abcdef-long-key-a-0123456789abcdef0123456789abcdef01",
                                 "0123456789abcdef-long-key-b-0123456789abcdef0123456789abcdef01"};
// Part names: pool p0's two, and one no pool has.
const char* const kPartNames[] = {"kv", "state", "swa"};
// Request fields that name daemon state.
bool IsStateField(absl::string_view name) {
  constexpr absl::string_view kNames[] = {
      "session_id", "sequence_id",        "epoch",          "pool", "tokens", "tenant", "key",
      "value",      "num_written_tokens", "start_sequence", "keys", "pages"};
  return absl::c_linear_search(kNames, name);
}

std::string Sha256Hex(absl::string_view text) {
  std::string hex;
  for (uint8_t byte : Sha256Of(text)) absl::StrAppend(&hex, absl::Hex(byte, absl::kZeroPad2));
  return hex;
}

// The process's daemon and a channel to it; made once, never destroyed (libFuzzer exits with it
// still serving; the socket's directory goes at exit).
struct Server {
  FakeClock clock;
  std::string dir;
  std::unique_ptr<Daemon> daemon;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
  const google::protobuf::ServiceDescriptor* service = nullptr;
};

Server* StartServer() {
  auto* server = new Server;
  char dir[] = "/tmp/kvcache-fuzz-XXXXXX";
  FUZZ_CHECK(mkdtemp(dir) != nullptr, "mkdtemp failed");
  server->dir = dir;
  static std::string* const cleanup = new std::string(server->dir);
  std::atexit([] { std::filesystem::remove_all(*cleanup); });

  DaemonOptions options;
  options.listen = "unix://" + server->dir + "/kv.sock";
  options.metrics_listen = "127.0.0.1:0";  // so the per-call accounting interceptor runs too
  options.identities_path = server->dir + "/identities";
  std::ofstream(options.identities_path)
      << "tenant globex max_sessions=3 max_open_sequences=3 max_referenced_blocks=5"
         " max_put_bytes_in_flight=1K\n"
      << "uid " << getuid() << " default worker\n"
      << "token globex sha256:" << Sha256Hex(kTokens[0]) << " globex worker\n"
      << "token reader sha256:" << Sha256Hex(kTokens[1]) << " default reader\n"
      << "token ops sha256:" << Sha256Hex(kTokens[2]) << " ops admin\n";
  // Two tiny pools (64-byte blocks of 4 tokens, xxh3; 32-byte blocks of 2 tokens, sha256) so
  // eviction and exhaustion are a few calls away and put streams are short. p0's pages have two
  // parts, a state on the last page of a hit only, so the page calls' hit rule has work to do.
  for (int i = 0; i < 2; ++i) {
    PoolOptions pool;
    pool.name = kPoolNames[i];
    pool.model_id = "fuzz";
    pool.layout = PoolLayout{.num_layers = 1,
                             .num_kv_heads = 1,
                             .head_dim = 4,
                             .block_size = i == 0 ? 4u : 2u,
                             .dtype = DType::kFloat16};
    pool.num_blocks = i == 0 ? 16 : 8;
    pool.hash_algorithm = i == 0 ? HashAlgorithm::kXxh3_128 : HashAlgorithm::kSha256;
    if (i == 0) {
      absl::StatusOr<std::vector<PagePartLayout>> parts =
          ParsePageParts("kv/48+state/16/trailing1", pool.layout.BlockBytes());
      FUZZ_CHECK_OK(parts.status());
      pool.parts = *std::move(parts);
    }
    options.pools.push_back(pool);
  }
  options.session_limits.max_sessions = 8;
  options.session_limits.min_ttl = absl::Milliseconds(1);
  options.reaper_period = absl::Milliseconds(5);
  options.kv_events_buffer = 64;
  options.clock = &server->clock;
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options);
  FUZZ_CHECK_OK(daemon.status());
  server->daemon = *std::move(daemon);
  server->channel = grpc::CreateChannel(options.listen, grpc::InsecureChannelCredentials());
  server->stub = std::make_unique<grpc::GenericStub>(server->channel);
  server->service = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      v1::KvCache::service_full_name());
  FUZZ_CHECK(server->service != nullptr, "no descriptor for %s", v1::KvCache::service_full_name());
  return server;
}

Server& TheServer() {
  static Server* const server = StartServer();
  return *server;
}

// What one call sends and how it ends.
struct Call {
  const MethodDescriptor* method = nullptr;
  int credential = -1;  // index into kTokens; -1: none (the socket's uid)
  std::vector<std::string> messages;
  bool half_close = true;
  int max_reads = 1;
};

// One input's calls, run in order against the shared daemon.
class Harness {
 public:
  Harness(FuzzedDataProvider& in, Server& server) : in_(in), server_(server) {}

  void Run() {
    // Every input starts with a session of the socket's identity, which the calls name unless
    // the input says otherwise: without it nearly every call would stop at NOT_FOUND.
    Call open;
    open.method = server_.service->FindMethodByName("OpenSession");
    v1::OpenSessionRequest request;
    if (in_.ConsumeBool()) FillManifest(request.mutable_manifest());
    open.messages.push_back(request.SerializeAsString());
    open.max_reads = 2;
    Send(open);
    for (int i = 0; i < kMaxCalls && in_.remaining_bytes() > 0; ++i) {
      if (Rarely(in_, 16)) {
        // Time passes: leases may end, and the reaper sweeps them.
        server_.clock.Advance(absl::Milliseconds(in_.ConsumeIntegral<uint16_t>()) * 10);
        continue;
      }
      Send(NextCall());
    }
  }

 private:
  Call NextCall() {
    Call call;
    call.method =
        server_.service->method(in_.ConsumeIntegralInRange(0, server_.service->method_count() - 1));
    call.credential =
        Rarely(in_, 4) ? in_.ConsumeIntegralInRange<int>(0, std::size(kTokens) - 1) : -1;
    if (call.method->client_streaming()) {
      call.messages = PutStream();
    } else {
      const int count = Rarely(in_, 16) ? in_.ConsumeIntegralInRange(0, 2) : 1;
      for (int i = 0; i < count; ++i) call.messages.push_back(Request(call.method->input_type()));
    }
    call.half_close = !Rarely(in_, 16);
    // A unary reply is read to the end of the stream (its status); GetBlocks mostly to its end
    // too, now and then cut off after a few replies; WatchEvents, which never ends, after one to
    // three.
    if (!call.method->server_streaming()) {
      call.max_reads = 2;
    } else if (call.method->name() == "WatchEvents") {
      call.max_reads = in_.ConsumeIntegralInRange(1, 3);
    } else {
      call.max_reads = Rarely(in_, 4) ? in_.ConsumeIntegralInRange(0, 3) : 64;
    }
    return call;
  }

  // One request message of `type`: built from the input, then sent as is, mutated, or replaced
  // by raw bytes.
  std::string Request(const Descriptor* type) {
    switch (in_.ConsumeIntegralInRange(0, 7)) {
      case 6:
        return in_.ConsumeRandomLengthString(256);
      case 7: {
        std::string bytes = Build(type);
        Mutate(bytes);
        return bytes;
      }
      default:
        return Build(type);
    }
  }

  std::string Build(const Descriptor* type) {
    std::unique_ptr<Message> message(NewMessage(type));
    Fill(*message, 0);
    if (!Rarely(in_, 8)) MatchPagesToKeys(*message);
    return message->SerializeAsString();
  }

  // Page requests mostly well formed, so that they get past validation: part masks none or one
  // per key, and (PutPages) one whole page of the named pool per key with its checksum.
  void MatchPagesToKeys(Message& message) {
    const Descriptor* type = message.GetDescriptor();
    const Reflection* reflection = message.GetReflection();
    const FieldDescriptor* keys = type->FindFieldByName("keys");
    if (keys == nullptr || !keys->is_repeated()) return;
    const int num_keys = reflection->FieldSize(message, keys);
    if (const FieldDescriptor* masks = type->FindFieldByName("part_masks")) {
      reflection->ClearField(&message, masks);
      for (int i = 0; in_.ConsumeBool() && i < num_keys; ++i) {
        reflection->AddUInt32(&message, masks, in_.ConsumeIntegralInRange<uint32_t>(1, 3));
      }
    }
    const FieldDescriptor* pages = type->FindFieldByName("pages");
    const FieldDescriptor* checksums = type->FindFieldByName("page_checksums");
    if (pages == nullptr || checksums == nullptr) return;
    const std::string pool = reflection->GetString(message, type->FindFieldByName("pool"));
    const std::vector<Pool*> pools = server_.daemon->manager().pools();
    const auto named =
        absl::c_find_if(pools, [&](const Pool* p) { return p->options().name == pool; });
    const uint64_t page_bytes = named == pools.end() ? 64 : (*named)->options().layout.BlockBytes();
    reflection->ClearField(&message, pages);
    reflection->ClearField(&message, checksums);
    for (int i = 0; i < num_keys; ++i) {
      const std::string page(page_bytes, static_cast<char>(in_.ConsumeIntegral<uint8_t>()));
      reflection->AddUInt64(&message, checksums,
                            Rarely(in_, 16) ? 0 : BlockChecksum(page.data(), page.size()));
      reflection->AddString(&message, pages, page);
    }
  }

  static Message* NewMessage(const Descriptor* type) {
    return google::protobuf::MessageFactory::generated_factory()->GetPrototype(type)->New();
  }

  // A byte flipped, the message cut short, or bytes appended.
  void Mutate(std::string& bytes) {
    switch (in_.ConsumeIntegralInRange(0, 2)) {
      case 0:
        if (!bytes.empty()) {
          bytes[in_.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1)] ^=
              in_.ConsumeIntegralInRange<uint8_t>(1, 255);
        }
        break;
      case 1:
        bytes.resize(in_.ConsumeIntegralInRange<size_t>(0, bytes.size()));
        break;
      default:
        bytes += in_.ConsumeRandomLengthString(16);
        break;
    }
  }

  // Sets fields of `message` from the input: the ones that name daemon state (sessions,
  // sequences, pools, tenants, epochs, rendezvous keys, prompts) from what exists, now and then
  // anything; the rest by type.
  void Fill(Message& message, int depth) {
    const Descriptor* type = message.GetDescriptor();
    const Reflection* reflection = message.GetReflection();
    for (int i = 0; i < type->field_count(); ++i) {
      const FieldDescriptor* field = type->field(i);
      // The fields that name daemon state are mostly set; the rest (client names, extra keys,
      // salts, chunk sizes) now and then, so most requests get past parsing and validation.
      if (IsStateField(field->name()) ? Rarely(in_, 4) : !Rarely(in_, 4)) continue;
      if (field->name() == "tokens" && field->is_repeated()) {
        const PromptInput prompt = ConsumePrompt(in_, prompts_);
        for (uint32_t token : prompt.tokens) reflection->AddUInt32(&message, field, token);
        continue;
      }
      const int count = field->is_repeated() ? in_.ConsumeIntegralInRange(0, 3) : 1;
      for (int j = 0; j < count; ++j) SetField(message, field, depth);
    }
  }

  void SetField(Message& message, const FieldDescriptor* field, int depth) {
    const Reflection* reflection = message.GetReflection();
    const bool repeated = field->is_repeated();
    const std::string& name = field->name();
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t value = in_.ConsumeIntegral<uint64_t>();
        if (name == "session_id") value = PickId(session_ids_);
        if (name == "sequence_id") value = PickId(sequence_ids_);
        if (name == "epoch") {
          const uint64_t epochs[] = {0, server_.daemon->manager().epoch(), value};
          value = in_.PickValueInArray(epochs);
        }
        if (name == "start_sequence" && in_.ConsumeBool()) value %= 64;
        repeated ? reflection->AddUInt64(&message, field, value)
                 : reflection->SetUInt64(&message, field, value);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT32: {
        const uint32_t value = in_.ConsumeBool() ? in_.ConsumeIntegralInRange<uint32_t>(0, 64)
                                                 : in_.ConsumeIntegral<uint32_t>();
        repeated ? reflection->AddUInt32(&message, field, value)
                 : reflection->SetUInt32(&message, field, value);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT32: {
        const int32_t value = in_.ConsumeIntegral<int32_t>();
        repeated ? reflection->AddInt32(&message, field, value)
                 : reflection->SetInt32(&message, field, value);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        const int64_t value = in_.ConsumeIntegral<int64_t>();
        repeated ? reflection->AddInt64(&message, field, value)
                 : reflection->SetInt64(&message, field, value);
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        const bool value = in_.ConsumeBool();
        repeated ? reflection->AddBool(&message, field, value)
                 : reflection->SetBool(&message, field, value);
        break;
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        // Proto3 enums are open: a number no value names is legal on the wire.
        const int value = in_.ConsumeIntegralInRange(-1, 5);
        repeated ? reflection->AddEnumValue(&message, field, value)
                 : reflection->SetEnumValue(&message, field, value);
        break;
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        std::string value;
        if (name == "pool") {
          value =
              Rarely(in_, 8) ? in_.ConsumeRandomLengthString(80) : in_.PickValueInArray(kPoolNames);
        } else if (name == "tenant") {
          value = in_.PickValueInArray(kTenantNames);
        } else if (name == "key") {
          value = Rarely(in_, 8) ? in_.ConsumeRandomLengthString(300)
                                 : in_.PickValueInArray(kRendezvousKeys);
        } else if (name == "keys") {
          value =
              Rarely(in_, 8) ? in_.ConsumeRandomLengthString(80) : in_.PickValueInArray(kPageKeys);
        } else if (name == "parts") {
          value =
              Rarely(in_, 8) ? in_.ConsumeRandomLengthString(8) : in_.PickValueInArray(kPartNames);
        } else {
          value = in_.ConsumeRandomLengthString(in_.ConsumeBool() ? 32 : 5000);
        }
        repeated ? reflection->AddString(&message, field, std::move(value))
                 : reflection->SetString(&message, field, std::move(value));
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        // A manifest is mostly one that fits (or nearly fits) a pool, else anything.
        if (field->message_type() == v1::CompatibilityManifest::descriptor() && !Rarely(in_, 4)) {
          FillManifest(
              static_cast<v1::CompatibilityManifest*>(reflection->MutableMessage(&message, field)));
        } else if (depth < kMaxFieldDepth) {
          Fill(repeated ? *reflection->AddMessage(&message, field)
                        : *reflection->MutableMessage(&message, field),
               depth + 1);
        }
        break;
      default:  // double, float: no request has one
        break;
    }
  }

  // A manifest for one of the pools (ConsumeManifest).
  void FillManifest(v1::CompatibilityManifest* manifest) {
    const std::vector<Pool*> pools = server_.daemon->manager().pools();
    const Pool* pool = pools[in_.ConsumeIntegralInRange<size_t>(0, pools.size() - 1)];
    ToProto(ConsumeManifest(in_, pool->options().layout, pool->parts()), manifest);
  }

  // A PutBlocks stream: a header, then the bytes of the blocks it names in chunks. Mostly
  // well formed (checksums of the bytes sent, the byte count the header implies) so that puts
  // land; sometimes short, long, with a wrong checksum, a second header or a stray message.
  std::vector<std::string> PutStream() {
    std::vector<std::string> messages;
    v1::PutBlocksRequest header_message;
    v1::PutBlocksHeader& header = *header_message.mutable_header();
    if (Rarely(in_, 8)) {
      Fill(header, 1);  // anything at all
    } else {
      header.set_session_id(PickId(session_ids_));
      header.set_epoch(server_.daemon->manager().epoch());
      const size_t pool_index = in_.ConsumeIntegralInRange<size_t>(0, 1);
      header.set_pool(kPoolNames[pool_index]);
      const PromptInput prompt = ConsumePrompt(in_, prompts_);
      for (uint32_t token : prompt.tokens) header.add_tokens(token);
      if (Rarely(in_, 8)) Fill(*header.mutable_extra_keys(), 2);
      const Pool& pool = **server_.daemon->manager().FindPool(kPoolNames[pool_index]);
      const uint64_t block_bytes = pool.options().layout.BlockBytes();
      const uint32_t full_blocks = prompt.tokens.size() / pool.options().layout.block_size;
      const uint32_t first_block = Rarely(in_, 4) ? in_.ConsumeIntegralInRange<uint32_t>(0, 4) : 0;
      header.set_first_block(first_block);
      std::string data;
      const uint8_t fill = in_.ConsumeIntegral<uint8_t>();
      for (uint32_t block = first_block; block < full_blocks; ++block) {
        const std::string bytes(block_bytes, static_cast<char>(fill + block));
        header.add_block_checksums(BlockChecksum(bytes.data(), bytes.size()));
        data += bytes;
      }
      switch (in_.ConsumeIntegralInRange(0, 7)) {
        case 5:  // a checksum that does not match
          if (header.block_checksums_size() > 0) header.set_block_checksums(0, 1);
          break;
        case 6:  // too few or too many bytes
          data.resize(in_.ConsumeIntegralInRange<size_t>(0, data.size() + block_bytes));
          break;
        case 7:  // a checksum too few or too many
          in_.ConsumeBool() ? header.add_block_checksums(0)
                            : header.mutable_block_checksums()->Clear();
          break;
        default:
          break;
      }
      messages.push_back(header_message.SerializeAsString());
      for (size_t offset = 0; offset < data.size();) {
        const size_t chunk = in_.ConsumeIntegralInRange<size_t>(1, data.size() - offset);
        v1::PutBlocksRequest chunk_message;
        chunk_message.set_data(data.substr(offset, chunk));
        messages.push_back(chunk_message.SerializeAsString());
        offset += chunk;
      }
      return MaybeStray(std::move(messages));
    }
    messages.push_back(header_message.SerializeAsString());
    return MaybeStray(std::move(messages));
  }

  // Now and then an extra message somewhere in the stream: a second header or raw bytes.
  std::vector<std::string> MaybeStray(std::vector<std::string> messages) {
    if (Rarely(in_, 8)) {
      const size_t at = in_.ConsumeIntegralInRange<size_t>(0, messages.size());
      messages.insert(messages.begin() + at,
                      in_.ConsumeBool() ? messages.front() : in_.ConsumeRandomLengthString(64));
    }
    return messages;
  }

  uint64_t PickId(const std::vector<uint64_t>& ids) {
    if (ids.empty() || Rarely(in_, 8)) return in_.ConsumeIntegral<uint64_t>();
    return ids[in_.ConsumeIntegralInRange<size_t>(0, ids.size() - 1)];
  }

  // Runs `call` to its end; remembers the session and sequence ids it got back.
  void Send(const Call& call) {
    const std::string path =
        absl::StrCat("/", server_.service->full_name(), "/", call.method->name());
    // Calls that wait for the daemon's state to change (an await on a key nobody publishes, a
    // watch past the events there are) end at a short deadline; the rest never need it.
    const bool waits =
        call.method->name() == "AwaitRendezvous" || call.method->name() == "WatchEvents";
    const absl::Time deadline = absl::Now() + (waits ? absl::Milliseconds(5) : absl::Seconds(30));
    BlockStream stream(server_.stub.get(), path.c_str(), [&](grpc::ClientContext* context) {
      context->set_deadline(absl::ToChronoTime(deadline));
      if (call.credential >= 0) {
        context->AddMetadata("authorization", absl::StrCat("Bearer ", kTokens[call.credential]));
      }
    });
    bool open = true;
    for (size_t i = 0; open && i < call.messages.size(); ++i) {
      grpc::Slice slice(call.messages[i]);
      const grpc::ByteBuffer buffer(&slice, 1);
      const bool last = i + 1 == call.messages.size() && call.half_close;
      open = last ? stream.WriteLast(buffer) : stream.Write(buffer);
    }
    if (open && call.half_close && call.messages.empty()) open = stream.WritesDone();
    bool ended = false;
    if (call.half_close) {
      for (int i = 0; i < call.max_reads; ++i) {
        grpc::ByteBuffer response;
        if (!stream.Read(&response)) {
          ended = true;
          break;
        }
        Remember(call.method->output_type(), response);
      }
    }
    if (!ended) stream.Cancel();
    stream.Finish();
  }

  void Remember(const Descriptor* type, const grpc::ByteBuffer& response) {
    grpc::Slice flat;
    if (!response.DumpToSingleSlice(&flat).ok()) return;
    std::unique_ptr<Message> message(NewMessage(type));
    if (!message->ParseFromArray(flat.begin(), flat.size())) return;
    const Reflection* reflection = message->GetReflection();
    const auto take = [&](const char* name, std::vector<uint64_t>& ids) {
      const FieldDescriptor* field = type->FindFieldByName(name);
      if (field == nullptr || field->cpp_type() != FieldDescriptor::CPPTYPE_UINT64) return;
      const uint64_t id = reflection->GetUInt64(*message, field);
      if (id != 0) ids.push_back(id);
    };
    take("session_id", session_ids_);
    take("sequence_id", sequence_ids_);
  }

  FuzzedDataProvider& in_;
  Server& server_;
  std::vector<uint64_t> session_ids_;
  std::vector<uint64_t> sequence_ids_;
  std::vector<std::vector<uint32_t>> prompts_;
};

// After an input: every session closed, the daemon answers Ping and holds nothing. Streams the
// input cut off may still be unwinding on gRPC's threads, so the pools are polled until they are
// back to nothing referenced (bounded: anything still held after 20 s is a leak; streams
// unwind in milliseconds).
void CheckDaemonAfterInput(Server& server) {
  CacheManager& manager = server.daemon->manager();
  // A call the input cancelled may still open a session after the client saw it end: closed
  // here as it appears (its lease would end it in time; the input's clock may never get there).
  const auto close_every_session = [&] {
    for (const SessionRegistry::Listed& listed : manager.sessions().List("")) {
      (void)manager.CloseSession(listed.session->id, 0, listed.session->principal);
    }
  };
  close_every_session();
  {
    BlockStream ping(server.stub.get(), "/kvcache.v1.KvCache/Ping", absl::Now() + absl::Seconds(30),
                     /*wait_for_ready=*/true);
    grpc::Slice empty("");
    FUZZ_CHECK(ping.WriteLast(grpc::ByteBuffer(&empty, 1)), "Ping: write failed");
    grpc::ByteBuffer response;
    FUZZ_CHECK(ping.Read(&response), "Ping: no response");
    const grpc::Status status = ping.Finish();
    FUZZ_CHECK(status.ok(), "Ping: %s", status.error_message().c_str());
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  for (;;) {
    close_every_session();
    bool idle = manager.sessions().size() == 0 && manager.rendezvous().parked_waiters() == 0;
    for (const char* tenant : {"default", "globex", "ops"}) {
      idle = idle && manager.quotas().InUse(tenant, QuotaResource::kPutBytesInFlight) == 0 &&
             manager.quotas().InUse(tenant, QuotaResource::kOpenSequences) == 0 &&
             manager.quotas().InUse(tenant, QuotaResource::kSessions) == 0;
    }
    for (Pool* pool : manager.pools()) {
      const PoolStatsSnapshot stats = pool->Stats();
      idle = idle && stats.referenced == 0 && stats.open_sequences == 0;
    }
    if (idle) break;
    if (absl::Now() > give_up) {
      for (Pool* pool : manager.pools()) {
        const PoolStatsSnapshot stats = pool->Stats();
        std::fprintf(stderr, "%s: referenced %u, open sequences %u\n", pool->options().name.c_str(),
                     stats.referenced, stats.open_sequences);
      }
      for (const char* tenant : {"default", "globex", "ops"}) {
        std::fprintf(stderr, "tenant %s: sessions %llu, open sequences %llu, put bytes %llu\n",
                     tenant,
                     static_cast<unsigned long long>(
                         manager.quotas().InUse(tenant, QuotaResource::kSessions)),
                     static_cast<unsigned long long>(
                         manager.quotas().InUse(tenant, QuotaResource::kOpenSequences)),
                     static_cast<unsigned long long>(
                         manager.quotas().InUse(tenant, QuotaResource::kPutBytesInFlight)));
      }
      FUZZ_CHECK(false,
                 "the daemon still holds resources 20 s after every session closed "
                 "(%zu sessions, %zu parked awaits)",
                 manager.sessions().size(), manager.rendezvous().parked_waiters());
    }
    absl::SleepFor(absl::Microseconds(100));
  }
  for (const Pool* pool : manager.pools()) CheckPool(*pool);
}

}  // namespace
}  // namespace kvcache

// libFuzzer's own leak detection (-detect_leaks) runs when an input's mallocs and frees differ,
// which gRPC's threads make true of nearly every input: it would rerun each under LeakSanitizer,
// at a tenth of the speed. The test runs with -detect_leaks=0, which also turns off the check at
// exit; this puts that one back: memory the daemon lost track of during the run is reported at
// exit (what the daemon still holds is reachable from TheServer and is not).
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Requests with invalid UTF-8 in string fields are meant; protobuf would log every one.
  google::protobuf::SetLogHandler(nullptr);
  std::atexit([] {
    if (__lsan_do_recoverable_leak_check() != 0) std::_Exit(1);
  });
  kvcache::Server& server = kvcache::TheServer();
  // At exit, how deep the run got: states a shallow harness would never reach.
  static kvcache::Server* const reached = &server;
  std::atexit([] {
    for (kvcache::Pool* pool : reached->daemon->manager().pools()) {
      const kvcache::PoolStatsSnapshot stats = pool->Stats();
      std::fprintf(stderr,
                   "reached %s: hit blocks %llu, miss blocks %llu, published %llu, resurrected "
                   "%llu, evicted %llu; put %llu bytes (%llu puts failed), got %llu bytes (%llu "
                   "gets failed)\n",
                   pool->options().name.c_str(), (unsigned long long)stats.hit_blocks,
                   (unsigned long long)stats.miss_blocks, (unsigned long long)stats.pool.published,
                   (unsigned long long)stats.pool.resurrections,
                   (unsigned long long)stats.pool.evictions,
                   (unsigned long long)pool->transfers().put_bytes.load(),
                   (unsigned long long)pool->transfers().put_failures.load(),
                   (unsigned long long)pool->transfers().got_bytes.load(),
                   (unsigned long long)pool->transfers().get_failures.load());
    }
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvcache::Server& server = kvcache::TheServer();
  FuzzedDataProvider in(data, size);
  kvcache::Harness(in, server).Run();
  kvcache::CheckDaemonAfterInput(server);
  return 0;
}
