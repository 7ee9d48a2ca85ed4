// Simulation (token_simulation.h): the operations, each checked against the model.
#include "tests/cache/token_simulation.h"

namespace kvcache {
namespace simulation {

absl::Status Simulation::OpenSession() {
  // Mostly one tenant, so prompts repeat within it.
  const std::string tenant(kTenants[Chance(60) ? 0 : Uniform(1, 2)]);
  const absl::Duration ttl = absl::Milliseconds(Uniform(1, 4) * 500);
  const std::string principal = absl::StrCat("uid:", tenant);
  auto session = manager_->sessions().Open(principal, tenant, "sim", ttl);
  trace_.push_back(absl::StrCat("open-session ", tenant, " ttl ", absl::FormatDuration(ttl)));
  if (!session.ok()) return session.status();
  trace_.back() += absl::StrCat(" -> ", (*session)->id);
  sessions_[(*session)->id] =
      SessionInfo{*session, tenant, principal, clock_.Now() + ttl, /*ended=*/false};
  session_order_.push_back((*session)->id);
  opened_sessions_.push_back((*session)->id);
  return absl::OkStatus();
}

absl::Status Simulation::OpenSequence(OpenMode mode, bool composite,
                                      const std::vector<uint32_t>* prompt) {
  const uint64_t session_id = PickSession();
  if (session_id == 0) return absl::OkStatus();
  const SessionInfo& session = sessions_.at(session_id);
  std::vector<uint32_t> tokens = prompt != nullptr ? *prompt : NewPrompt();
  const std::string salt(kSalts[Chance(80) ? 0 : 1]);
  const std::string lora = Chance(5) ? "lora-a" : "";
  const std::string ns = Namespace(session.tenant, salt, lora);
  ExtraKeys extras;
  extras.lora_id = lora;
  static constexpr const char* kModeNames[] = {"compute", "put", "pin"};
  trace_.push_back(absl::StrCat("open ", kModeNames[static_cast<int>(mode)], composite ? "+" : "",
                                " session ", session_id, " ns ", ns, " tokens ",
                                absl::StrJoin(tokens, ",")));

  // What the model can say without hits.
  const size_t full_blocks = tokens.size() / block_size_;
  size_t total_blocks =
      mode == OpenMode::kCompute ? (tokens.size() + block_size_ - 1) / block_size_ : full_blocks;
  absl::StatusCode want = absl::StatusCode::kOk;
  if (tokens.empty() || (mode == OpenMode::kPut && full_blocks == 0)) {
    want = absl::StatusCode::kInvalidArgument;
  } else if (mode != OpenMode::kPinCached && total_blocks > num_blocks_) {
    want = absl::StatusCode::kResourceExhausted;
  } else if (session.ended) {
    want = absl::StatusCode::kAborted;
  }
  if (mode == OpenMode::kPinCached) total_blocks = std::min<size_t>(total_blocks, num_blocks_);
  const size_t max_hits = mode == OpenMode::kCompute
                              ? (tokens.empty() ? 0 : (tokens.size() - 1) / block_size_)
                              : total_blocks;
  std::vector<BlockId> model_hits;
  std::string below;  // with tiers: where each block after the tier-1 hits comes from
  if (want == absl::StatusCode::kOk && model_) {
    model_hits = model_->Walk(ns, tokens, block_size_, max_hits);
    size_t evictable_hits = 0;
    for (BlockId block : model_hits) evictable_hits += model_->IsEvictable(block) ? 1 : 0;
    if (tier_) below = PredictBelow(ns, tokens, model_hits.size(), max_hits);
    if (mode == OpenMode::kPinCached) {
      // A read loads only into blocks it can have without failing.
      below.resize(std::min<size_t>(below.size(),
                                    model_->num_free() + model_->num_evictable() - evictable_hits));
      total_blocks = model_hits.size() + below.size();
    }
    if (total_blocks - model_hits.size() >
        model_->num_free() + model_->num_evictable() - evictable_hits) {
      want = absl::StatusCode::kResourceExhausted;
    }
  }

  const uint64_t passed_down_before = PassedDownOnEviction();
  auto opened = pool_->Open(*session.session, SequenceSpec{tokens, salt, extras}, mode);
  // An open that evicted blocks no tier held passed them down first, and the stores that took
  // them may have evicted records of the tiers below that `below` counted on (tier 2 keeps the
  // open's own; the disk does not): then it loads at most what was predicted.
  const bool passed_down = PassedDownOnEviction() != passed_down_before;
  trace_.back() += absl::StrCat(passed_down ? " (passed down victims)" : "", " -> ",
                                opened.ok() ? "" : opened.status().ToString());
  if (!model_ && want == absl::StatusCode::kOk && absl::IsResourceExhausted(opened.status())) {
    // Without the model, capacity depends on hits the weak hash may have lost.
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ExpectCode(opened, want, "open"));
  if (!opened.ok()) return absl::OkStatus();
  trace_.back() +=
      absl::StrCat("seq ", opened->sequence_id, " blocks ", absl::StrJoin(opened->block_ids, ","),
                   " cached ", opened->num_cached_tokens,
                   tier_ ? absl::StrCat(" (", opened->num_host_tier_tokens, " from tier 2, ",
                                        opened->num_disk_tier_tokens, " from disk)")
                         : "");

  const size_t hits = opened->num_cached_tokens / block_size_;
  // The last `loaded` hits came from below (the walk continues there where tier 1 ends).
  const size_t from_host = opened->num_host_tier_tokens / block_size_;
  const size_t from_disk = opened->num_disk_tier_tokens / block_size_;
  const size_t loaded = from_host + from_disk;
  if (opened->num_cached_tokens % block_size_ != 0 || hits > max_hits) {
    return Fail("open: cached tokens not whole blocks or past the cap");
  }
  if (opened->num_host_tier_tokens % block_size_ != 0 ||
      opened->num_disk_tier_tokens % block_size_ != 0 || loaded > hits ||
      (!tier_ && from_host > 0) || (!disk_ && from_disk > 0)) {
    return Fail(absl::StrCat("open: ", opened->num_host_tier_tokens, " tokens from tier 2, ",
                             opened->num_disk_tier_tokens, " from disk"));
  }
  if (model_ && !passed_down &&
      (from_host != static_cast<size_t>(absl::c_count(below, 'h')) ||
       from_disk != static_cast<size_t>(absl::c_count(below, 'd')))) {
    return Fail(absl::StrCat("open: loaded ", from_host, " blocks from tier 2 and ", from_disk,
                             " from disk; the tiers hold \"", below, "\" after the tier-1 hits"));
  }
  if (model_ && passed_down && loaded > below.size()) {
    return Fail(absl::StrCat("open: loaded ", loaded, " blocks after passing its victims down; ",
                             "the tiers held \"", below, "\" after the tier-1 hits"));
  }
  const size_t tier1_hits = hits - loaded;
  if (mode == OpenMode::kPinCached) total_blocks = hits;
  if (opened->block_ids.size() != total_blocks) {
    return Fail(absl::StrCat("open: ", opened->block_ids.size(), " blocks, want ", total_blocks));
  }
  // A loaded block was a fresh one: it must now hold the requested content's bytes, as a
  // worker would have written them when it was computed.
  for (size_t i = tier1_hits; i < hits; ++i) {
    const Key key = KeyOf(ns, tokens, i, block_size_);
    RETURN_IF_ERROR(CheckBytes(opened->block_ids[i], key, "open from tier 2"));
    shadow_[opened->block_ids[i]] = key;
  }
  for (size_t i = 0; i < hits; ++i) {
    RETURN_IF_ERROR(CheckHit(opened->block_ids[i], KeyOf(ns, tokens, i, block_size_), "open"));
  }
  hit_blocks_ += hits;
  tier_hit_blocks_ += from_host;
  disk_hit_blocks_ += from_disk;
  if (model_) {
    if (tier1_hits != model_hits.size() ||
        !std::equal(model_hits.begin(), model_hits.end(), opened->block_ids.begin())) {
      return Fail(absl::StrCat(
          "open: hit blocks ",
          absl::StrJoin(opened->block_ids.begin(), opened->block_ids.begin() + tier1_hits, ","),
          " (and ", loaded, " from below), model says ", absl::StrJoin(model_hits, ",")));
    }
    for (BlockId block : model_hits) {
      model_->Acquire(block, session.tenant, mode == OpenMode::kCompute);
    }
    for (size_t i = tier1_hits; i < total_blocks; ++i) {
      RETURN_IF_ERROR(model_->Allocate(opened->block_ids[i], session.tenant));
    }
    // The open publishes what it loaded, by Commit's rule.
    const uint32_t published =
        model_->Commit(ns, tokens, opened->block_ids, block_size_,
                       static_cast<uint32_t>(tier1_hits), static_cast<uint32_t>(hits));
    if (published != loaded) {
      return Fail(absl::StrCat("open: loaded ", loaded, " blocks, model publishes ", published));
    }
  }
  for (size_t i = hits; i < total_blocks; ++i) shadow_[opened->block_ids[i]].reset();

  SeqInfo info{.session_id = session_id,
               .tenant = session.tenant,
               .ns = ns,
               .tokens = tokens,
               .blocks = opened->block_ids,
               .committed = static_cast<uint32_t>(hits)};
  if (mode != OpenMode::kCompute) info.tokens.resize(total_blocks * block_size_);
  const uint64_t id = opened->sequence_id;
  seqs_.emplace(id, std::move(info));
  if (!composite) return absl::OkStatus();
  if (mode != OpenMode::kPinCached) {
    RETURN_IF_ERROR(DoCommit(session_id, id, static_cast<uint32_t>(seqs_.at(id).tokens.size())));
  }
  return DoRelease(session_id, id);
}

absl::Status Simulation::Extend() {
  auto [session_id, id] = PickSequence();
  if (session_id == 0) return absl::OkStatus();
  std::vector<uint32_t> more(Chance(5) ? 0 : Uniform(1, 2 * block_size_));
  for (uint32_t& token : more) token = Uniform(1, 3);
  trace_.push_back(
      absl::StrCat("extend session ", session_id, " seq ", id, " by ", absl::StrJoin(more, ",")));
  absl::StatusCode want =
      more.empty() ? absl::StatusCode::kInvalidArgument : SequenceAccess(session_id, id);
  size_t needed = 0;
  if (want == absl::StatusCode::kOk) {
    const SeqInfo& seq = seqs_.at(id);
    const size_t total = (seq.tokens.size() + more.size() + block_size_ - 1) / block_size_;
    needed = total - seq.blocks.size();
    if (total > num_blocks_) {
      want = absl::StatusCode::kResourceExhausted;
    } else if (model_ && needed > model_->num_free() + model_->num_evictable()) {
      want = absl::StatusCode::kResourceExhausted;
    }
  }
  auto extended = pool_->Extend(*sessions_.at(session_id).session, id, more);
  trace_.back() += absl::StrCat(" -> ", extended.ok() ? absl::StrJoin(extended->new_block_ids, ",")
                                                      : extended.status().ToString());
  if (!model_ && want == absl::StatusCode::kOk && absl::IsResourceExhausted(extended.status())) {
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ExpectCode(extended, want, "extend"));
  if (!extended.ok()) return absl::OkStatus();
  SeqInfo& seq = seqs_.at(id);
  if (extended->new_block_ids.size() != needed ||
      extended->num_tokens != seq.tokens.size() + more.size()) {
    return Fail("extend: wrong block or token count");
  }
  for (BlockId block : extended->new_block_ids) {
    if (model_) RETURN_IF_ERROR(model_->Allocate(block, seq.tenant));
    shadow_[block].reset();
    seq.blocks.push_back(block);
  }
  seq.tokens.insert(seq.tokens.end(), more.begin(), more.end());
  return absl::OkStatus();
}

absl::Status Simulation::Commit() {
  auto [session_id, id] = PickSequence();
  if (session_id == 0) return absl::OkStatus();
  auto it = seqs_.find(id);
  const uint32_t length = it == seqs_.end() ? 0 : static_cast<uint32_t>(it->second.tokens.size());
  uint32_t written = Chance(60) ? length : Uniform(0, length);
  if (Chance(3)) written = length + 1;
  return DoCommit(session_id, id, written);
}

absl::Status Simulation::DoCommit(uint64_t session_id, uint64_t id, uint32_t written) {
  trace_.push_back(absl::StrCat("commit session ", session_id, " seq ", id, " tokens ", written));
  absl::StatusCode want = SequenceAccess(session_id, id);
  if (want == absl::StatusCode::kOk && written > seqs_.at(id).tokens.size()) {
    want = absl::StatusCode::kInvalidArgument;
  }
  if (tier_ && want == absl::StatusCode::kOk) {
    // The worker writes the KV of every full block it computed (one it shares holds it).
    const SeqInfo& seq = seqs_.at(id);
    for (uint32_t i = 0; i < written / block_size_; ++i) {
      if (shadow_[seq.blocks[i]].has_value()) continue;
      const Key key = KeyOf(seq.ns, seq.tokens, i, block_size_);
      std::string bytes = BytesOf(key);
      RETURN_IF_ERROR(pool_->WriteBlock(seq.blocks[i], 0, bytes));
      written_.emplace(std::move(bytes), key);
      if (disk_) {
        const Chain chain = ChainOf(seq.ns, key.tokens);
        written_identities_.emplace(RecordKeyOf(chain.hashes.back(), chain.digests.back()), key);
      }
    }
  }
  auto committed = pool_->Commit(*sessions_.at(session_id).session, id, written);
  trace_.back() += absl::StrCat(
      " -> ", committed.ok() ? absl::StrCat(committed->num_committed_blocks, " committed, ",
                                            committed->num_published_blocks, " published")
                             : committed.status().ToString());
  RETURN_IF_ERROR(ExpectCode(committed, want, "commit"));
  if (!committed.ok()) return absl::OkStatus();
  SeqInfo& seq = seqs_.at(id);
  const uint32_t written_blocks = written / block_size_;
  // The worker wrote the KV of every block it computed; a block it shares already holds it.
  for (uint32_t i = 0; i < written_blocks; ++i) {
    const Key key = KeyOf(seq.ns, seq.tokens, i, block_size_);
    std::optional<Key>& held = shadow_[seq.blocks[i]];
    if (!held.has_value()) {
      held = key;
    } else if (!(*held == key)) {
      return Fail(absl::StrCat("commit: WRONG KV: block ", seq.blocks[i], " at position ", i,
                               " holds ", Describe(*held), " for ", Describe(key)));
    }
  }
  const uint32_t from = seq.committed;
  seq.committed = std::max(seq.committed, written_blocks);
  if (committed->num_committed_blocks != seq.committed) {
    return Fail(absl::StrCat("commit: ", committed->num_committed_blocks, " committed, want ",
                             seq.committed));
  }
  if (model_) {
    const uint32_t published =
        model_->Commit(seq.ns, seq.tokens, seq.blocks, block_size_, from, written_blocks);
    if (published != committed->num_published_blocks) {
      return Fail(absl::StrCat("commit: ", committed->num_published_blocks,
                               " published, model says ", published));
    }
  }
  return absl::OkStatus();
}

absl::Status Simulation::Release() {
  auto [session_id, id] = PickSequence();
  if (session_id == 0) return absl::OkStatus();
  return DoRelease(session_id, id);
}

absl::Status Simulation::DoRelease(uint64_t session_id, uint64_t id) {
  trace_.push_back(absl::StrCat("release session ", session_id, " seq ", id));
  const absl::StatusCode want = SequenceAccess(session_id, id);
  RETURN_IF_ERROR(
      ExpectCode(pool_->Release(*sessions_.at(session_id).session, id), want, "release"));
  if (want != absl::StatusCode::kOk) return absl::OkStatus();
  const SeqInfo& seq = seqs_.at(id);
  // Tail first.
  if (model_) model_->Release({seq.blocks.rbegin(), seq.blocks.rend()});
  seqs_.erase(id);
  dead_seqs_.push_back(id);
  return absl::OkStatus();
}

absl::Status Simulation::Fork() {
  auto [session_id, id] = PickSequence();
  if (session_id == 0) return absl::OkStatus();
  trace_.push_back(absl::StrCat("fork session ", session_id, " seq ", id));
  absl::StatusCode want = SequenceAccess(session_id, id);
  bool has_partial = false;
  if (want == absl::StatusCode::kOk) {
    const SeqInfo& parent = seqs_.at(id);
    has_partial = parent.tokens.size() / block_size_ < parent.blocks.size();
    if (model_ && has_partial && model_->num_free() + model_->num_evictable() == 0) {
      want = absl::StatusCode::kResourceExhausted;
    }
  }
  auto forked = pool_->Fork(*sessions_.at(session_id).session, id);
  trace_.back() +=
      absl::StrCat(" -> ", forked.ok() ? absl::StrCat("seq ", forked->sequence_id, " blocks ",
                                                      absl::StrJoin(forked->block_ids, ","))
                                       : forked.status().ToString());
  if (!model_ && want == absl::StatusCode::kOk && absl::IsResourceExhausted(forked.status())) {
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ExpectCode(forked, want, "fork"));
  if (!forked.ok()) return absl::OkStatus();
  SeqInfo child = seqs_.at(id);
  const size_t full = child.tokens.size() / block_size_;
  if (forked->block_ids.size() != child.blocks.size() ||
      !std::equal(child.blocks.begin(), child.blocks.begin() + full, forked->block_ids.begin())) {
    return Fail("fork: the child does not share the parent's full blocks");
  }
  if (has_partial != (forked->copied_from_block != kNoBlock) ||
      (has_partial && forked->copied_from_block != child.blocks.back())) {
    return Fail("fork: wrong copy source");
  }
  if (model_) {
    for (size_t i = 0; i < full; ++i) model_->Acquire(child.blocks[i], child.tenant, false);
    if (has_partial) RETURN_IF_ERROR(model_->Allocate(forked->block_ids.back(), child.tenant));
  }
  if (has_partial) shadow_[forked->block_ids.back()].reset();
  child.blocks = forked->block_ids;
  seqs_.emplace(forked->sequence_id, std::move(child));
  return absl::OkStatus();
}

absl::Status Simulation::Lookup() {
  const std::string tenant(kTenants[Uniform(0, 2)]);
  const std::string salt(kSalts[Chance(80) ? 0 : 1]);
  std::vector<uint32_t> tokens = NewPrompt();
  trace_.push_back(
      absl::StrCat("lookup ", tenant, "/", salt, " tokens ", absl::StrJoin(tokens, ",")));
  auto found = pool_->Lookup(tenant, SequenceSpec{tokens, salt, {}});
  if (!found.ok()) return Fail(absl::StrCat("lookup: ", found.status().ToString()));
  trace_.back() +=
      absl::StrCat(" -> ", found->num_cached_blocks, " (tier 2 tokens ",
                   found->num_host_tier_tokens, ", disk tokens ", found->num_disk_tier_tokens, ")");
  if (found->num_cached_tokens != found->num_cached_blocks * block_size_ ||
      found->num_cached_blocks > tokens.size() / block_size_ ||
      found->num_host_tier_tokens % block_size_ != 0 ||
      found->num_disk_tier_tokens % block_size_ != 0 ||
      found->num_host_tier_tokens + found->num_disk_tier_tokens > found->num_cached_tokens ||
      (!tier_ && found->num_host_tier_tokens > 0) || (!disk_ && found->num_disk_tier_tokens > 0)) {
    return Fail("lookup: inconsistent answer");
  }
  if (model_) {
    // The lower tiers' part follows tier 1's; the model knows tier 1's.
    const size_t from_host = found->num_host_tier_tokens / block_size_;
    const size_t from_disk = found->num_disk_tier_tokens / block_size_;
    const size_t tier1_blocks = found->num_cached_blocks - from_host - from_disk;
    const std::string ns = Namespace(tenant, salt, "");
    const size_t want = model_->Walk(ns, tokens, block_size_, tokens.size()).size();
    if (tier1_blocks != want) {
      return Fail(absl::StrCat("lookup: ", tier1_blocks, " blocks in tier 1, model says ", want));
    }
    if (tier_) {
      const std::string below = PredictBelow(ns, tokens, want, tokens.size() / block_size_);
      if (from_host != static_cast<size_t>(absl::c_count(below, 'h')) ||
          from_disk != static_cast<size_t>(absl::c_count(below, 'd'))) {
        return Fail(absl::StrCat("lookup: ", from_host, " blocks in tier 2 and ", from_disk,
                                 " on disk; the tiers hold \"", below, "\" after the tier-1 hits"));
      }
    }
  }
  return absl::OkStatus();
}

uint32_t Simulation::EndSession(uint64_t session_id, std::vector<BlockId>* blocks) {
  SessionInfo& info = sessions_.at(session_id);
  info.ended = true;
  uint32_t count = 0;
  for (auto it = seqs_.begin(); it != seqs_.end();) {
    if (it->second.session_id != session_id) {
      ++it;
      continue;
    }
    blocks->insert(blocks->end(), it->second.blocks.rbegin(), it->second.blocks.rend());
    dead_seqs_.push_back(it->first);
    it = seqs_.erase(it);
    ++count;
  }
  return count;
}

absl::Status Simulation::CloseSession(uint64_t session_id) {
  SessionInfo& info = sessions_.at(session_id);
  trace_.push_back(absl::StrCat("close session ", session_id));
  auto closed = manager_->CloseSession(session_id, epoch_, info.principal);
  std::vector<BlockId> blocks;
  const uint32_t want = info.ended ? 0 : EndSession(session_id, &blocks);
  if (model_) model_->Release(blocks);
  if (!closed.ok() || *closed != want || !info.session->closed.load()) {
    return Fail(absl::StrCat("close: got ",
                             closed.ok() ? absl::StrCat(*closed) : closed.status().ToString(),
                             ", model says ", want));
  }
  return absl::OkStatus();
}

absl::Status Simulation::AdvanceAndExpire() {
  const absl::Duration by = absl::Milliseconds(Uniform(1, 6) * 250);
  clock_.Advance(by);
  const bool sweep = Chance(70);
  trace_.push_back(absl::StrCat("advance ", absl::FormatDuration(by), sweep ? " and expire" : ""));
  if (!sweep) return absl::OkStatus();
  // The sweep ends them oldest first (SessionRegistry::TakeExpired), as session_order_ lists
  // them: their blocks join the LRU in exactly that order.
  size_t want = 0;
  std::vector<BlockId> blocks;
  for (uint64_t id : session_order_) {
    const SessionInfo& info = sessions_.at(id);
    if (info.ended || info.deadline > clock_.Now()) continue;
    ++want;
    EndSession(id, &blocks);
  }
  if (model_) model_->Release(blocks);
  const size_t expired = manager_->ExpireSessions();
  trace_.back() += absl::StrCat(" -> ", expired);
  if (expired != want)
    return Fail(absl::StrCat("expire: ", expired, " sessions, model says ", want));
  for (const auto& [id, info] : sessions_) {
    if (info.session->closed.load() != info.ended) {
      return Fail(absl::StrCat("session ", id, " closed is ", info.session->closed.load()));
    }
  }
  return absl::OkStatus();
}

absl::Status Simulation::KeepAlive() {
  const uint64_t session_id = PickSession();
  if (session_id == 0) return absl::OkStatus();
  SessionInfo& info = sessions_.at(session_id);
  trace_.push_back(absl::StrCat("keepalive session ", session_id));
  // A lease past its deadline has ended, swept or not.
  const bool alive = !info.ended && info.deadline > clock_.Now();
  RETURN_IF_ERROR(ExpectCode(manager_->sessions().KeepAlive(session_id),
                             alive ? absl::StatusCode::kOk : absl::StatusCode::kAborted,
                             "keepalive"));
  if (alive) info.deadline = clock_.Now() + info.session->ttl;
  return absl::OkStatus();
}

absl::Status Simulation::CheckAccounting() {
  RETURN_IF_ERROR(pool_->CheckInvariants());
  const PoolStatsSnapshot stats = pool_->Stats();
  if (stats.free + stats.evictable + stats.referenced != num_blocks_) {
    return Fail(absl::StrCat("free ", stats.free, " + evictable ", stats.evictable,
                             " + referenced ", stats.referenced, " != ", num_blocks_));
  }
  if (stats.open_sequences != seqs_.size()) {
    return Fail(absl::StrCat(stats.open_sequences, " open sequences, want ", seqs_.size()));
  }
  if (stats.host_tier.has_value() != tier_) return Fail("tier stats present or missing");
  if (tier_) {
    const PoolHostTierStats& tier = *stats.host_tier;
    if (tier.hit_blocks != tier_hit_blocks_ || tier.offloaded_blocks != offloaded_blocks_ ||
        tier.load_failures != 0 || tier.deadline_blocks != 0 || tier.request_waits != 0) {
      return Fail(absl::StrCat("tier stats: hits/offloaded/load failures/deadline/waits ",
                               tier.hit_blocks, "/", tier.offloaded_blocks, "/", tier.load_failures,
                               "/", tier.deadline_blocks, "/", tier.request_waits, "; want ",
                               tier_hit_blocks_, "/", offloaded_blocks_, "/0/0/0"));
    }
  }
  if (stats.disk_tier.has_value() != disk_) return Fail("disk tier stats present or missing");
  if (disk_) {
    // Every disk hit counted, once, by the pool and by the tier; nothing failed or refused.
    const PoolDiskTierStats& disk = *stats.disk_tier;
    const DiskTierStats& tier = disk.store;
    if (disk.hit_blocks != disk_hit_blocks_ || tier.load_hits != disk_hit_blocks_ ||
        tier.loads != tier.load_hits || disk.load_failures != 0 || disk.deadline_blocks != 0 ||
        tier.write_errors != 0 || tier.stores_refused_full != 0 ||
        tier.stores_refused_stopped != 0 || tier.stores_dropped != 0 || tier.queued != 0 ||
        tier.records > tier.slots) {
      return Fail(
          absl::StrCat("disk stats: hits ", disk.hit_blocks, " (tier ", tier.load_hits, " of ",
                       tier.loads, " loads; want ", disk_hit_blocks_, "), load failures ",
                       disk.load_failures, ", deadline ", disk.deadline_blocks, ", write errors ",
                       tier.write_errors, ", refused ", tier.stores_refused_full, "+",
                       tier.stores_refused_stopped, ", dropped ", tier.stores_dropped, ", queued ",
                       tier.queued, ", records ", tier.records, " of ", tier.slots));
    }
  }
  if (!model_) return absl::OkStatus();
  const BlockPoolCounters& want = model_->counters();
  if (stats.free != model_->num_free() || stats.evictable != model_->num_evictable() ||
      stats.referenced != model_->num_referenced() || stats.pool.evictions != want.evictions ||
      stats.pool.resurrections != want.resurrections || stats.pool.published != want.published ||
      stats.pool.duplicates != want.duplicates) {
    return Fail(absl::StrCat("stats: free/evictable/referenced ", stats.free, "/", stats.evictable,
                             "/", stats.referenced,
                             " evictions/resurrections/published/"
                             "duplicates ",
                             stats.pool.evictions, "/", stats.pool.resurrections, "/",
                             stats.pool.published, "/", stats.pool.duplicates, "; model says ",
                             model_->num_free(), "/", model_->num_evictable(), "/",
                             model_->num_referenced(), " ", want.evictions, "/", want.resurrections,
                             "/", want.published, "/", want.duplicates));
  }
  for (absl::string_view tenant : kTenants) {
    const uint32_t referenced = pool_->Stats(tenant).referenced;
    if (referenced != model_->ReferencedBy(std::string(tenant))) {
      return Fail(absl::StrCat("tenant ", tenant, " holds ", referenced, ", model says ",
                               model_->ReferencedBy(std::string(tenant))));
    }
  }
  return absl::OkStatus();
}

}  // namespace simulation
}  // namespace kvcache
