#pragma once
// access_trace: one training step as the device sees it, a sequence of moments. Per moment: the
// chunk ids touched on the device, those of them the moment writes (their device copy is then the
// newest: leaving the device costs a copy back), the ids that must be on the host (e.g. for a host
// optimizer step), and the ids released after it (payload dropped; the next touch allocates it
// zeroed, no copy). The step repeats, so the trace is cyclic: after the last moment comes moment 0.
//
//   tide::chunk::access_trace tr(6);                         // chunk ids 0..5
//   std::uint32_t const fwd[] = {0, 1}, bwd[] = {1, 4}, grad[] = {4};
//   tr.add_moment(fwd);                                      // moment 0
//   tr.add_moment(bwd, {}, grad, grad);                      // moment 1: touches 1 and 4, writes 4, drops 4
//   tr.next_use_distance(0, 1);   // 1: moment 0 of the next step, cyclically
//   tr.next_use_distance(3, 0);   // access_trace::never
//   tr.to_text();                 // "chunks: 6\n0 1\n1 4 w: 4 r: 4\n"
//   auto same = tide::chunk::access_trace::parse(text);  // '#' comments, errors name the line
//
// Text form, one line per moment: touched ids, then "w:" and the written ids, "h:" and the on-host
// ids, "r:" and the released ids ("3 4 7 w: 4 h: 5 r: 5"); "-" is a moment with no ids at all. An optional first line
// "chunks: N" fixes chunks() (else the largest id + 1). Blank and comment-only lines are skipped.
// parse() reads untrusted files: anything malformed is tide::error(corrupt) naming the line and
// the token: a token that is not a decimal integer (signs, trailing characters, overflow), an id
// of 2^32 or more, an id >= N, and a chunk count above max_parsed_chunks(text.size()) =
// max(2^20, bytes of the text) (a trace allocates a table entry per chunk: a corrupt count must
// not become a 2^32-entry allocation), a written id the moment does not touch.
//
// next_use_distance is O(log uses): every chunk keeps the sorted moments that touch it, so the
// next use is a binary search, wrapping to the chunk's first use (Belady's question, asked at
// every eviction).

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "tide/core/error.hpp"

namespace tide::chunk {

class access_trace {
 public:
  static constexpr std::size_t never = std::numeric_limits<std::size_t>::max();

  access_trace() = default;
  explicit access_trace(std::size_t chunks) : chunks_(chunks), uses_(chunks) {
    TIDE_REQUIRE(chunks <= std::size_t{std::numeric_limits<std::uint32_t>::max()} + 1,
                 "access_trace: ", chunks, " chunks, but chunk ids are 32-bit (at most 2^32 chunks)");
  }

  // Appends a moment and returns its index. Ids are kept in the order given (the tracer compares
  // moments with what it sees); a chunk listed twice in `touched` counts once. Any id >= chunks(),
  // or a written id not in `touched`, is a usage error and leaves the trace as it was.
  std::size_t add_moment(std::span<std::uint32_t const> touched, std::span<std::uint32_t const> on_host = {},
                         std::span<std::uint32_t const> released = {}, std::span<std::uint32_t const> written = {}) {
    std::size_t const t = moments();
    check_ids(touched, "touched", t);
    check_ids(on_host, "on-host", t);
    check_ids(released, "released", t);
    check_ids(written, "written", t);
    for (std::uint32_t c : written)
      TIDE_REQUIRE(std::ranges::find(touched, c) != touched.end(), "access_trace::add_moment: written chunk ", c,
                   " at moment ", t, " is not among the moment's touched chunks (a write is a device touch)");
    std::size_t distinct = 0;
    for (std::uint32_t c : touched) {
      auto& u = uses_[c];
      if (!u.empty() && u.back() == t) continue;  // listed twice in this moment
      u.push_back(t);
      ++distinct;
    }
    working_set_ = std::max(working_set_, distinct);
    touched_.append(touched);
    on_host_.append(on_host);
    released_.append(released);
    written_.append(written);
    return t;
  }

  // Drops every moment; chunks() stays.
  void clear() noexcept {
    touched_.clear();
    on_host_.clear();
    released_.clear();
    written_.clear();
    for (auto& u : uses_) u.clear();
    working_set_ = 0;
  }

  [[nodiscard]] std::size_t moments() const noexcept { return touched_.size(); }
  [[nodiscard]] std::size_t chunks() const noexcept { return chunks_; }
  [[nodiscard]] std::span<std::uint32_t const> touched(std::size_t t) const { return touched_.at(t); }
  [[nodiscard]] std::span<std::uint32_t const> on_host(std::size_t t) const { return on_host_.at(t); }
  [[nodiscard]] std::span<std::uint32_t const> released(std::size_t t) const { return released_.at(t); }
  // The touched ids moment t writes (a subset of touched(t)).
  [[nodiscard]] std::span<std::uint32_t const> written(std::size_t t) const { return written_.at(t); }
  // The moments that touch chunk c, ascending.
  [[nodiscard]] std::span<std::size_t const> uses(std::uint32_t c) const {
    TIDE_REQUIRE(c < chunks_, "access_trace::uses: chunk ", c, " but the trace has ", chunks_, " chunks");
    return uses_[c];
  }

  // Moments from t to c's next device touch strictly after t, cyclically: in [1, moments()]
  // (moments() when t is c's only touch); `never` if no moment touches c.
  [[nodiscard]] std::size_t next_use_distance(std::uint32_t c, std::size_t t) const {
    TIDE_REQUIRE(c < chunks_ && t < moments(), "access_trace::next_use_distance(", c, ", ", t, "): the trace has ",
                 chunks_, " chunks and ", moments(), " moments");
    auto const& u = uses_[c];
    if (u.empty()) return never;
    auto const next = std::upper_bound(u.begin(), u.end(), t);
    return next != u.end() ? *next - t : u.front() + moments() - t;
  }

  // The most distinct chunks one moment touches: a device holding fewer cannot run the step.
  [[nodiscard]] std::size_t working_set() const noexcept { return working_set_; }

  friend bool operator==(access_trace const&, access_trace const&) = default;

  [[nodiscard]] std::string to_text() const {
    std::string s = tide::detail::concat("chunks: ", chunks_, '\n');
    for (std::size_t t = 0; t < moments(); ++t) {
      std::size_t const line_start = s.size();
      auto put = [&](std::string_view token) {
        if (s.size() != line_start) s += ' ';
        s += token;
      };
      for (std::uint32_t c : touched(t)) put(std::to_string(c));
      if (!written(t).empty()) put("w:");
      for (std::uint32_t c : written(t)) put(std::to_string(c));
      if (!on_host(t).empty()) put("h:");
      for (std::uint32_t c : on_host(t)) put(std::to_string(c));
      if (!released(t).empty()) put("r:");
      for (std::uint32_t c : released(t)) put(std::to_string(c));
      if (s.size() == line_start) s += '-';
      s += '\n';
    }
    return s;
  }

  // The most chunks parse() accepts from a text of `text_bytes` bytes: 2^20 chunk ids (a table
  // of 24 MiB) whatever the size, more only for a text with a byte per chunk.
  [[nodiscard]] static constexpr std::size_t max_parsed_chunks(std::size_t text_bytes) noexcept {
    return std::max(std::size_t{1} << 20, text_bytes);
  }

  // The text form back (to_text's, or hand-written); tide::error(corrupt) naming the line on any
  // malformed input, see the top of this header.
  static access_trace parse(std::string_view text) {
    using moment_ids = std::array<std::vector<std::uint32_t>, 4>;  // touched, written, on host, released
    std::size_t const text_bytes = text.size(), most_chunks = max_parsed_chunks(text_bytes);
    std::vector<moment_ids> moments;
    std::size_t chunks = 0, max_id_plus_one = 0, max_id_line = 0, line_no = 0;
    bool chunks_given = false;
    while (!text.empty()) {
      ++line_no;
      std::size_t const eol = text.find('\n');
      std::string_view line = text.substr(0, eol);
      text = eol == std::string_view::npos ? std::string_view{} : text.substr(eol + 1);
      line = line.substr(0, line.find('#'));
      std::vector<std::string_view> tokens = split(line);
      if (tokens.empty()) continue;
      if (tokens[0] == "chunks:") {
        TIDE_CHECK(moments.empty() && !chunks_given && tokens.size() == 2, corrupt, "access_trace::parse: line ",
                   line_no, ": 'chunks: N' must come once, alone on its line, before the first moment");
        chunks = number(tokens[1], line_no, "a chunk count");
        TIDE_CHECK(chunks <= most_chunks, corrupt, "access_trace::parse: line ", line_no, ": 'chunks: ", chunks,
                   "' is more chunks than a trace of ", text_bytes, " bytes can describe (at most ", most_chunks,
                   "); the file is corrupt");
        chunks_given = true;
        continue;
      }
      moment_ids m;
      if (tokens.size() == 1 && tokens[0] == "-") {
        moments.push_back(std::move(m));
        continue;
      }
      std::size_t section = 0;  // 0 touched, 1 written, 2 on host, 3 released: only forward, each once
      for (std::string_view tok : tokens) {
        if (tok == "w:" || tok == "h:" || tok == "r:") {
          std::size_t const next = tok == "w:" ? 1 : tok == "h:" ? 2 : 3;
          TIDE_CHECK(next > section, corrupt, "access_trace::parse: line ", line_no, ": '", tok,
                     "' out of order (a moment is: touched ids, then 'w:', 'h:' and 'r:' ids)");
          section = next;
          continue;
        }
        std::size_t const id = number(tok, line_no, "a chunk id");
        TIDE_CHECK(id <= std::numeric_limits<std::uint32_t>::max(), corrupt, "access_trace::parse: line ", line_no,
                   ": chunk id ", id, " does not fit 32 bits");
        TIDE_CHECK(!chunks_given || id < chunks, corrupt, "access_trace::parse: line ", line_no, ": chunk ", id,
                   " but 'chunks: ", chunks, "' allows ids below ", chunks);
        if (id + 1 > max_id_plus_one) {
          max_id_plus_one = id + 1;
          max_id_line = line_no;
        }
        TIDE_CHECK(section != 1 || std::ranges::find(m[0], id) != m[0].end(), corrupt, "access_trace::parse: line ",
                   line_no, ": written chunk ", id, " is not among the moment's touched ids (a write is a touch)");
        m[section].push_back(static_cast<std::uint32_t>(id));
      }
      moments.push_back(std::move(m));
    }
    // Without 'chunks:', the largest id sets the count: bounded the same way.
    TIDE_CHECK(chunks_given || max_id_plus_one <= most_chunks, corrupt, "access_trace::parse: line ", max_id_line,
               ": chunk id ", max_id_plus_one - 1, " makes ", max_id_plus_one, " chunks, more than a trace of ",
               text_bytes, " bytes can describe (at most ", most_chunks, "); the file is corrupt");
    access_trace tr(chunks_given ? chunks : max_id_plus_one);
    for (auto const& m : moments) tr.add_moment(m[0], m[2], m[3], m[1]);
    return tr;
  }

 private:
  // Ids of every moment, back to back: moment t is ids[first[t], first[t+1]).
  struct id_rows {
    std::vector<std::uint32_t> ids;
    std::vector<std::size_t> first{0};
    [[nodiscard]] std::size_t size() const noexcept { return first.size() - 1; }
    [[nodiscard]] std::span<std::uint32_t const> at(std::size_t t) const {
      TIDE_REQUIRE(t < size(), "access_trace: moment ", t, " but the trace has ", size(), " moments");
      return std::span<std::uint32_t const>(ids).subspan(first[t], first[t + 1] - first[t]);
    }
    void append(std::span<std::uint32_t const> row) {
      ids.insert(ids.end(), row.begin(), row.end());
      first.push_back(ids.size());
    }
    void clear() noexcept {
      ids.clear();
      first.resize(1);
    }
    friend bool operator==(id_rows const&, id_rows const&) = default;
  };

  void check_ids(std::span<std::uint32_t const> ids, char const* what, std::size_t t) const {
    for (std::uint32_t c : ids)
      TIDE_REQUIRE(c < chunks_, "access_trace::add_moment: ", what, " chunk ", c, " at moment ", t,
                   ", but the trace has ", chunks_, " chunks (construct it with access_trace(chunks))");
  }

  static std::vector<std::string_view> split(std::string_view line) {
    std::vector<std::string_view> out;
    constexpr std::string_view space = " \t\r";
    for (std::size_t b = line.find_first_not_of(space); b != std::string_view::npos;
         b = line.find_first_not_of(space, b)) {
      std::size_t const e = std::min(line.find_first_of(space, b), line.size());
      out.push_back(line.substr(b, e - b));
      b = e;
    }
    return out;
  }

  // A decimal integer and nothing else: no sign, no trailing characters, no overflow.
  static std::size_t number(std::string_view tok, std::size_t line_no, char const* what) {
    bool const negative = tok.size() >= 2 && tok[0] == '-' && tok[1] >= '0' && tok[1] <= '9';
    TIDE_CHECK(!negative, corrupt, "access_trace::parse: line ", line_no, ": '", tok, "' is negative; ", what,
               " is an integer >= 0");
    std::size_t v = 0;
    auto const [end, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    TIDE_CHECK(ec != std::errc::result_out_of_range, corrupt, "access_trace::parse: line ", line_no, ": '", tok,
               "' does not fit 64 bits (", what, ")");
    TIDE_CHECK(ec == std::errc{} && end == tok.data() + tok.size(), corrupt, "access_trace::parse: line ", line_no,
               ": '", tok, "' is not ", what,
               " (a moment is: touched ids, then 'w:', 'h:' and 'r:' ids; '-' for none)");
    return v;
  }

  std::size_t chunks_ = 0;
  id_rows touched_, on_host_, released_, written_;
  std::vector<std::vector<std::size_t>> uses_;  // by chunk: the moments touching it, ascending
  std::size_t working_set_ = 0;
};

}  // namespace tide::chunk
