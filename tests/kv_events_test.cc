// KV-event streams (audit/kv_events/kv_events.h, audit/kv_events/kv_events_audit.h): the decoder on both of
// vLLM's layouts and on bad bytes, recorded streams, and planted streams, one per violation
// class, each caught by its checker with its named reason; a clean stream passes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "audit/kv_events/kv_events.h"
#include "audit/kv_events/kv_events_audit.h"

namespace kvp::kv_events {
namespace {

// A byte string from a literal that may hold NUL bytes.
template <std::size_t N>
std::string raw(const char (&s)[N]) {
  return std::string(s, N - 1);
}

BlockStored stored(std::vector<BlockHash> hashes, std::optional<BlockHash> parent, int64_t block_size = 2) {
  BlockStored s;
  s.block_hashes = std::move(hashes);
  s.parent_block_hash = std::move(parent);
  s.block_size = block_size;
  for (std::size_t i = 0; i < s.block_hashes.size() * static_cast<std::size_t>(block_size); ++i)
    s.token_ids.push_back(static_cast<int64_t>(i));
  s.medium = "GPU";
  return s;
}

BlockRemoved removed(std::vector<BlockHash> hashes, std::string medium = "GPU") {
  return BlockRemoved{std::move(hashes), std::move(medium), std::nullopt};
}

EventBatch batch(int64_t seq, std::vector<KvCacheEvent> events) {
  EventBatch b;
  b.seq = seq;
  b.ts = 1000.5 + static_cast<double>(seq);
  b.events = std::move(events);
  b.data_parallel_rank = 0;
  return b;
}

// Every batch through the wire format and back, so the planted streams test the decoder too.
std::vector<EventBatch> over_the_wire(const std::vector<EventBatch>& batches, Encoding enc = Encoding::kArray) {
  std::vector<EventBatch> out;
  for (const auto& b : batches) {
    auto d = decode_event_batch(encode_event_batch(b, enc), b.seq);
    EXPECT_TRUE(d.is_ok()) << d.status().message();
    if (d) out.push_back(*d);
  }
  return out;
}

// A clean stream: two tenants (salts), a LoRA request, chains, removals, a clear and reuse.
std::vector<EventBatch> clean_stream() {
  BlockStored a = stored({"0x0a01", "0x0a02"}, std::nullopt);
  a.extra_keys = nlohmann::json::array({nlohmann::json::array({"tenant-a"}), nullptr});
  BlockStored b = stored({"0x0b01"}, std::nullopt);
  b.extra_keys = nlohmann::json::array({nlohmann::json::array({"tenant-b"})});
  BlockStored a_more = stored({"0x0a03"}, BlockHash("0x0a02"));
  BlockStored lora = stored({"77", "78"}, std::nullopt);
  lora.lora_name = "sql-adapter";
  lora.lora_id = 3;
  lora.extra_keys = nlohmann::json::array({nlohmann::json::array({"sql-adapter"}), nullptr});
  BlockStored cpu = stored({"0x0a01"}, std::nullopt);
  cpu.medium = "CPU";
  cpu.extra_keys = a.extra_keys;
  BlockStored after_clear = stored({"0x0c01"}, std::nullopt);
  return {batch(0, {a, b}),
          batch(1, {a_more, lora}),
          batch(2, {cpu, removed({"0x0a03"})}),
          batch(3, {removed({"0x0a01"}, "CPU")}),
          batch(4, {AllBlocksCleared{}}),
          batch(5, {after_clear}),
          batch(6, {removed({"0x0c01"}), stored({"0x0d01"}, std::nullopt)})};
}

std::vector<std::string> reasons(const std::vector<Violation>& vs) {
  std::vector<std::string> r;
  for (const auto& v : vs) r.push_back(v.reason);
  return r;
}

TEST(KvEventDecoder, ArrayLayoutRoundTripsEveryField) {
  BlockStored s = stored({"0x00ff", "18446744073709551615", "-5"}, BlockHash("42"), 1);
  s.lora_id = 7;
  s.lora_name = "adapter";
  s.extra_keys =
      nlohmann::json::array({nlohmann::json::array({"salt", nlohmann::json::array({"mm", 3})}), nullptr, nullptr});
  s.group_idx = 1;
  const EventBatch b = batch(9, {s, removed({"0x00ff"}, "CPU"), AllBlocksCleared{}});
  for (Encoding enc : {Encoding::kArray, Encoding::kMap}) {
    auto d = decode_event_batch(encode_event_batch(b, enc), 9);
    ASSERT_TRUE(d.is_ok()) << d.status().message();
    EXPECT_EQ(d->seq, 9);
    EXPECT_EQ(d->ts, b.ts);
    EXPECT_EQ(d->data_parallel_rank, 0);
    ASSERT_EQ(d->events.size(), 3u);
    const auto& s2 = std::get<BlockStored>(d->events[0]);
    EXPECT_EQ(s2.block_hashes, s.block_hashes);
    EXPECT_EQ(s2.parent_block_hash, s.parent_block_hash);
    EXPECT_EQ(s2.token_ids, s.token_ids);
    EXPECT_EQ(s2.block_size, 1);
    EXPECT_EQ(s2.lora_id, 7);
    EXPECT_EQ(s2.medium, "GPU");
    EXPECT_EQ(s2.lora_name, "adapter");
    EXPECT_EQ(s2.extra_keys, s.extra_keys);
    EXPECT_EQ(s2.group_idx, 1);
    EXPECT_EQ(std::get<BlockRemoved>(d->events[1]).medium, "CPU");
    EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(d->events[2]));
  }
}

// ts goes out as a msgpack float64 whatever its value, as vLLM's encoder (msgspec) writes a
// Python float: integral values too, and 2^64, on which msgpack-cxx's pack_double converts a
// double out of uint64_t's range (undefined; found by fuzz_kv_events).
TEST(KvEventDecoder, TsIsWrittenAsAFloat64WhateverItsValue) {
  for (double ts : {0.0, 3.0, 1000.5, -2.0, 1.0e19, 18446744073709551616.0, -9223372036854775808.0, 1.0e300}) {
    EventBatch b = batch(1, {AllBlocksCleared{}});
    b.ts = ts;
    for (Encoding enc : {Encoding::kArray, Encoding::kMap}) {
      const std::string bytes = encode_event_batch(b, enc);
      const std::size_t at = enc == Encoding::kArray ? 1 : 1 + 3;  // after the header (and the "ts" key)
      ASSERT_GT(bytes.size(), at + 9);
      EXPECT_EQ(static_cast<unsigned char>(bytes[at]), 0xcbu) << ts;
      uint64_t bits = 0;
      for (std::size_t i = 1; i <= 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(bytes[at + i]);
      double back = 0;
      std::memcpy(&back, &bits, sizeof back);
      EXPECT_EQ(back, ts);
      auto d = decode_event_batch(bytes, 1);
      ASSERT_TRUE(d.is_ok()) << d.status().message();
      EXPECT_EQ(d->ts, ts);
    }
  }
}

// Hand-written bytes in vLLM's older array layout: BlockStored with its five original fields
// only (no medium, lora_name, extra_keys), BlockRemoved with one; the batch without a rank.
TEST(KvEventDecoder, OlderArrayLayoutWithTrailingFieldsOmitted) {
  const std::string bytes =
      raw("\x92"                                  // [ts, events]
          "\xcb\x40\x59\x00\x00\x00\x00\x00\x00"  // 100.0
          "\x92"                                  // two events
          "\x96\xab"
          "BlockStored"
          "\x91\x05\xc0\x92\x01\x02\x02\xc0"  // [tag,[5],nil,[1,2],2,nil]
          "\x92\xac"
          "BlockRemoved"
          "\x91\x05");  // [tag,[5]]
  auto d = decode_event_batch(bytes, 3);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_EQ(d->ts, 100.0);
  EXPECT_FALSE(d->data_parallel_rank.has_value());
  const auto& s = std::get<BlockStored>(d->events[0]);
  EXPECT_EQ(s.block_hashes, std::vector<BlockHash>{"5"});
  EXPECT_FALSE(s.medium.has_value());
  EXPECT_TRUE(s.extra_keys.is_null());
  EXPECT_EQ(std::get<BlockRemoved>(d->events[1]).block_hashes, std::vector<BlockHash>{"5"});
}

TEST(KvEventDecoder, BadBytesAreNamedErrorsNeverCrashes) {
  const std::string good = encode_event_batch(clean_stream()[0]);
  struct Case {
    std::string bytes, expect;
  };
  const std::vector<Case> cases = {
      {"", "empty payload"},
      {good.substr(0, good.size() - 3), "truncated at offset"},
      {good + "\x01", "trailing bytes"},
      {raw("\x92\xcb\x40\x59\x00\x00\x00\x00\x00\x00\x91\x92\xa4"
           "Nope"
           "\x90"),
       "unknown tag \"Nope\""},
      {raw("\x92\xcb\x40\x59\x00\x00\x00\x00\x00\x00\x91\x93\xab"
           "BlockStored"
           "\x90\xc0"),
       "2 fields, expected 5"},
      {raw("\x92\xcb\x40\x59\x00\x00\x00\x00\x00\x00\x91\x96\xab"
           "BlockStored"
           "\x90\xc0\x90\xa1x\xc0"),
       "block_size: not an integer"},
      {"\x92\x01\xdd\xff\xff\xff\xff", "over the limit"},  // an array of 2^32-1 events, 7 bytes
      {raw("\x92\x01\xdd\x00\x10\x00\x00"), "truncated"},  // 1M events announced, none sent
      {std::string(100, '\x91'), "nested deeper"},
      // Found by fuzz_kv_events: a medium that is not UTF-8 made the JSON report throw.
      {raw("\x92\x01\x91\x93\xac"
           "BlockRemoved"
           "\x90\xa2\xc0\x80"),
       "not UTF-8"},
  };
  for (const auto& c : cases) {
    auto d = decode_event_batch(c.bytes, 17);
    ASSERT_FALSE(d.is_ok()) << c.expect;
    EXPECT_NE(d.status().message().find("batch 17"), std::string::npos) << d.status().message();
    EXPECT_NE(d.status().message().find(c.expect), std::string::npos) << d.status().message();
  }
}

TEST(KvEventRecording, RoundTripsAndNamesTheBadFrame) {
  std::ostringstream out;
  write_recording_header(out);
  for (const auto& b : clean_stream()) write_recording_frame(out, {b.seq, encode_event_batch(b)});
  std::istringstream in(out.str());
  auto frames = read_recording(in, "s.kvev");
  ASSERT_TRUE(frames.is_ok()) << frames.status().message();
  ASSERT_EQ(frames->size(), clean_stream().size());
  EXPECT_EQ((*frames)[6].seq, 6);

  auto truncated = parse_recording(out.str().substr(0, out.str().size() - 1), "s.kvev");
  ASSERT_FALSE(truncated.is_ok());
  EXPECT_NE(truncated.status().message().find("s.kvev: frame 6 at offset"), std::string::npos)
      << truncated.status().message();
  auto huge = parse_recording(std::string(kRecordingMagic) + encode_seq(0) + raw("\x7f\xff\xff\xff"), "h.kvev");
  ASSERT_FALSE(huge.is_ok());
  EXPECT_NE(huge.status().message().find("over the 16 MiB limit"), std::string::npos);
  EXPECT_FALSE(parse_recording("{\"ev\":\"init\"}", "log.jsonl").is_ok());
  EXPECT_EQ(decode_seq(encode_seq(-1)), -1);
  EXPECT_EQ(encode_seq(258), std::string("\0\0\0\0\0\0\x01\x02", 8));
}

TEST(KvEventAudit, CleanStreamPassesWithTheMirrorAtTheEnd) {
  for (Encoding enc : {Encoding::kArray, Encoding::kMap}) {
    const auto audit = audit_kv_events(over_the_wire(clean_stream(), enc), "clean");
    EXPECT_TRUE(audit.passed()) << audit.summary();
    EXPECT_EQ(audit.batches, 7);
    EXPECT_EQ(audit.mirror.clears, 1);
    EXPECT_EQ(audit.mirror.held_per_medium, (std::map<std::string, int64_t>{{"GPU", 1}}));
    EXPECT_EQ(audit.mirror.never_removed, std::vector<std::string>{"GPU 0x0d01"});
  }
  // Before the clear: each tenant's and the adapter's blocks under their own namespace.
  auto upto = clean_stream();
  upto.resize(2);
  const Mirror m = mirror_at_end(upto);
  EXPECT_EQ(m.held_per_namespace, (std::map<std::string, int64_t>{
                                      {"base salt=tenant-a", 3}, {"base salt=tenant-b", 1}, {"lora=sql-adapter", 2}}));
}

TEST(KvEventAudit, DuplicateDeliveriesAreTolerated) {
  auto s = clean_stream();
  s.insert(s.begin() + 3, s[1]);  // batch 1 again, as a replay would resend it
  const auto audit = audit_kv_events(over_the_wire(s), "dup");
  EXPECT_TRUE(audit.passed()) << audit.summary();
  EXPECT_EQ(audit.duplicates, 1);
}

// ---- planted streams: one per violation class ----

TEST(KvEventPlanted, LostBatchIsASequenceGap) {
  auto s = clean_stream();
  s.erase(s.begin() + 2, s.begin() + 4);  // batches 2 and 3 lost
  const auto v = check_sequence(over_the_wire(s));
  ASSERT_EQ(reasons(v), std::vector<std::string>{kSequenceGap});
  EXPECT_EQ(v[0].seq, 4);
  EXPECT_NE(v[0].detail.find("2 batches lost: 2..3"), std::string::npos) << v[0].detail;
}

TEST(KvEventPlanted, RemovalOfABlockNeverStored) {
  auto s = clean_stream();
  s.push_back(batch(7, {removed({"0x0e99"})}));
  s.push_back(batch(8, {removed({"0x0d01"}, "CPU")}));  // held, but on the GPU only
  const auto v = check_removed_were_stored(over_the_wire(s));
  ASSERT_EQ(reasons(v), (std::vector<std::string>{kRemovedNotStored, kRemovedNotStored}));
  EXPECT_EQ(v[0].seq, 7);
  EXPECT_EQ(v[0].block_hash, "0x0e99");
  EXPECT_EQ(v[1].block_hash, "0x0d01");
  EXPECT_TRUE(audit_kv_events(over_the_wire(s), "p").violations.size() == 2);
}

TEST(KvEventPlanted, BlockStoredTwiceWithoutRemoval) {
  auto s = clean_stream();
  s.push_back(batch(7, {stored({"0x0d01"}, std::nullopt)}));
  const auto v = check_stored_once(over_the_wire(s));
  ASSERT_EQ(reasons(v), std::vector<std::string>{kStoredTwice});
  EXPECT_EQ(v[0].seq, 7);
  EXPECT_EQ(v[0].block_hash, "0x0d01");
}

TEST(KvEventPlanted, PartialBlockAndSecondBlockSize) {
  auto s = clean_stream();
  BlockStored partial = stored({"0x0f01"}, std::nullopt);
  partial.token_ids.pop_back();
  s.push_back(batch(7, {partial}));
  s.push_back(batch(8, {stored({"0x0f02"}, std::nullopt, 4)}));
  const auto v = check_block_sizes(over_the_wire(s));
  ASSERT_EQ(reasons(v), (std::vector<std::string>{kTokenCount, kBlockSizeChanged}));
  EXPECT_EQ(v[0].seq, 7);
  EXPECT_EQ(v[0].block_hash, "0x0f01");
  EXPECT_EQ(v[1].seq, 8);
  EXPECT_NE(v[1].detail.find("block size 4, the stream's is 2"), std::string::npos) << v[1].detail;
}

// SGLang #24568's class: tenant B's block chained onto tenant A's (B's salt on the child, A's
// on the parent), and a hash that ignores the salt naming blocks of both tenants.
TEST(KvEventPlanted, ChainAcrossASaltAndAHashThatIgnoresTheSalt) {
  auto s = clean_stream();
  s.resize(2);
  BlockStored cross = stored({"0x0b02"}, BlockHash("0x0a02"));
  cross.extra_keys = {{"cache_salt", "tenant-b"}};  // SGLang: one map for the event
  s.push_back(batch(2, {cross}));
  const auto v = check_namespaces(over_the_wire(s));
  ASSERT_EQ(reasons(v), std::vector<std::string>{kNamespaceCrossing});
  EXPECT_EQ(v[0].seq, 2);
  EXPECT_EQ(v[0].block_hash, "0x0b02");

  auto m = clean_stream();
  m.resize(1);
  m.push_back(batch(1, {removed({"0x0b01"})}));
  BlockStored merged = stored({"0x0b01"}, std::nullopt);
  merged.extra_keys = nlohmann::json::array({nlohmann::json::array({"tenant-c"})});
  m.push_back(batch(2, {merged}));
  const auto w = check_namespaces(over_the_wire(m));
  ASSERT_EQ(reasons(w), std::vector<std::string>{kNamespaceMerge});
  EXPECT_EQ(w[0].block_hash, "0x0b01");
}

TEST(KvEventPlanted, LoraChildOfABaseBlock) {
  auto s = clean_stream();
  s.resize(1);
  BlockStored child = stored({"90"}, BlockHash("0x0a02"));
  child.lora_name = "other";
  s.push_back(batch(1, {child}));
  const auto v = check_namespaces(over_the_wire(s));
  ASSERT_EQ(reasons(v), std::vector<std::string>{kNamespaceCrossing});
  EXPECT_NE(v[0].detail.find("lora=other"), std::string::npos) << v[0].detail;
}

TEST(KvEventPlanted, BlockFromBeforeAClearReferencedAfterIt) {
  auto s = clean_stream();
  s.resize(5);  // up to the clear; 0x0a02 and 0x0b01 were held on the GPU
  s.push_back(batch(5, {stored({"0x0a09"}, BlockHash("0x0a02"))}));
  s.push_back(batch(6, {removed({"0x0b01"})}));
  const auto v = check_no_reference_after_clear(over_the_wire(s));
  ASSERT_EQ(reasons(v), (std::vector<std::string>{kStaleAfterClear, kStaleAfterClear}));
  EXPECT_EQ(v[0].block_hash, "0x0a02");
  EXPECT_EQ(v[1].seq, 6);
  EXPECT_EQ(v[1].block_hash, "0x0b01");
  // Left to this checker alone: the removal is not also reported as never stored.
  EXPECT_TRUE(check_removed_were_stored(over_the_wire(s)).empty());
}

// TensorRT-LLM PR #16335's class: blocks detached without a removal stay in every mirror.
TEST(KvEventPlanted, BlocksNeverRemovedShowInTheMirror) {
  auto s = clean_stream();
  s.resize(2);
  const Mirror m = mirror_at_end(over_the_wire(s));
  EXPECT_EQ(m.held_per_medium.at("GPU"), 6);
  EXPECT_EQ(m.never_removed.front(), "GPU 0x0a01");
  const auto audit = audit_kv_events(over_the_wire(s), "p");
  EXPECT_NE(audit.summary().find("GPU=6"), std::string::npos) << audit.summary();
  EXPECT_EQ(audit.to_json()["mirror"]["never_removed"].size(), 6u);
}

// ---- properties stated on both sides (issue 43) ----

// Any jump but +1 is a gap: the smallest loss, one batch, is one.
TEST(KvEventPlanted, ExactlyOneLostBatchIsAGap) {
  auto s = clean_stream();
  s.erase(s.begin() + 3);  // batch 3 lost
  const auto v = check_sequence(over_the_wire(s));
  ASSERT_EQ(reasons(v), std::vector<std::string>{kSequenceGap});
  EXPECT_EQ(v[0].seq, 4);
  EXPECT_NE(v[0].detail.find("1 batch lost: 3"), std::string::npos) << v[0].detail;
  EXPECT_TRUE(check_sequence(over_the_wire(clean_stream())).empty());
}

// Older vLLM names an adapter by lora_id alone: it is a namespace of its own, exactly as one
// named by lora_name (a chain from the base model into it crosses; one hash in both merges).
TEST(KvEventPlanted, AnAdapterNamedOnlyByLoraIdIsItsOwnNamespace) {
  const auto by_id = [](std::vector<BlockHash> hashes, std::optional<BlockHash> parent, int64_t id) {
    BlockStored b = stored(std::move(hashes), std::move(parent));
    b.lora_id = id;
    return b;
  };
  // Clean: an adapter's chain continues within it; another adapter id is another namespace.
  const std::vector<EventBatch> clean = {batch(0, {by_id({"0x1101"}, std::nullopt, 5)}),
                                         batch(1, {by_id({"0x1102"}, BlockHash("0x1101"), 5)}),
                                         batch(2, {by_id({"0x1201"}, std::nullopt, 6)})};
  EXPECT_TRUE(check_namespaces(over_the_wire(clean)).empty());
  const Mirror m = mirror_at_end(over_the_wire(clean));
  EXPECT_EQ(m.held_per_namespace.at("lora_id=5"), 2);
  EXPECT_EQ(m.held_per_namespace.at("lora_id=6"), 1);

  auto crossing = clean_stream();
  crossing.resize(1);                                                         // 0x0a02: a base block (salt tenant-a)
  crossing.push_back(batch(1, {by_id({"0x1103"}, BlockHash("0x0a02"), 5)}));  // adapter 5 on a base block
  crossing.push_back(batch(2, {by_id({"0x1104"}, std::nullopt, 5)}));
  crossing.push_back(batch(3, {by_id({"0x1105"}, BlockHash("0x1104"), 6)}));  // adapter 6 on 5's block
  BlockStored base_child = stored({"0x1106"}, BlockHash("0x1104"));           // the base model on 5's block
  crossing.push_back(batch(4, {base_child}));
  const auto v = check_namespaces(over_the_wire(crossing));
  ASSERT_EQ(reasons(v), (std::vector<std::string>{kNamespaceCrossing, kNamespaceCrossing, kNamespaceCrossing}));
  EXPECT_EQ(v[0].block_hash, "0x1103");
  EXPECT_EQ(v[1].block_hash, "0x1105");
  EXPECT_NE(v[1].detail.find("lora_id=6"), std::string::npos) << v[1].detail;
  EXPECT_EQ(v[2].block_hash, "0x1106");

  const std::vector<EventBatch> merged = {batch(0, {stored({"0x1301"}, std::nullopt)}), batch(1, {removed({"0x1301"})}),
                                          batch(2, {by_id({"0x1301"}, std::nullopt, 5)})};
  const auto w = check_namespaces(over_the_wire(merged));
  ASSERT_EQ(reasons(w), std::vector<std::string>{kNamespaceMerge});
  EXPECT_NE(w[0].detail.find("lora_id=5"), std::string::npos) << w[0].detail;
}

// A block held before the first of several AllBlocksCleared stays stale after every later one
// (and one stored between two clears is stale after the second).
TEST(KvEventPlanted, ABlockHeldAtTheFirstOfSeveralClearsStaysStale) {
  std::vector<EventBatch> s = {batch(0, {stored({"0x2101"}, std::nullopt)}), batch(1, {AllBlocksCleared{}}),
                               batch(2, {stored({"0x2201"}, std::nullopt)}), batch(3, {AllBlocksCleared{}}),
                               batch(4, {AllBlocksCleared{}})};
  EXPECT_TRUE(check_no_reference_after_clear(over_the_wire(s)).empty());
  s.push_back(batch(5, {removed({"0x2101"})}));
  s.push_back(batch(6, {stored({"0x2102"}, BlockHash("0x2101"))}));
  s.push_back(batch(7, {removed({"0x2201"})}));
  const auto v = check_no_reference_after_clear(over_the_wire(s));
  ASSERT_EQ(reasons(v), (std::vector<std::string>{kStaleAfterClear, kStaleAfterClear, kStaleAfterClear}));
  EXPECT_EQ(v[0].seq, 5);
  EXPECT_EQ(v[0].block_hash, "0x2101");
  EXPECT_EQ(v[1].seq, 6);
  EXPECT_EQ(v[1].block_hash, "0x2101");
  EXPECT_EQ(v[2].block_hash, "0x2201");
  EXPECT_TRUE(check_removed_were_stored(over_the_wire(s)).empty());  // left to the stale checker
  // Stored again after the clears, it is fresh: its removal is no violation.
  std::vector<EventBatch> again(s.begin(), s.begin() + 5);
  again.push_back(batch(5, {stored({"0x2101"}, std::nullopt)}));
  again.push_back(batch(6, {removed({"0x2101"})}));
  // ... and once removed again, naming it as a parent (it was evicted) is no stale reference.
  again.push_back(batch(7, {stored({"0x2103"}, BlockHash("0x2101"))}));
  EXPECT_TRUE(check_no_reference_after_clear(over_the_wire(again)).empty());
}

// One block size per KV-cache group: a hybrid model's groups may differ (no violation); a
// group that changes its own is one.
TEST(KvEventPlanted, BlockSizesArePerKvCacheGroup) {
  const auto in_group = [](BlockHash h, int64_t group, int64_t block_size) {
    BlockStored b = stored({std::move(h)}, std::nullopt, block_size);
    b.group_idx = group;
    return b;
  };
  std::vector<EventBatch> s = {batch(0, {in_group("0x4101", 0, 2)}), batch(1, {in_group("0x4201", 1, 4)})};
  EXPECT_TRUE(check_block_sizes(over_the_wire(s)).empty());
  s.push_back(batch(2, {in_group("0x4202", 1, 2)}));
  const auto v = check_block_sizes(over_the_wire(s));
  ASSERT_EQ(reasons(v), std::vector<std::string>{kBlockSizeChanged});
  EXPECT_EQ(v[0].block_hash, "0x4202");
}

// A block is held per medium: removing its CPU copy leaves the GPU copy held (storing the GPU
// copy again is a second store) and frees the CPU one (storing it again is not).
TEST(KvEventPlanted, StoresAndRemovalsArePerMedium) {
  BlockStored cpu = stored({"0x5101"}, std::nullopt);
  cpu.medium = "CPU";
  std::vector<EventBatch> s = {batch(0, {stored({"0x5101"}, std::nullopt), cpu}),
                               batch(1, {removed({"0x5101"}, "CPU")}), batch(2, {cpu})};
  EXPECT_TRUE(check_stored_once(over_the_wire(s)).empty());
  EXPECT_TRUE(check_removed_were_stored(over_the_wire(s)).empty());
  s.push_back(batch(3, {stored({"0x5101"}, std::nullopt)}));
  const auto v = check_stored_once(over_the_wire(s));
  ASSERT_EQ(reasons(v), std::vector<std::string>{kStoredTwice});
  EXPECT_EQ(v[0].seq, 3);
  EXPECT_NE(v[0].detail.find("medium GPU"), std::string::npos) << v[0].detail;
}

// A store of one block whose extra_keys nests so that the payload is `depth` deep: the batch
// (1), its events (2), the event (3), extra_keys (4), and one more per level inside.
std::string payload_of_depth(std::size_t depth) {
  nlohmann::json keys = nlohmann::json::array();
  for (std::size_t d = 4; d < depth; ++d) keys = nlohmann::json::array({keys});
  BlockStored b = stored({"0x3101"}, std::nullopt);
  b.extra_keys = keys;
  return encode_event_batch(batch(0, {b}));
}

TEST(KvEventDecoder, NestingDepthLimitAcceptsItsLimitAndRefusesOnePast) {
  const auto at = decode_event_batch(payload_of_depth(32), 0);
  EXPECT_TRUE(at.is_ok()) << at.status().message();
  const auto past = decode_event_batch(payload_of_depth(33), 0);
  ASSERT_FALSE(past.is_ok());
  EXPECT_NE(past.status().message().find("nested deeper than 32"), std::string::npos) << past.status().message();
}

TEST(KvEventDecoder, ArrayLengthLimitAcceptsItsLimitAndRefusesOnePast) {
  BlockStored b = stored({"0x3201"}, std::nullopt, 1);
  b.token_ids.assign(kMaxArrayElements, 0);
  const auto at = decode_event_batch(encode_event_batch(batch(0, {b})), 0);
  ASSERT_TRUE(at.is_ok()) << at.status().message();
  EXPECT_EQ(std::get<BlockStored>(at->events[0]).token_ids.size(), kMaxArrayElements);
  b.token_ids.push_back(0);
  const auto past = decode_event_batch(encode_event_batch(batch(0, {b})), 0);
  ASSERT_FALSE(past.is_ok());
  EXPECT_NE(past.status().message().find("4194305 elements, over the limit of 4194304"), std::string::npos)
      << past.status().message();
}

// A payload of exactly `bytes` bytes: 2^21 token ids of three bytes each (6 MiB), and a
// lora_name (a str32) that makes up the rest.
std::string payload_of_size(std::size_t bytes) {
  BlockStored b = stored({"0x3301"}, std::nullopt, 1);
  b.token_ids.assign(std::size_t{1} << 21, 1000);
  b.lora_name = std::string(std::size_t{1} << 17, 'a');
  const std::size_t base = encode_event_batch(batch(0, {b})).size();
  b.lora_name = std::string(bytes - base + (std::size_t{1} << 17), 'a');
  std::string p = encode_event_batch(batch(0, {b}));
  EXPECT_EQ(p.size(), bytes);
  return p;
}

TEST(KvEventDecoder, PayloadSizeLimitAcceptsItsLimitAndRefusesOnePast) {
  const std::string at = payload_of_size(kMaxPayloadBytes);
  EXPECT_TRUE(decode_event_batch(at, 0).is_ok());
  const auto past = decode_event_batch(payload_of_size(kMaxPayloadBytes + 1), 0);
  ASSERT_FALSE(past.is_ok());
  EXPECT_NE(past.status().message().find("payload of 16777217 bytes, over the 16 MiB limit"), std::string::npos)
      << past.status().message();
  // The recording's frame length has the same bound.
  std::ostringstream rec;
  write_recording_header(rec);
  write_recording_frame(rec, {0, at});
  auto frames = parse_recording(rec.str(), "r.kvev");
  ASSERT_TRUE(frames.is_ok()) << frames.status().message();
  EXPECT_EQ((*frames)[0].payload.size(), kMaxPayloadBytes);
  const std::string one_past =
      std::string(kRecordingMagic) + encode_seq(0) + raw("\x01\x00\x00\x01") + std::string(kMaxPayloadBytes + 1, 'x');
  auto refused = parse_recording(one_past, "r.kvev");
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("payload length 16777217 over the 16 MiB limit"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace kvp::kv_events

namespace kvp::kv_events {
namespace {

void write_recording(const std::string& path, const std::vector<EventBatch>& batches, Encoding enc) {
  std::ofstream out(path, std::ios::binary);
  write_recording_header(out);
  for (const auto& b : batches) write_recording_frame(out, {b.seq, encode_event_batch(b, enc)});
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// Writes the seeds of fuzz/corpus/kv_events (the fuzzer's, and the inputs of the kv_events.cli
// tests) into `dir`.
void write_corpus(const std::string& dir) {
  write_recording(dir + "/clean.kvev", clean_stream(), Encoding::kArray);
  write_recording(dir + "/clean_map.kvev", clean_stream(), Encoding::kMap);
  auto gap = clean_stream();
  gap.erase(gap.begin() + 2, gap.begin() + 4);
  write_recording(dir + "/planted_sequence_gap.kvev", gap, Encoding::kArray);
  auto stale = clean_stream();
  stale.resize(5);
  stale.push_back(batch(5, {stored({"0x0a09"}, BlockHash("0x0a02"))}));
  write_recording(dir + "/planted_stale_after_clear.kvev", stale, Encoding::kArray);
  auto cross = clean_stream();
  cross.resize(2);
  BlockStored c = stored({"0x0b02"}, BlockHash("0x0a02"));
  c.extra_keys = {{"cache_salt", "tenant-b"}};
  cross.push_back(batch(2, {c}));
  write_recording(dir + "/planted_namespace_crossing.kvev", cross, Encoding::kMap);
  auto twice = clean_stream();
  twice.push_back(batch(7, {stored({"0x0d01"}, std::nullopt), removed({"0x0e99"})}));
  write_recording(dir + "/planted_stored_twice_removed_not_stored.kvev", twice, Encoding::kArray);
  // Bad input: a truncated frame, a wrong tag, a wrong field count, a huge array.
  write_recording(dir + "/bad_truncated_frame.kvev", clean_stream(), Encoding::kArray);
  std::ifstream in(dir + "/bad_truncated_frame.kvev", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_bytes(dir + "/bad_truncated_frame.kvev", all.substr(0, all.size() - 5));
  auto one_frame = [](const std::string& payload) {
    std::ostringstream o;
    write_recording_header(o);
    write_recording_frame(o, {0, payload});
    return o.str();
  };
  write_bytes(dir + "/bad_wrong_tag.kvev", one_frame(raw("\x92\x01\x91\x92\xa4"
                                                         "Nope"
                                                         "\x90")));
  write_bytes(dir + "/bad_field_count.kvev", one_frame(raw("\x92\x01\x91\x93\xab"
                                                           "BlockStored"
                                                           "\x90\xc0")));
  write_bytes(dir + "/bad_huge_array.kvev", one_frame(raw("\x92\x01\xdd\xff\xff\xff\xff")));
  write_bytes(dir + "/payload_stored.bin", encode_event_batch(clean_stream()[1]));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The checked-in seeds are what write_corpus writes today: a change to the encoder or to the
// planted streams shows here. To regenerate them:
//   KVPROOF_KV_EVENTS_CORPUS=fuzz/corpus/kv_events build/bin/kv_events_test --gtest_filter='*Corpus*'
TEST(KvEventCorpus, CheckedInSeedsAreWhatTheCodeWrites) {
  if (const char* regenerate = std::getenv("KVPROOF_KV_EVENTS_CORPUS")) write_corpus(regenerate);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "kvp_kv_events_corpus_test";
  std::filesystem::create_directories(dir);
  write_corpus(dir.string());
  int compared = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const std::string checked_in = std::string(KVPROOF_SOURCE_DIR) + "/fuzz/corpus/kv_events/" + name;
    ASSERT_TRUE(std::filesystem::exists(checked_in)) << checked_in << " is missing";
    EXPECT_EQ(read_bytes(entry.path().string()), read_bytes(checked_in))
        << name << " differs from what the code writes";
    ++compared;
  }
  std::filesystem::remove_all(dir);
  EXPECT_EQ(compared, 11);
}

}  // namespace
}  // namespace kvp::kv_events
