#include "cache/file_key.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>

#include "cache/backend/reader.h"
#include "cache/mutex.h"

namespace accelfs {

std::vector<FingerprintSpan> FingerprintSpans(uint64_t size, bool tail_only) {
  if (size == 0) return {};
  if (tail_only && size > 2 * kFingerprintPage) {
    const uint64_t last = (size - 1) / kFingerprintPage * kFingerprintPage;
    return {{last - kFingerprintPage, kFingerprintPage}, {last, size - last}};
  }
  const uint64_t first = std::min(size, kFingerprintPage);
  if (size <= first) return {{0, first}};
  const uint64_t last = std::max((size - 1) / kFingerprintPage * kFingerprintPage, first);
  return {{0, first}, {last, size - last}};
}

Place PlaceOfPath(std::string_view relative) {
  std::string normal;
  normal.reserve(relative.size());
  while (!relative.empty()) {
    const size_t slash = relative.find('/');
    const std::string_view part = relative.substr(0, slash);
    relative = slash == std::string_view::npos ? std::string_view() : relative.substr(slash + 1);
    if (part.empty() || part == ".") continue;
    if (!normal.empty()) normal += '/';
    normal += part;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  Place place{};
  // SHA-256 cannot fail on a digest this small short of a broken libcrypto: abort, never a place
  // of zeros that many paths would share.
  if (EVP_Digest(normal.data(), normal.size(), digest, &length, EVP_sha256(), nullptr) != 1 ||
      length < sizeof(place)) {
    std::abort();
  }
  std::memcpy(place.data(), digest, sizeof(place));
  return place;
}

std::string PlaceHex(const Place& place) {
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(place[0]),
                static_cast<unsigned long long>(place[1]));
  return hex;
}

uint64_t ContentFingerprint(std::span<const std::byte> samples, uint64_t size) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, 64 bits
  const auto mix = [&h](uint8_t byte) {
    h ^= byte;
    h *= 0x100000001b3ULL;
  };
  for (std::byte b : samples) mix(static_cast<uint8_t>(b));
  for (int i = 0; i < 8; ++i) mix(static_cast<uint8_t>(size >> (8 * i)));  // how much was read
  return h;
}

namespace {

// Reads `reads` of `file` through `reader`, read i into one buffer of `capacity` bytes at at[i],
// and waits for every answer (or for `cancelled`: ECANCELED). The bytes each read got; `buffer`
// receives the buffer.
Result<std::vector<size_t>> ReadIdentitySpans(StoreReader& reader,
                                              const std::shared_ptr<BackingFile>& file,
                                              const std::vector<FingerprintSpan>& reads,
                                              const std::vector<uint64_t>& at, uint64_t capacity,
                                              const std::function<bool()>& cancelled,
                                              std::shared_ptr<const std::byte>* buffer) {
  // Filled in parallel. The state is the requests' own: a read stalled past the store timeout
  // answers here at once, yet may still write into its buffer later (BoundedReader), so the
  // buffer lives until its `done`.
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  struct Sample {
    Mutex mu;
    bool answered ACCELFS_GUARDED_BY(mu) = false;
    std::promise<Result<size_t>> got;
  };
  struct State {
    std::unique_ptr<std::byte, Free> buffer;
    std::vector<Sample> samples;
  };
  auto state = std::make_shared<State>();
  state->buffer.reset(static_cast<std::byte*>(std::aligned_alloc(kFingerprintPage, capacity)));
  if (!state->buffer) return Error(ENOMEM);
  state->samples = std::vector<Sample>(reads.size());
  const auto answer = [](Sample& s, Result<size_t> n) {
    MutexLock lock(s.mu);
    if (s.answered) return;
    s.answered = true;
    s.got.set_value(std::move(n));
  };
  std::vector<std::future<Result<size_t>>> futures;
  for (size_t i = 0; i < reads.size(); ++i) {
    futures.push_back(state->samples[i].got.get_future());
    ReadRequest r;
    r.file = file;
    r.offset = reads[i].offset;
    r.buffer = state->buffer.get() + at[i];
    r.capacity = (i + 1 < at.size() ? at[i + 1] : capacity) - at[i];
    r.expected = reads[i].length;
    r.demand = true;
    r.done = [state, i, answer](Result<size_t> n) { answer(state->samples[i], std::move(n)); };
    r.stalled = [state, i, answer] { answer(state->samples[i], Error(ETIMEDOUT)); };
    reader.Submit(std::move(r));
  }
  std::vector<size_t> got(reads.size(), 0);
  Status failed;
  for (size_t i = 0; i < reads.size(); ++i) {
    if (cancelled) {
      while (futures[i].wait_for(kIdentifyPoll) != std::future_status::ready) {
        if (cancelled()) return Error(ECANCELED);
      }
    }
    Result<size_t> n = futures[i].get();
    if (!n.ok()) {
      if (failed.ok()) failed = n.error();
      continue;
    }
    got[i] = std::min<size_t>(n.value(), reads[i].length);
  }
  if (!failed.ok()) return failed.error();
  *buffer = std::shared_ptr<const std::byte>(state, state->buffer.get());
  return got;
}

}  // namespace

Result<FileKey> IdentifyFile(StoreReader& reader, const std::shared_ptr<BackingFile>& file,
                             const struct stat& st, const Place& place,
                             const std::function<bool()>& cancelled, uint64_t whole_max,
                             std::vector<std::byte>* whole, std::vector<std::byte>* head) {
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const std::vector<FingerprintSpan> spans = FingerprintSpans(size, file->tail_samples());
  if (spans.empty()) return FileKeyFromStat(st, ContentFingerprint({}, 0), place);
  // What is read: the spans, one aligned page each (O_DIRECT), or the whole file in one request,
  // or its head in the first span's request (that span is the head's first page).
  const bool read_whole = whole != nullptr && size <= whole_max;
  std::vector<FingerprintSpan> reads = read_whole ? std::vector<FingerprintSpan>{{0, size}} : spans;
  const bool read_head = !read_whole && whole != nullptr && head != nullptr &&
                         whole_max > kFingerprintPage && spans[0].offset == 0;
  if (read_head) reads[0].length = whole_max;
  std::vector<uint64_t> at;  // each read's place in the buffer
  uint64_t capacity = 0;
  for (const FingerprintSpan& r : reads) {
    at.push_back(capacity);
    capacity += (r.length + kFingerprintPage - 1) / kFingerprintPage * kFingerprintPage;
  }
  std::shared_ptr<const std::byte> filled;
  const Result<std::vector<size_t>> read =
      ReadIdentitySpans(reader, file, reads, at, capacity, cancelled, &filled);
  if (!read.ok()) return read.error();
  const std::vector<size_t>& got = read.value();
  // The sampled bytes, the same whichever way they were read: what of each span came back.
  const std::byte* buffer = filled.get();
  std::vector<std::byte> samples;
  for (size_t i = 0; i < spans.size(); ++i) {
    const uint64_t begin = read_whole ? spans[i].offset : at[i];
    const uint64_t came = read_whole ? got[0] : begin + got[i];
    const uint64_t end = std::min(begin + spans[i].length, came);
    if (end > begin) samples.insert(samples.end(), buffer + begin, buffer + end);
  }
  if (read_whole && got[0] == size) whole->assign(buffer, buffer + size);
  if (read_head && got[0] == whole_max) head->assign(buffer, buffer + whole_max);
  return FileKeyFromStat(st, ContentFingerprint(samples, samples.size()), place);
}

}  // namespace accelfs
