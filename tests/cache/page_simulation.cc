// PageSimulation (page_simulation.h) and the page model's helpers.
#include "tests/cache/page_simulation.h"

namespace kvcache {
namespace simulation {

size_t ModelHitRule(const std::vector<uint32_t>& leading_masks, uint32_t wanted) {
  for (size_t end = leading_masks.size(); end > 0; --end) {
    bool restorable = true;
    for (size_t part = 0; part < std::size(kSimPageParts) && restorable; ++part) {
      if ((wanted & (1u << part)) == 0) continue;
      const uint32_t trailing = kSimPageParts[part].trailing_pages;
      const size_t from = trailing == 0 || end < trailing ? 0 : end - trailing;
      for (size_t page = from; page < end; ++page) {
        if ((leading_masks[page] & (1u << part)) == 0) restorable = false;
      }
    }
    if (restorable) return end;
  }
  return 0;
}

std::string DescribeKeys(absl::Span<const std::string> keys) {
  std::vector<std::string> shown;
  for (const std::string& key : keys) {
    shown.push_back(key.size() > 16 ? absl::StrCat("p..", key.substr(key.size() - 2)) : key);
  }
  return absl::StrCat("[", absl::StrJoin(shown, ","), "]");
}

std::string DescribeProbe(const PageProbe& probe) {
  if (!probe.present) return "absent";
  return absl::StrCat(probe.in_tier1 ? "tier1" : "below", "/0x", absl::Hex(probe.mask));
}

std::string DescribeProbes(const std::vector<PageProbe>& probes) {
  std::vector<std::string> shown;
  for (const PageProbe& probe : probes) shown.push_back(DescribeProbe(probe));
  return absl::StrCat("{", absl::StrJoin(shown, " "), "}");
}

absl::Status PageSimulation::Run(SimTotals* totals) {
  num_blocks_ = Uniform(4, 20);
  options_ = testing::SmallPoolOptions("pages", num_blocks_, kSimPageTokens);
  if (options_.layout.BlockBytes() != kSimPageBytes) return Fail("layout is not 128 bytes");
  ASSIGN_OR_RETURN(options_.parts, ParsePageParts(kSimPageSpec, kSimPageBytes));
  options_.host_tier_bytes = uint64_t{Uniform(1, (disk_ ? 1 : 2) * num_blocks_)} * kSimPageBytes;
  options_.testing_manual_offload = true;
  if (disk_) {
    disk_dir_.emplace();
    options_.disk_tier_path = disk_dir_->File("pages.tier");
    options_.disk_tier_bytes = uint64_t{Uniform(1, 2 * num_blocks_)} * (4096 + 4096);
    // Room for every store of one offload, so a full queue never refuses one (see Simulation).
    options_.testing_disk_tier_options = [](DiskTierOptions* disk) {
      disk->max_queued_stores = 48;
    };
  }
  auto memory =
      testing::CreatePoolMemory(testing::PoolMemoryKind::kHost, kSimPageBytes, num_blocks_);
  if (!memory.ok()) return memory.status();
  manager_ = std::make_unique<CacheManager>(SessionLimits{}, &clock_, kEpoch);
  RETURN_IF_ERROR(manager_->AddPool(options_, *std::move(memory)));
  pool_ = manager_->pools().front();
  RETURN_IF_ERROR(CheckPoolParts());
  for (const char* config : {"cfg-1", "cfg-2"}) {
    ASSIGN_OR_RETURN(std::shared_ptr<const CompatibilityManifest> manifest,
                     CompatibilityManifest::Create(
                         ManifestFields{.model_id = options_.model_id,
                                        .model_config_digest = config,
                                        .kv_dtype = "fp32",
                                        .page_tokens = kSimPageTokens,
                                        .parts = {{"kv", 64}, {"swa", 32}, {"state", 32}}}));
    manifests_.push_back(std::move(manifest));
  }
  // Keys up to kMaxPageKeyBytes; the long ones share their first 16 bytes (the tokens a hit
  // compares), so only the key's digest tells them apart.
  for (int i = 0; i < 6; ++i) keys_.push_back(absl::StrCat("k", i));
  for (int i = 0; i < 4; ++i) {
    keys_.push_back(absl::StrCat(std::string(16, 'p'), "/", std::string(40, 'x'), "/", i));
  }
  trace_.push_back(absl::StrCat("pool: ", num_blocks_, " pages, tier 2 ",
                                options_.host_tier_bytes / kSimPageBytes, " pages",
                                disk_ ? ", disk tier" : ""));

  for (int op = 0; op < num_ops_; ++op) {
    ++totals->operations;
    RETURN_IF_ERROR(Step());
    RETURN_IF_ERROR(CheckAfterStep());
  }
  // Every pin's TTL passes; an acquire sweeps them; then every session ends.
  clock_.Advance(Pool::kMaxPinTtl);
  for (uint64_t id : session_order_) {
    SessionInfo& info = sessions_.at(id);
    if (info.ended) continue;
    RETURN_IF_ERROR(ExpectCode(manager_->sessions().KeepAlive(id), absl::StatusCode::kAborted,
                               "keepalive after a day"));
  }
  RETURN_IF_ERROR(ExpireSessions());
  RETURN_IF_ERROR(CheckAfterStep());
  const PoolStatsSnapshot stats = pool_->Stats();
  if (stats.referenced != 0 || stats.open_sequences != 0) {
    return Fail(absl::StrCat(stats.referenced, " blocks and ", stats.open_sequences,
                             " sequences held after every session ended"));
  }
  totals->seeds += 0;  // RunPageSeeds counts seeds
  totals->hit_blocks += hit_pages_;
  totals->tier_hit_blocks += below_hit_pages_;
  totals->disk_hit_blocks += disk_hit_pages_;
  totals->evictions += stats.pool.evictions;
  totals->offloaded_blocks += offloaded_;
  totals->exact_steps += exact_steps_;
  totals->partial_hits += partial_hits_;
  totals->ended_mid_put += ended_mid_put_;
  totals->ambiguous_walks += ambiguous_walks_;
  if (stats.host_tier.has_value()) totals->superseded += stats.host_tier->store.superseded;
  if (stats.disk_tier.has_value()) totals->superseded += stats.disk_tier->store.superseded;
  return absl::OkStatus();
}

std::string PageSimulation::PageBytes(const std::string& ns, const std::string& key,
                                      uint32_t mask) {
  const std::string seed = absl::StrCat(ns, "|", key, "|", mask);
  std::string bytes(kSimPageBytes, '\0');
  for (size_t b = 0; b < bytes.size(); ++b) {
    bytes[b] = static_cast<char>(seed[b % seed.size()] * 31 + b);
  }
  return bytes;
}

absl::Status PageSimulation::CheckPoolParts() {
  const std::vector<PagePartLayout>& parts = pool_->parts();
  uint64_t offset = 0;
  bool same = parts.size() == std::size(kSimPageParts);
  for (size_t i = 0; same && i < parts.size(); ++i) {
    const PagePartSpec& spec = kSimPageParts[i];
    same =
        parts[i].name == spec.name && parts[i].offset == offset && parts[i].bytes == spec.bytes &&
        parts[i].policy ==
            (spec.trailing_pages == 0 ? PartHitPolicy::kAllPages : PartHitPolicy::kTrailingPages) &&
        (spec.trailing_pages == 0 || parts[i].trailing_pages == spec.trailing_pages);
    offset += spec.bytes;
  }
  return same ? absl::OkStatus() : Fail("the pool's parts are not the spec's");
}

uint64_t PageSimulation::PickSession() {
  std::vector<uint64_t> live;
  for (uint64_t id : session_order_) {
    if (!sessions_.at(id).ended) live.push_back(id);
  }
  return live.empty() ? 0 : live[Uniform(0, live.size() - 1)];
}

std::vector<std::string> PageSimulation::PickKeys() {
  std::vector<std::string> keys;
  const uint32_t count = Uniform(1, 5);
  // Mostly a run of neighbouring keys, as an engine's pages of one prompt; sometimes any.
  const uint32_t first = Uniform(0, keys_.size() - 1);
  for (uint32_t i = 0; i < count; ++i) {
    keys.push_back(Chance(80) ? keys_[(first + i) % keys_.size()]
                              : keys_[Uniform(0, keys_.size() - 1)]);
  }
  return keys;
}

uint32_t PageSimulation::PickMask() {
  // Mostly kv with or without the others, as an engine checkpoints state now and then.
  if (Chance(75)) return 1u | (Uniform(0, 3) << 1);
  return Uniform(1, kSimAllParts);
}

absl::Status PageSimulation::Step() {
  const uint32_t dice = Uniform(0, 99);
  if (live_sessions() < 2 || dice < 5) return OpenSession();
  if (dice < 25) return Reserve();
  if (dice < 33) return CommitPending();
  if (dice < 36) return ReleasePending();
  if (dice < 50) return Exists();
  if (dice < 65) return Acquire();
  if (dice < 71) return ReleaseHeld();
  if (dice < 78) return PinPages();
  if (dice < 82) return CloseSession();
  if (dice < 88) return AdvanceAndExpire();
  if (dice < 91) return KeepAlive();
  return Offload();
}

size_t PageSimulation::live_sessions() const {
  size_t live = 0;
  for (const auto& [id, info] : sessions_) live += info.ended ? 0 : 1;
  return live;
}

absl::Status PageSimulation::OpenSession() {
  const std::string tenant(kTenants[Uniform(0, 1)]);
  const int manifest = Chance(8) ? -1 : static_cast<int>(Uniform(0, 1));
  const absl::Duration ttl = absl::Seconds(Uniform(2, 8));
  auto session = manager_->sessions().Open(absl::StrCat("uid:", tenant), tenant, "sim", ttl,
                                           manifest < 0 ? nullptr : manifests_[manifest]);
  trace_.push_back(absl::StrCat("open-session ", tenant, " manifest ", manifest, " ttl ",
                                absl::FormatDuration(ttl)));
  if (!session.ok()) return session.status();
  trace_.back() += absl::StrCat(" -> ", (*session)->id);
  sessions_[(*session)->id] = SessionInfo{*session, tenant, manifest, clock_.Now() + ttl};
  session_order_.push_back((*session)->id);
  return absl::OkStatus();
}

absl::Status PageSimulation::ExpectNoManifestRefused(const SessionInfo& info,
                                                     const std::vector<std::string>& keys) {
  RETURN_IF_ERROR(ExpectCode(pool_->ExistsPages(*info.session, keys, kSimAllParts),
                             absl::StatusCode::kFailedPrecondition, "exists without manifest"));
  RETURN_IF_ERROR(ExpectCode(pool_->ReservePages(*info.session, keys, {}),
                             absl::StatusCode::kFailedPrecondition, "put without manifest"));
  return ExpectCode(pool_->AcquirePages(*info.session, keys, kSimAllParts, 0),
                    absl::StatusCode::kFailedPrecondition, "acquire without manifest");
}

absl::StatusOr<PageProbe> PageSimulation::ProbeKey(uint64_t session_id, const std::string& key) {
  const Session& session = *sessions_.at(session_id).session;
  ASSIGN_OR_RETURN(PagesFound any, pool_->ExistsPages(session, {key}, 0));
  PageProbe probe;
  probe.present = any.num_pages == 1;
  probe.in_tier1 = any.by_tier.pool == 1;
  if (!probe.present) return probe;
  for (size_t part = 0; part < std::size(kSimPageParts); ++part) {
    ASSIGN_OR_RETURN(PagesFound found, pool_->ExistsPages(session, {key}, 1u << part));
    if (found.num_pages == 1) probe.mask |= 1u << part;
  }
  // Every present page holds parts, and only parts some put of this key here committed.
  const std::string ns = NamespaceOf(session_id);
  auto it = committed_.find({ns, key});
  if (probe.mask == 0 || it == committed_.end() || it->second.count(probe.mask) == 0) {
    return Fail(absl::StrCat("key ", key, " in ", ns, " reports ", DescribeProbe(probe),
                             ", never committed so"));
  }
  if (Exact()) {
    auto known = tier1_.find({ns, key});
    const PageProbe want{known != tier1_.end(), known != tier1_.end(),
                         known == tier1_.end() ? 0 : known->second};
    if (!(probe == want)) {
      return Fail(absl::StrCat("key ", key, " in ", ns, " reports ", DescribeProbe(probe),
                               " before any eviction; the model says ", DescribeProbe(want)));
    }
  }
  return probe;
}

absl::StatusOr<std::vector<PageProbe>> PageSimulation::ProbeKeys(
    uint64_t session_id, const std::vector<std::string>& keys) {
  std::vector<PageProbe> probes;
  for (const std::string& key : keys) {
    ASSIGN_OR_RETURN(PageProbe probe, ProbeKey(session_id, key));
    probes.push_back(probe);
  }
  return probes;
}

PageSimulation::Expected PageSimulation::Expect(const std::vector<PageProbe>& probes,
                                                uint32_t wanted) {
  Expected expected;
  while (expected.present < probes.size() && probes[expected.present].present) {
    ++expected.present;
  }
  expected.ambiguous_at = expected.present;
  std::vector<uint32_t> masks;
  bool below_seen = false;
  bool tier1_after_below = false;
  for (size_t j = 0; j < expected.present; ++j) {
    if (disk_ && !probes[j].in_tier1 && expected.ambiguous_at == expected.present) {
      expected.ambiguous_at = j;
    }
    if (j < expected.ambiguous_at) masks.push_back(probes[j].mask);
    tier1_after_below |= below_seen && probes[j].in_tier1;
    below_seen |= !probes[j].in_tier1;
  }
  expected.hit = ModelHitRule(masks, wanted);
  if (tier1_after_below) ++ambiguous_walks_;
  return expected;
}

size_t PageSimulation::InTier1(const std::vector<PageProbe>& probes, size_t pages) {
  size_t in_tier1 = 0;
  for (size_t j = 0; j < std::min(pages, probes.size()); ++j) in_tier1 += probes[j].in_tier1;
  return in_tier1;
}

absl::Status PageSimulation::Reserve() {
  const uint64_t session_id = PickSession();
  if (session_id == 0) return absl::OkStatus();
  const SessionInfo& info = sessions_.at(session_id);
  std::vector<std::string> keys = PickKeys();
  if (info.manifest < 0) return ExpectNoManifestRefused(info, keys);
  std::vector<uint32_t> masks;
  if (Chance(80)) {
    for (size_t i = 0; i < keys.size(); ++i) masks.push_back(PickMask());
  }
  std::vector<uint32_t> want_masks = masks;
  if (want_masks.empty()) want_masks.assign(keys.size(), kSimAllParts);
  trace_.push_back(absl::StrCat("reserve session ", session_id, " ", DescribeKeys(keys), " masks [",
                                absl::StrJoin(want_masks, ","), "]"));
  const std::string ns = NamespaceOf(session_id);
  const bool exact = Exact();
  // Which keys are fresh: those tier 1 does not hold with at least the put's parts.
  std::vector<bool> fresh(keys.size());
  size_t num_fresh = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = tier1_.find({ns, keys[i]});
    fresh[i] = it == tier1_.end() || (it->second & want_masks[i]) != want_masks[i];
    num_fresh += fresh[i] ? 1 : 0;
  }
  const PoolStatsSnapshot before = pool_->Stats();
  absl::StatusOr<ReservedPages> reserved =
      pool_->ReservePages(*info.session, keys, absl::MakeConstSpan(masks));
  trace_.back() +=
      absl::StrCat(" -> ", reserved.ok() ? absl::StrCat(reserved->sequence_id, " blocks ",
                                                        absl::StrJoin(reserved->block_ids, ","))
                                         : reserved.status().ToString());
  const bool had_unswept_pins = UnsweptExpiredPins();
  pins_swept_at_ = clock_.Now();
  if (exact) {
    // Pins past their TTL are swept first: they can only make room.
    const bool fits = num_fresh <= before.free + before.evictable;
    if (fits && !reserved.ok()) return Fail("a put that fits was refused");
    if (!fits && !had_unswept_pins &&
        reserved.status().code() != absl::StatusCode::kResourceExhausted) {
      return Fail("a put that does not fit was not RESOURCE_EXHAUSTED");
    }
  }
  if (!reserved.ok()) {
    if (reserved.status().code() != absl::StatusCode::kResourceExhausted) {
      return reserved.status();
    }
    return absl::OkStatus();
  }
  if (exact) {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (fresh[i] != (reserved->block_ids[i] != kNoBlock)) {
        return Fail(absl::StrCat("key ", keys[i], " reserved ",
                                 reserved->block_ids[i] == kNoBlock ? "as a duplicate" : "fresh",
                                 "; the model says otherwise"));
      }
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (reserved->block_ids[i] == kNoBlock) continue;
    RETURN_IF_ERROR(
        pool_->WriteBlock(reserved->block_ids[i], 0, PageBytes(ns, keys[i], want_masks[i])));
  }
  pending_[reserved->sequence_id] =
      Put{session_id, std::move(keys), std::move(want_masks), reserved->block_ids};
  if (Chance(70)) return Commit(reserved->sequence_id);
  if (Chance(15)) return Release(reserved->sequence_id);
  return absl::OkStatus();
}

absl::Status PageSimulation::CommitPending() {
  if (pending_.empty()) return absl::OkStatus();
  auto it = std::next(pending_.begin(), Uniform(0, pending_.size() - 1));
  return Commit(it->first);
}

absl::Status PageSimulation::ReleasePending() {
  if (pending_.empty()) return absl::OkStatus();
  auto it = std::next(pending_.begin(), Uniform(0, pending_.size() - 1));
  return Release(it->first);
}

absl::Status PageSimulation::Commit(uint64_t sequence_id) {
  Put put = pending_.at(sequence_id);
  pending_.erase(sequence_id);
  const SessionInfo& info = sessions_.at(put.session_id);
  trace_.push_back(absl::StrCat("commit ", sequence_id, " of session ", put.session_id));
  const std::string ns = NamespaceOf(put.session_id);
  const bool exact = Exact();
  absl::StatusOr<CommittedPages> committed = pool_->CommitPages(*info.session, sequence_id);
  trace_.back() +=
      absl::StrCat(" -> ", committed.ok() ? absl::StrCat(committed->num_published, " published, ",
                                                         committed->num_duplicates, " duplicates")
                                          : committed.status().ToString());
  if (info.ended) {
    // The session ended mid-put: its reservation went with it, and nothing was published.
    ++ended_mid_put_;
    if (committed.ok()) return Fail("a put committed after its session ended");
    // The model did not take its pages: a later probe of any of them, exact until the first
    // eviction, finds them absent unless another put published them.
    return absl::OkStatus();
  }
  if (!committed.ok()) return committed.status();
  uint32_t published = 0;
  std::set<std::pair<std::string, std::string>> published_now;  // held by this put
  for (size_t i = 0; i < put.keys.size(); ++i) {
    if (put.blocks[i] == kNoBlock) continue;
    committed_[{ns, put.keys[i]}].insert(put.masks[i]);
    if (!exact) continue;
    const std::pair<std::string, std::string> page{ns, put.keys[i]};
    auto [it, fresh] = tier1_.emplace(page, put.masks[i]);
    // A later copy with more parts supersedes tier 1's when nobody holds that (a copy this
    // put published is held by it); otherwise it is a duplicate.
    const bool more_parts = (it->second & put.masks[i]) != put.masks[i];
    if (!fresh && more_parts && !published_now.contains(page) && !HeldInTier1(page)) {
      it->second = put.masks[i];
      fresh = true;
    }
    if (fresh) {
      published_now.insert(page);
      ++published;
    }
  }
  if (exact && (committed->num_published != published ||
                committed->num_duplicates != put.keys.size() - published)) {
    return Fail(absl::StrCat("the model says ", published, " published"));
  }
  return absl::OkStatus();
}

absl::Status PageSimulation::Release(uint64_t sequence_id) {
  const Put put = pending_.at(sequence_id);
  pending_.erase(sequence_id);
  trace_.push_back(absl::StrCat("release put ", sequence_id));
  const SessionInfo& info = sessions_.at(put.session_id);
  return ExpectCode(pool_->Release(*info.session, sequence_id),
                    info.ended ? absl::StatusCode::kAborted : absl::StatusCode::kOk, "release put");
}

absl::StatusOr<std::optional<PageSimulation::PageRead>> PageSimulation::StartRead() {
  PageRead read;
  read.session_id = PickSession();
  if (read.session_id == 0) return std::nullopt;
  read.info = &sessions_.at(read.session_id);
  read.keys = PickKeys();
  if (read.info->manifest < 0) {
    RETURN_IF_ERROR(ExpectNoManifestRefused(*read.info, read.keys));
    return std::nullopt;
  }
  read.wanted = PickWanted();
  ASSIGN_OR_RETURN(read.probes, ProbeKeys(read.session_id, read.keys));
  read.expected = Expect(read.probes, read.wanted);
  return read;
}

absl::Status PageSimulation::Exists() {
  ASSIGN_OR_RETURN(std::optional<PageRead> read, StartRead());
  if (!read.has_value()) return absl::OkStatus();
  const auto& [session_id, info, keys, wanted, probes, expected] = *read;
  ASSIGN_OR_RETURN(PagesFound found, pool_->ExistsPages(*info->session, keys, wanted));
  pins_swept_at_ = clock_.Now();  // an exists releases expired pins first
  trace_.push_back(absl::StrCat("exists session ", session_id, " ", DescribeKeys(keys),
                                " wanted 0x", absl::Hex(wanted), " -> ", found.num_pages,
                                ", model ", DescribeExpected(expected), " of ",
                                DescribeProbes(probes)));
  if (!Fits(expected, found.num_pages)) {
    return Fail("exists differs from the model's hit rule");
  }
  const PagesByTier& tiers = found.by_tier;
  if (tiers.pool + tiers.host + tiers.disk + tiers.cluster != found.num_pages) {
    return Fail("exists' tiers do not sum to its pages");
  }
  if (tiers.pool != InTier1(probes, found.num_pages)) {
    return Fail(absl::StrCat("model says ", InTier1(probes, found.num_pages), " in tier 1"));
  }
  if (expected.exact() && expected.hit < expected.present) ++partial_hits_;
  return absl::OkStatus();
}

absl::Status PageSimulation::Acquire() {
  ASSIGN_OR_RETURN(std::optional<PageRead> read, StartRead());
  if (!read.has_value()) return absl::OkStatus();
  const auto& [session_id, info, keys, wanted, probes, expected] = *read;
  const PoolStatsSnapshot before = pool_->Stats();
  absl::StatusOr<AcquiredPages> acquired =
      pool_->AcquirePages(*info->session, keys, wanted, /*max_load_ms=*/0);
  trace_.push_back(
      absl::StrCat("acquire session ", session_id, " ", DescribeKeys(keys), " wanted 0x",
                   absl::Hex(wanted), " -> ",
                   acquired.ok() ? absl::StrCat(acquired->block_ids.size(), " (blocks ",
                                                absl::StrJoin(acquired->block_ids, ","), ")")
                                 : acquired.status().ToString(),
                   ", model ", DescribeExpected(expected), " of ", DescribeProbes(probes)));
  pins_swept_at_ = clock_.Now();
  if (!acquired.ok()) return acquired.status();
  return CheckAcquired(session_id, keys, wanted, probes, expected, before, *acquired);
}

absl::Status PageSimulation::CheckAcquired(uint64_t session_id,
                                           const std::vector<std::string>& keys, uint32_t wanted,
                                           const std::vector<PageProbe>& probes,
                                           const Expected& expected,
                                           const PoolStatsSnapshot& before,
                                           const AcquiredPages& acquired) {
  const size_t got = acquired.block_ids.size();
  // Room for every load whatever the hits hold: the answer is then the walk's.
  const bool room = before.free + before.evictable >= 2 * keys.size();
  if (got > expected.present || (room && !Fits(expected, got))) {
    return Fail(absl::StrCat("got ", got, " pages, model says ", DescribeExpected(expected)));
  }
  if (acquired.part_masks.size() != got) return Fail("part masks and pages differ in count");
  const std::vector<uint32_t> masks(acquired.part_masks.begin(), acquired.part_masks.end());
  if (ModelHitRule(masks, wanted) != got) {
    return Fail("the acquired pages are no hit under the rule by their own parts");
  }
  const std::string ns = NamespaceOf(session_id);
  for (size_t i = 0; i < got; ++i) {
    const auto committed = committed_.find({ns, keys[i]});
    const bool known = i < expected.ambiguous_at
                           ? masks[i] == probes[i].mask
                           : committed != committed_.end() && committed->second.count(masks[i]);
    if (!known) {
      return Fail(absl::StrCat("page ", i, " acquired with parts 0x", absl::Hex(masks[i]),
                               ", reported 0x", absl::Hex(probes[i].mask)));
    }
    std::string bytes(kSimPageBytes, '\0');
    RETURN_IF_ERROR(pool_->ReadBlock(acquired.block_ids[i], 0, kSimPageBytes, bytes.data()));
    if (bytes != PageBytes(ns, keys[i], masks[i])) {
      return Fail(absl::StrCat("page ", i, " (", keys[i], ") holds other bytes"));
    }
    ++hit_pages_;
    if (!probes[i].in_tier1) ++below_hit_pages_;
  }
  disk_hit_pages_ += acquired.by_tier.disk;
  if (acquired.by_tier.pool + acquired.by_tier.host + acquired.by_tier.disk != got) {
    return Fail("acquire's tiers do not sum to its pages");
  }
  // Only the unambiguous pages are the ones tier 1 indexes; an ambiguous one may be loaded
  // into a copy of its own while tier 1's stays evictable.
  const size_t indexed = std::min(got, expected.ambiguous_at);
  Held held{session_id, std::vector<std::string>(keys.begin(), keys.begin() + indexed),
            std::vector<uint32_t>(masks.begin(), masks.begin() + indexed), acquired.block_ids};
  if (Chance(60)) {
    trace_.push_back(absl::StrCat("release acquired ", acquired.sequence_id));
    return pool_->Release(*sessions_.at(session_id).session, acquired.sequence_id);
  }
  held_[acquired.sequence_id] = std::move(held);
  return absl::OkStatus();
}

absl::Status PageSimulation::ReleaseHeld() {
  if (held_.empty()) return absl::OkStatus();
  auto it = std::next(held_.begin(), Uniform(0, held_.size() - 1));
  trace_.push_back(absl::StrCat("release acquired ", it->first));
  const SessionInfo& info = sessions_.at(it->second.session_id);
  RETURN_IF_ERROR(ExpectCode(pool_->Release(*info.session, it->first),
                             info.ended ? absl::StatusCode::kAborted : absl::StatusCode::kOk,
                             "release acquired"));
  held_.erase(it);
  return absl::OkStatus();
}

absl::Status PageSimulation::PinPages() {
  const uint64_t session_id = PickSession();
  if (session_id == 0) return absl::OkStatus();
  const SessionInfo& info = sessions_.at(session_id);
  const std::vector<std::string> keys = PickKeys();
  if (info.manifest < 0) return absl::OkStatus();
  const absl::Duration ttl = Chance(20) ? absl::ZeroDuration() : absl::Seconds(Uniform(1, 6));
  ASSIGN_OR_RETURN(std::vector<PageProbe> probes, ProbeKeys(session_id, keys));
  // No part asked for: the leading present pages, whatever parts they hold.
  const Expected expected = Expect(probes, 0);
  const PoolStatsSnapshot before = pool_->Stats();
  absl::StatusOr<uint32_t> pinned = pool_->PinPages(*info.session, keys, ttl);
  trace_.push_back(absl::StrCat(
      "pin session ", session_id, " ", DescribeKeys(keys), " for ", absl::FormatDuration(ttl),
      " -> ", pinned.ok() ? absl::StrCat(*pinned) : pinned.status().ToString(), ", model ",
      DescribeExpected(expected), " of ", DescribeProbes(probes)));
  pins_swept_at_ = clock_.Now();
  if (!pinned.ok()) return pinned.status();
  const bool room = before.free + before.evictable >= 2 * keys.size();
  if (*pinned > expected.present || (room && !Fits(expected, *pinned))) {
    return Fail("pin differs from the model");
  }
  if (ttl > absl::ZeroDuration() && *pinned > 0) {
    Pin pin{session_id, clock_.Now() + ttl, {}, {}};
    for (size_t i = 0; i < std::min<size_t>(*pinned, expected.ambiguous_at); ++i) {
      pin.keys.push_back(keys[i]);
      pin.masks.push_back(probes[i].mask);
    }
    pins_.push_back(std::move(pin));
  }
  return absl::OkStatus();
}

bool PageSimulation::HeldInTier1(const std::pair<std::string, std::string>& page) const {
  for (const auto& [sequence_id, held] : held_) {
    if (NamespaceOf(held.session_id) == page.first &&
        std::find(held.keys.begin(), held.keys.end(), page.second) != held.keys.end()) {
      return true;
    }
  }
  for (const Pin& pin : pins_) {
    if (pin.until > pins_swept_at_ && !sessions_.at(pin.session_id).ended &&
        NamespaceOf(pin.session_id) == page.first &&
        std::find(pin.keys.begin(), pin.keys.end(), page.second) != pin.keys.end()) {
      return true;
    }
  }
  return false;
}

bool PageSimulation::UnsweptExpiredPins() const {
  for (const Pin& pin : pins_) {
    if (pin.until <= clock_.Now() && pin.until > pins_swept_at_) return true;
  }
  return false;
}

bool PageSimulation::LivePins() const {
  for (const Pin& pin : pins_) {
    if (pin.until > clock_.Now() && !sessions_.at(pin.session_id).ended) return true;
  }
  return false;
}

void PageSimulation::Ended(uint64_t session_id) {
  sessions_.at(session_id).ended = true;
  for (auto it = held_.begin(); it != held_.end();) {
    it = it->second.session_id == session_id ? held_.erase(it) : std::next(it);
  }
  std::erase_if(pins_, [&](const Pin& pin) { return pin.session_id == session_id; });
}

absl::Status PageSimulation::CloseSession() {
  const uint64_t session_id = PickSession();
  if (session_id == 0) return absl::OkStatus();
  trace_.push_back(absl::StrCat("close session ", session_id));
  RETURN_IF_ERROR(
      manager_->CloseSession(session_id, kEpoch, sessions_.at(session_id).session->principal)
          .status());
  Ended(session_id);
  return absl::OkStatus();
}

absl::Status PageSimulation::AdvanceAndExpire() {
  const absl::Duration by = absl::Milliseconds(Uniform(1, 8) * 500);
  clock_.Advance(by);
  trace_.push_back(absl::StrCat("advance ", absl::FormatDuration(by)));
  return Chance(70) ? ExpireSessions() : absl::OkStatus();
}

absl::Status PageSimulation::ExpireSessions() {
  size_t want = 0;
  for (uint64_t id : session_order_) {
    SessionInfo& info = sessions_.at(id);
    if (info.ended || info.deadline > clock_.Now()) continue;
    ++want;
    Ended(id);
  }
  const size_t expired = manager_->ExpireSessions();
  pins_swept_at_ = clock_.Now();  // the reaper's sweep releases expired pins too
  trace_.push_back(absl::StrCat("expire -> ", expired, ", model ", want));
  return expired == want ? absl::OkStatus() : Fail("expired sessions differ from the model");
}

absl::Status PageSimulation::KeepAlive() {
  const uint64_t session_id = PickSession();
  if (session_id == 0) return absl::OkStatus();
  SessionInfo& info = sessions_.at(session_id);
  const bool alive = info.deadline > clock_.Now();
  trace_.push_back(absl::StrCat("keepalive session ", session_id));
  RETURN_IF_ERROR(ExpectCode(manager_->sessions().KeepAlive(session_id),
                             alive ? absl::StatusCode::kOk : absl::StatusCode::kAborted,
                             "keepalive"));
  if (alive) info.deadline = clock_.Now() + info.session->ttl;
  return absl::OkStatus();
}

absl::Status PageSimulation::Offload() {
  const size_t stored = pool_->OffloadForTesting();
  offloaded_ += stored;
  trace_.push_back(absl::StrCat("offload -> ", stored));
  // What was passed down becomes durable, hence visible, now (see Simulation::Offload).
  if (disk_) pool_->disk_tier()->Flush();
  return absl::OkStatus();
}

absl::Status PageSimulation::CheckAfterStep() {
  RETURN_IF_ERROR(pool_->CheckInvariants());
  const PoolStatsSnapshot stats = pool_->Stats();
  if (stats.free + stats.evictable + stats.referenced != num_blocks_) {
    return Fail(absl::StrCat("free ", stats.free, " + evictable ", stats.evictable,
                             " + referenced ", stats.referenced, " != ", num_blocks_));
  }
  if (Exact()) ++exact_steps_;
  // Held pages stay in tier 1 with their parts.
  std::set<BlockId> held_blocks;
  for (const auto& [sequence_id, held] : held_) {
    for (size_t i = 0; i < held.keys.size(); ++i) {
      ASSIGN_OR_RETURN(PageProbe probe, ProbeKey(held.session_id, held.keys[i]));
      if (!probe.in_tier1 || probe.mask != held.masks[i]) {
        return Fail(absl::StrCat("held page ", held.keys[i], " reports ", DescribeProbe(probe)));
      }
    }
    held_blocks.insert(held.blocks.begin(), held.blocks.end());
  }
  for (const Pin& pin : pins_) {
    if (pin.until <= clock_.Now()) continue;
    for (size_t i = 0; i < pin.keys.size(); ++i) {
      ASSIGN_OR_RETURN(PageProbe probe, ProbeKey(pin.session_id, pin.keys[i]));
      if (!probe.in_tier1 || probe.mask != pin.masks[i]) {
        return Fail(absl::StrCat("pinned page ", pin.keys[i], " reports ", DescribeProbe(probe)));
      }
    }
  }
  for (const auto& [sequence_id, put] : pending_) {
    if (sessions_.at(put.session_id).ended) continue;
    for (BlockId block : put.blocks) {
      if (block != kNoBlock) held_blocks.insert(block);
    }
  }
  if (!LivePins() && !UnsweptExpiredPins() && stats.referenced != held_blocks.size()) {
    return Fail(absl::StrCat(stats.referenced, " blocks referenced; the model holds ",
                             held_blocks.size(), ": {", absl::StrJoin(held_blocks, ","), "}"));
  }
  return absl::OkStatus();
}

}  // namespace simulation
}  // namespace kvcache
