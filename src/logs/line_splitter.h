// LineSplitter: cuts one worker stream's bytes into line units. Pure, no I/O; one per stream.
//
// A unit ends at '\n', at "\r\n" (the '\r' stays in the text), or at a bare '\r' (a progress-bar
// update such as tqdm's, kept as its own unit so it is never merged into another rank's line).
// A bare '\r' that is the last byte fed waits for the next byte (it may be half of "\r\n").
// Lines longer than max_line are cut into max_line-byte units (never inside a UTF-8 sequence
// when the bytes are valid UTF-8; invalid bytes pass through untouched); the text buffered
// between Feed calls is therefore bounded by max_line. Finish() (EOF) emits what is left, so the
// last words of a crashing worker are never lost.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ctrun::logs {

enum class LineEnd : uint8_t {
  kNewline,  // "\n" (text may end with the '\r' of "\r\n")
  kReturn,   // a bare '\r' (not in the text)
  kCut,      // max_line reached; the line continues in the next unit
  kEof,      // stream ended without a final newline
};

struct LineUnit {
  std::string_view text;
  LineEnd end;
  bool continuation;  // this unit continues a line that was cut (kCut) before
};

class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line = 64 * 1024) : max_line_(max_line < 8 ? 8 : max_line) {}

  // Calls emit(const LineUnit&) for every complete unit in data (in order). Views are valid only
  // during the call.
  template <typename Emit>
  void Feed(std::string_view data, Emit&& emit);
  // End of stream: emits the partial line, if any.
  template <typename Emit>
  void Finish(Emit&& emit);

  size_t pending_bytes() const { return partial_.size(); }
  // The buffered partial line (without a trailing '\r' that may still turn into "\r\n").
  std::string_view pending() const {
    std::string_view p(partial_);
    return cr_pending_ ? p.substr(0, p.size() - 1) : p;
  }

 private:
  template <typename Emit>
  void EmitLine(const char* b, const char* e, LineEnd end, Emit& emit);
  template <typename Emit>
  void EmitBounded(std::string_view text, LineEnd end, Emit& emit);
  template <typename Emit>
  void AppendPartial(const char* b, const char* e, Emit& emit);
  size_t CutPoint(std::string_view s) const;

  size_t max_line_;
  std::string partial_;      // incomplete line carried over between Feed calls (<= max_line_ + 1)
  bool cr_pending_ = false;  // partial_ ends with a '\r' that may start "\r\n"
  bool continuation_ = false;
};

// ---- implementation (inline: this is the relay's hot loop) ---------------------------------

#if defined(__GNUC__)
#define CTRUN_HOT_INLINE inline __attribute__((always_inline))
#else
#define CTRUN_HOT_INLINE inline
#endif

// Finds the line terminators ('\n', '\r') of one Feed: one bitmask per 64-byte block, then one
// count-trailing-zeros per terminator, instead of a memchr call per line.
class EolScanner {
 public:
  EolScanner(const char* b, const char* e) : base_(b), end_(e), mask_(Mask(b)) {}
  // The first terminator at or after p (p >= the position given before), or end.
  CTRUN_HOT_INLINE const char* Next(const char* p) {
    for (;;) {
      if (p - base_ >= 64) {
        base_ += 64 * static_cast<size_t>((p - base_) / 64);
        if (base_ >= end_) return end_;
        mask_ = Mask(base_);
      }
      uint64_t m = mask_ & (~uint64_t{0} << (p - base_));
      if (m != 0) return base_ + __builtin_ctzll(m);
      base_ += 64;
      if (base_ >= end_) return end_;
      mask_ = Mask(base_);
      p = base_;
    }
  }

 private:
  uint64_t Mask(const char* b) const {
    const size_t n = static_cast<size_t>(end_ - b);
    if (n >= 64) return FullMask(b);
    uint64_t m = 0;
    for (size_t i = 0; i < n; ++i) {
      if (b[i] == '\n' || b[i] == '\r') m |= uint64_t{1} << i;
    }
    return m;
  }
  // 64 readable bytes at b. Not inlined: inlined into a Feed of a tiny array, GCC 12 warns about
  // the (unreachable) 16-byte loads.
#if defined(__GNUC__)
  __attribute__((noinline))
#endif
  static uint64_t FullMask(const char* b) {
    uint64_t m = 0;
#if defined(__SSE2__)
    const __m128i nl = _mm_set1_epi8('\n');
    const __m128i cr = _mm_set1_epi8('\r');
    for (int i = 0; i < 4; ++i) {
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * i));
      __m128i hit = _mm_or_si128(_mm_cmpeq_epi8(v, nl), _mm_cmpeq_epi8(v, cr));
      m |= static_cast<uint64_t>(static_cast<uint32_t>(_mm_movemask_epi8(hit))) << (16 * i);
    }
#else
    for (size_t i = 0; i < 64; ++i) {
      if (b[i] == '\n' || b[i] == '\r') m |= uint64_t{1} << i;
    }
#endif
    return m;
  }

  const char* base_;
  const char* end_;
  uint64_t mask_;
};

inline size_t LineSplitter::CutPoint(std::string_view s) const {
  size_t c = max_line_;
  auto is_cont = [&](size_t i) { return (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80; };
  size_t k = c;
  while (k > max_line_ - 3 && is_cont(k)) --k;
  return is_cont(k) ? c : k;  // invalid UTF-8: cut anywhere
}

template <typename Emit>
void LineSplitter::EmitBounded(std::string_view text, LineEnd end, Emit& emit) {
  while (text.size() > max_line_) {
    size_t c = CutPoint(text);
    emit(LineUnit{text.substr(0, c), LineEnd::kCut, continuation_});
    continuation_ = true;
    text.remove_prefix(c);
  }
  emit(LineUnit{text, end, continuation_});
  continuation_ = false;
}

template <typename Emit>
CTRUN_HOT_INLINE void LineSplitter::EmitLine(const char* b, const char* e, LineEnd end, Emit& emit) {
  if (partial_.empty()) {
    const size_t n = static_cast<size_t>(e - b);
    if (n <= max_line_ && !continuation_) {  // the usual short line: straight out
      emit(LineUnit{std::string_view(b, n), end, false});
      return;
    }
    EmitBounded(std::string_view(b, static_cast<size_t>(e - b)), end, emit);
    return;
  }
  partial_.append(b, e);
  EmitBounded(partial_, end, emit);
  partial_.clear();
}

template <typename Emit>
void LineSplitter::AppendPartial(const char* b, const char* e, Emit& emit) {
  partial_.append(b, e);
  // A trailing '\r' may still turn out to be a line end: it does not count against the limit.
  const size_t limit = max_line_ + (partial_.back() == '\r' ? 1 : 0);
  if (partial_.size() <= limit) return;
  std::string_view rest(partial_);
  while (rest.size() > limit) {
    size_t c = CutPoint(rest);
    emit(LineUnit{rest.substr(0, c), LineEnd::kCut, continuation_});
    continuation_ = true;
    rest.remove_prefix(c);
  }
  partial_.erase(0, partial_.size() - rest.size());
}

template <typename Emit>
void LineSplitter::Feed(std::string_view data, Emit&& emit) {
  const char* p = data.data();
  const char* const end = p + data.size();
  if (p == end) return;
  if (cr_pending_) {
    cr_pending_ = false;
    if (*p == '\n') {
      EmitBounded(partial_, LineEnd::kNewline, emit);  // text keeps the '\r'
      ++p;
    } else {
      EmitBounded(std::string_view(partial_).substr(0, partial_.size() - 1), LineEnd::kReturn, emit);
    }
    partial_.clear();
  }
  EolScanner scan(p, end);
  while (p < end) {
    const char* t = scan.Next(p);
    if (t == end) {
      AppendPartial(p, end, emit);
      return;
    }
    if (*t == '\n') {
      EmitLine(p, t, LineEnd::kNewline, emit);
      p = t + 1;
    } else if (t + 1 == end) {  // bare '\r' last: wait for the next byte
      AppendPartial(p, end, emit);
      cr_pending_ = !partial_.empty() && partial_.back() == '\r';
      return;
    } else if (t[1] == '\n') {
      EmitLine(p, t + 1, LineEnd::kNewline, emit);
      p = t + 2;
    } else {
      EmitLine(p, t, LineEnd::kReturn, emit);
      p = t + 1;
    }
  }
}

template <typename Emit>
void LineSplitter::Finish(Emit&& emit) {
  if (cr_pending_) {
    cr_pending_ = false;
    EmitBounded(std::string_view(partial_).substr(0, partial_.size() - 1), LineEnd::kReturn, emit);
  } else if (!partial_.empty()) {
    EmitBounded(partial_, LineEnd::kEof, emit);
  }
  partial_.clear();
  continuation_ = false;
}

}  // namespace ctrun::logs
