// The disk tier's loads (tiers/disk_tier_impl.h): pinned under the tier's mutex, read on one of
// the reader rings and verified without it, then unpinned.
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"
#include "common/status_macros.h"
#include "tiers/disk_tier_impl.h"
#include "tiers/record_codec.h"

namespace kvcache {

std::vector<absl::Status> DiskTier::Impl::LoadMany(absl::Span<const LoadRequest> requests) {
  std::vector<absl::Status> results(requests.size());
  std::vector<Pinned> pinned;
  pinned.reserve(requests.size());
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < requests.size(); ++i) {
      results[i] = PinLocked(requests[i], i, &pinned);
    }
  }
  if (pinned.empty()) return results;
  ReadPinned(pinned, requests, &results);
  {
    absl::MutexLock lock(&mu_);
    for (const Pinned& pin : pinned) {
      UnpinLocked(pin, results[pin.request], requests[pin.request].expected->tenant);
      if (results[pin.request].ok() && ReadsInPlace(requests[pin.request].out)) {
        ++stats_.loads_in_place;
      }
    }
  }
  changes_.Deliver();
  return results;
}

absl::Status DiskTier::Impl::PinLocked(const LoadRequest& request, size_t i,
                                       std::vector<Pinned>* pinned) {
  ++stats_.loads;
  if (request.out.size() != options_.pool.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load into ", request.out.size(), " bytes; blocks have ", options_.pool.block_bytes));
  }
  const uint32_t slot = table_.Find(request.expected->hash);
  if (slot == kNoSlot) {
    ++stats_.load_misses;
    return absl::NotFoundError("not in the disk tier");
  }
  const Record& record = records_[slot];
  absl::string_view mismatch = RecordMismatch(record.identity, *request.expected);
  if (!mismatch.empty()) {
    ++stats_.load_mismatches;
    return absl::NotFoundError(absl::StrCat("disk record differs in ", mismatch));
  }
  table_.Pin(slot);
  pinned->push_back({i, slot, record.sequence});
  return absl::OkStatus();
}

void DiskTier::Impl::UnpinLocked(const Pinned& pin, const absl::Status& result,
                                 absl::string_view tenant) {
  if (result.ok()) {
    ++stats_.load_hits;
    stats_.bytes_read += slot_bytes_;
  } else if (absl::IsDataLoss(result)) {
    ++stats_.load_corrupt;
  } else if (absl::IsUnauthenticated(result)) {
    ++stats_.load_unopened;
    open_failures_.Add(tenant);
  } else {
    ++stats_.read_errors;
  }
  if (!result.ok() && table_.state(pin.slot) == SlotTable::State::kStored) {
    DropLocked(pin.slot);  // never served again; the slot is rewritten later
  }
  table_.Unpin(pin.slot);  // a hit makes the record the most recently used
}

void DiskTier::Impl::ReadPinned(absl::Span<const Pinned> pinned,
                                absl::Span<const LoadRequest> requests,
                                std::vector<absl::Status>* results) {
  Reader* reader = nullptr;
  for (auto& candidate : readers_) {
    if (candidate->mu.TryLock()) {
      reader = candidate.get();
      break;
    }
  }
  if (reader == nullptr) {
    reader = readers_[next_reader_.fetch_add(1) % readers_.size()].get();
    reader->mu.Lock();
  }
  IoRing& ring = *reader->ring;
  // Sealed records' bytes, opened beside this thread (Answer).
  TaskWorkers::Group opening(sealer_.has_value() ? options_.seal_workers.get() : nullptr);
  const size_t buffers = 2 * options_.read_depth;
  auto buffer = [&](size_t i) { return reader->buffers->data() + i * slot_bytes_; };
  std::vector<size_t> free_buffers(buffers);
  for (size_t i = 0; i < buffers; ++i) free_buffers[i] = buffers - 1 - i;
  std::vector<size_t> owner(buffers);  // the pinned entry a buffer is read for
  std::vector<std::array<iovec, 2>> iovecs(buffers);
  size_t next = 0;  // pinned entries issued
  auto issue = [&] {
    const size_t i = free_buffers.back();
    free_buffers.pop_back();
    owner[i] = next;
    const Pinned& pin = pinned[next++];
    if (options_.testing_before_read) options_.testing_before_read();
    absl::Span<char> out = requests[pin.request].out;
    if (ReadsInPlace(out)) {
      // The header into the buffer, the bytes straight into the caller's memory: no copy.
      iovecs[i] = {iovec{buffer(i), header_bytes_}, iovec{out.data(), out.size()}};
      ring.QueueReadv(fd_, iovecs[i].data(), 2, SlotOffset(pin.slot), i);
    } else {
      ring.QueueRead(fd_, buffer(i), slot_bytes_, SlotOffset(pin.slot), i);
    }
  };
  while (next < std::min<size_t>(options_.read_depth, pinned.size())) issue();
  absl::Status status = ring.Submit();
  std::vector<bool> answered(pinned.size());
  for (size_t completed = 0; status.ok() && completed < pinned.size(); ++completed) {
    absl::StatusOr<IoRing::Completion> completion = ring.WaitOne();
    if (!completion.ok()) {
      status = completion.status();
      break;
    }
    if (next < pinned.size()) {
      issue();
      status = ring.Submit();
    }
    const size_t i = completion->tag;
    Answer(pinned[owner[i]], buffer(i), completion->result, requests, results, &opening);
    answered[owner[i]] = true;
    free_buffers.push_back(i);
  }
  opening.Wait();
  // A failed ring fails every load not yet answered.
  for (size_t p = 0; p < pinned.size(); ++p) {
    if (!answered[p]) (*results)[pinned[p].request] = status;
  }
  reader->mu.Unlock();
}

void DiskTier::Impl::Answer(const Pinned& pin, const char* slot, int read_result,
                            absl::Span<const LoadRequest> requests,
                            std::vector<absl::Status>* results, TaskWorkers::Group* opening) const {
  const LoadRequest& request = requests[pin.request];
  absl::Status& result = (*results)[pin.request];
  if (read_result != static_cast<int>(slot_bytes_)) {
    result = read_result < 0
                 ? ErrnoError("reading slot of", options_.path, -read_result)
                 : absl::InternalError(absl::StrCat("short read of a slot of ", options_.path));
    return;
  }
  OpenedHead opened;
  result = VerifyHeader(slot, pin.sequence, *request.expected, &opened);
  if (!result.ok()) return;
  if (sealer_.has_value() && ReadsInPlace(request.out)) {
    // Decrypted in the caller's memory, beside this thread: it goes on reaping and issuing reads.
    opening->Run([this, opened = std::move(opened), &request, &result] {
      result = VerifyBytes(opened, request.out.data(), request.out.data(), *request.expected,
                           request.checksum);
    });
    return;
  }
  // Read in place, or into the buffer and from there into the caller's memory.
  const char* bytes = ReadsInPlace(request.out) ? request.out.data() : slot + header_bytes_;
  result = VerifyBytes(opened, bytes, request.out.data(), *request.expected, request.checksum);
}

bool DiskTier::Impl::ReadsInPlace(absl::Span<char> out) const {
  return out.size() % kRecordAlignment == 0 &&
         reinterpret_cast<uintptr_t>(out.data()) % kRecordAlignment == 0;
}

absl::Status DiskTier::Impl::ReadHeader(const char* header_bytes, const std::string* tenant,
                                        OpenedHead* opened) const {
  const absl::string_view head(header_bytes, header_bytes_);
  if (!sealer_.has_value()) {
    absl::StatusOr<RecordHeader> header = DecodeRecordHeader(head);
    if (!header.ok()) return header.status();
    opened->header = *std::move(header);
    return absl::OkStatus();
  }
  absl::StatusOr<OpenedHead> open =
      tenant == nullptr ? sealer_->OpenHead(head) : sealer_->OpenHead(head, *tenant);
  if (!open.ok()) return open.status();
  *opened = *std::move(open);
  return absl::OkStatus();
}

absl::Status DiskTier::Impl::VerifyHeader(const char* header_bytes, uint64_t sequence,
                                          const BlockRecordIdentity& expected,
                                          OpenedHead* opened) const {
  const absl::Status read = ReadHeader(header_bytes, &expected.tenant, opened);
  if (absl::IsUnauthenticated(read)) return read;  // sealed for another tenant, or changed
  if (!read.ok()) {
    return absl::DataLossError(absl::StrCat("disk record header unreadable: ", read.message()));
  }
  const RecordHeader& header = opened->header;
  absl::string_view foreign = PoolMismatch(header.pool, options_.pool);
  if (!foreign.empty()) return absl::DataLossError(absl::StrCat("disk record of ", foreign));
  // The index said this slot holds `sequence`: anything else means the slot changed under it.
  if (header.sequence != sequence) return absl::DataLossError("disk record replaced");
  absl::string_view mismatch = RecordMismatch(header.block, expected);
  if (!mismatch.empty()) {
    return absl::DataLossError(absl::StrCat("disk record differs in ", mismatch));
  }
  return absl::OkStatus();
}

absl::Status DiskTier::Impl::VerifyBytes(const OpenedHead& opened, const char* bytes, char* out,
                                         const BlockRecordIdentity& expected,
                                         uint64_t* checksum) const {
  const uint64_t block_bytes = options_.pool.block_bytes;
  if (sealer_.has_value()) {
    // Decrypted into the caller's memory (in place when read there), authenticated as a whole.
    RETURN_IF_ERROR(sealer_->OpenBody(opened, expected, {SealPiece{bytes, out, block_bytes}}));
    bytes = out;
  }
  if (BlockChecksum(bytes, block_bytes) != opened.header.block.checksum) {
    return absl::DataLossError("disk record bytes fail their checksum");
  }
  if (bytes != out) std::memcpy(out, bytes, block_bytes);
  if (checksum != nullptr) *checksum = opened.header.block.checksum;
  return absl::OkStatus();
}

}  // namespace kvcache
