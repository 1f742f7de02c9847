#pragma once
// Checkpoints: named byte sections in one file, checksummed, replaced atomically.
//
//   tide::train::checkpoint_writer w;
//   w.add("params", std::as_bytes(std::span{params}));   // kept by reference until commit()
//   w.add_value("step", step);                            // copied
//   w.add_deferred("state", bytes, 7);                    // asked for at commit: source(7)
//   w.commit("run/ckpt.tide", source);                    // tmp file, fsync, rename, fsync dir
//
//   tide::train::checkpoint_reader r{"run/ckpt.tide"};    // header and table checked here
//   r.read("params", std::as_writable_bytes(std::span{params}));   // size and CRC checked
//   auto step = r.read_value<std::int64_t>("step");
//
// The byte layout and the guarantees are in docs/checkpoints.md. POSIX only (open, pread, fsync,
// rename).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/train/crc32c.hpp"
#include "tide/train/detail/checkpoint_io.hpp"

namespace tide::train {

inline constexpr std::uint32_t checkpoint_version = 1;
inline constexpr std::size_t checkpoint_max_name = 64;  // bytes in a section name

// Collects sections, then writes them to a file in one atomic replace.
//
// add() keeps a reference to the caller's bytes (no copy: a model's parameters can be hundreds of
// MiB), so they must stay alive and unchanged until commit() returns. add_value() copies.
// add_deferred() records a section's name and size only: commit(path, source) asks source(id)
// for its bytes when it writes it, once, in the order the sections were added, and needs them
// only until its next call. So a caller whose sections do not all fit in memory at once (the
// optimizer state an offload engine keeps in its NVMe tier) hands them out one at a time.
class checkpoint_writer {
 public:
  // `section`: 1..64 bytes, unique in this checkpoint.
  void add(std::string_view section, std::span<std::byte const> bytes) {
    check_name(section);
    sections_.push_back(entry{std::string(section), bytes, {}, false});
  }

  // A section of `size` bytes that commit(path, source) takes from source(id).
  void add_deferred(std::string_view section, std::size_t size, std::size_t id) {
    check_name(section);
    entry e{std::string(section), {}, {}, false};
    e.deferred = true;
    e.size = size;
    e.id = id;
    sections_.push_back(std::move(e));
  }

  // A trivially copyable value, stored as its bytes (the host's representation).
  template <class T>
  void add_value(std::string_view section, T const& value) {
    static_assert(std::is_trivially_copyable_v<T>,
                  "add_value stores the bytes of T: T must be trivially copyable");
    check_name(section);
    auto const raw = std::as_bytes(std::span{&value, 1});
    sections_.push_back(entry{std::string(section), {}, std::vector<std::byte>(raw.begin(), raw.end()), true});
  }

  [[nodiscard]] std::size_t section_count() const noexcept { return sections_.size(); }
  [[nodiscard]] std::size_t deferred_count() const noexcept {
    auto const deferred = [](entry const& e) { return e.deferred; };
    return static_cast<std::size_t>(std::count_if(sections_.begin(), sections_.end(), deferred));
  }

  // Bytes the file will take.
  [[nodiscard]] std::uint64_t file_bytes() const noexcept {
    std::uint64_t n = checkpoint_detail::header_bytes + 4;
    for (auto const& s : sections_) n += 2 * checkpoint_detail::entry_bytes(s.name.size()) + s.bytes_size();
    return n;
  }

  // Creates the missing parent folders of `path`, writes `<path>.tmp-<pid>` next to it, fsyncs
  // it, renames it over `path` and fsyncs the directory. On failure the tmp file is removed, `path` is untouched, and tide::error(io) names
  // the path and the system's reason. One commit to a given path at a time per process.
  void commit(std::filesystem::path const& path) const {
    TIDE_REQUIRE(deferred_count() == 0, "checkpoint_writer::commit: the writer has deferred sections "
                 "(add_deferred); pass their source, commit(path, source)");
    commit(path, checkpoint_detail::no_source{});
  }
  // The same, with source(id) -> std::span<std::byte const> giving each deferred section's bytes
  // (exactly its size) when it is written. What source throws fails the commit as any error does.
  template <class Source>
    requires std::is_invocable_r_v<std::span<std::byte const>, Source&, std::size_t>
  void commit(std::filesystem::path const& path, Source&& source) const {
    namespace fs = std::filesystem;
    TIDE_REQUIRE(!path.empty(), "checkpoint_writer::commit: empty path");
    TIDE_REQUIRE(sections_.size() <= 0xFFFFFFFFu, "checkpoint_writer::commit: ", sections_.size(),
                 " sections, the format holds at most 2^32 - 1");
    if (path.has_parent_path()) {  // a new run's folder: made here, as a user saving there expects
      std::error_code ec;
      fs::create_directories(path.parent_path(), ec);
      TIDE_CHECK(!ec, io, "cannot save checkpoint ", path.string(), ": cannot create the folder ",
                 path.parent_path().string(), ": ", ec.message());
    }
    fs::path tmp = path;
    tmp += ".tmp-" + std::to_string(::getpid());

    checkpoint_detail::file_descriptor fd{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    if (!fd.valid()) {
      int const e = errno;
      TIDE_FAIL(io, "cannot save checkpoint ", path.string(), ": cannot create ", tmp.string(), ": ",
                checkpoint_detail::errno_text(e), " (check that the directory exists and is writable)");
    }
    // From here until the rename, any exit removes the tmp file.
    struct remove_tmp {
      fs::path const& tmp;
      checkpoint_detail::file_descriptor& fd;
      bool armed = true;
      ~remove_tmp() {
        if (!armed) return;
        fd.reset();
        ::unlink(tmp.c_str());
      }
    } guard{tmp, fd};

    auto fail = [&](char const* what, int e) {
      TIDE_FAIL(io, "cannot save checkpoint ", path.string(), ": ", what, " ", tmp.string(), " failed: ",
                checkpoint_detail::errno_text(e), " (errno ", e, "); the previous file at ", path.string(),
                " is untouched");
    };

    // The records first, behind the room the table takes (its size depends on the names and sizes
    // alone): each section's bytes are asked for once, and its CRC is known before its record is
    // written. Then the header and the table, which holds every CRC, at the start.
    std::uint64_t at = checkpoint_detail::header_bytes + 4;
    for (auto const& e : sections_) at += checkpoint_detail::entry_bytes(e.name.size());
    std::vector<std::uint32_t> crcs(sections_.size());
    std::vector<std::byte> record;
    auto write_record = [&](std::size_t i, std::span<std::byte const> bytes) {
      entry const& e = sections_[i];
      TIDE_REQUIRE(bytes.size() == e.bytes_size(), "checkpoint_writer::commit: the source gave ", bytes.size(),
                   " bytes for section \"", e.name, "\", added with ", e.bytes_size(), "; the previous file at ",
                   path.string(), " is untouched");
      crcs[i] = crc32c(bytes);
      record.clear();
      checkpoint_detail::put_entry(record, e.name, bytes.size(), crcs[i]);
      if (int err = checkpoint_detail::pwrite_all(fd.get(), record, at)) fail("write of", err);
      at += record.size();
      if (int err = checkpoint_detail::pwrite_all(fd.get(), bytes, at)) fail("write of", err);
      at += bytes.size();
    };
    for (std::size_t i = 0; i < sections_.size(); ++i) {
      if (!sections_[i].deferred) {
        write_record(i, sections_[i].bytes());
        continue;
      }
      auto&& given = source(sections_[i].id);  // an owning result lives until its record is written
      write_record(i, std::span<std::byte const>(given));
    }
    std::vector<std::byte> table;
    table.reserve(checkpoint_detail::header_bytes + 4 + sections_.size() * checkpoint_detail::entry_bytes(64));
    for (char ch : checkpoint_detail::magic) table.push_back(static_cast<std::byte>(ch));
    checkpoint_detail::put_le(table, checkpoint_version, 4);
    checkpoint_detail::put_le(table, sections_.size(), 4);
    checkpoint_detail::put_le(table, 0, 8);  // table bytes, patched below
    for (std::size_t i = 0; i < sections_.size(); ++i)
      checkpoint_detail::put_entry(table, sections_[i].name, sections_[i].bytes_size(), crcs[i]);
    std::uint64_t const table_bytes = table.size() - checkpoint_detail::header_bytes;
    for (int b = 0; b < 8; ++b)
      table[16 + static_cast<std::size_t>(b)] = static_cast<std::byte>((table_bytes >> (8 * b)) & 0xFFu);
    checkpoint_detail::put_le(table, crc32c(table), 4);
    if (int err = checkpoint_detail::pwrite_all(fd.get(), table, 0)) fail("write of", err);
    // The data must be on disk before the rename makes it the checkpoint.
    if (::fsync(fd.get()) != 0) fail("fsync of", errno);
    if (fd.close() != 0) fail("close of", errno);
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename over the checkpoint of", errno);
    guard.armed = false;

    // The rename itself is durable only once the directory is.
    fs::path const dir = checkpoint_detail::directory_of(path);
    checkpoint_detail::file_descriptor dfd{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
    int e = dfd.valid() ? 0 : errno;
    if (e == 0 && ::fsync(dfd.get()) != 0) e = errno;
    // EINVAL: the file system cannot sync directories (some network mounts); nothing more to do.
    if (e != 0 && e != EINVAL)
      TIDE_FAIL(io, "checkpoint ", path.string(), " was replaced, but fsync of its directory ", dir.string(),
                " failed: ", checkpoint_detail::errno_text(e), "; a crash now may bring back the previous file");
  }

 private:
  struct entry {
    std::string name;
    std::span<std::byte const> borrowed;
    std::vector<std::byte> owned;
    bool owns = false;
    bool deferred = false;  // add_deferred: `size` bytes from the commit's source(id)
    std::size_t size = 0, id = 0;
    [[nodiscard]] std::span<std::byte const> bytes() const noexcept {
      return owns ? std::span<std::byte const>(owned) : borrowed;
    }
    [[nodiscard]] std::size_t bytes_size() const noexcept { return deferred ? size : bytes().size(); }
  };

  void check_name(std::string_view section) const {
    TIDE_REQUIRE(!section.empty() && section.size() <= checkpoint_max_name, "checkpoint section name \"",
                 section, "\" has ", section.size(), " bytes; names have 1 to ", checkpoint_max_name);
    bool const taken =
        std::any_of(sections_.begin(), sections_.end(), [&](entry const& s) { return s.name == section; });
    TIDE_REQUIRE(!taken, "checkpoint section \"", section, "\" was already added; section names are unique");
  }

  std::vector<entry> sections_;
};

// Opens a checkpoint and checks its header, its section table and that every section is whole;
// read() then streams one section into the caller's buffer and checks its CRC.
//
// read() writes into `out` as it goes: if the CRC then fails, `out` holds the damaged bytes. A
// caller that must keep its buffers unless the whole file is good calls verify() first (one more
// streaming pass through a small buffer). Reads use pread, so concurrent read() calls are safe.
class checkpoint_reader {
 public:
  explicit checkpoint_reader(std::filesystem::path const& path) : path_(path) {
    fd_ = checkpoint_detail::file_descriptor{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (!fd_.valid()) {
      int const e = errno;
      TIDE_FAIL(io, "cannot open checkpoint ", path_.string(), ": ", checkpoint_detail::errno_text(e));
    }
    struct stat st{};
    if (::fstat(fd_.get(), &st) != 0) {
      int const e = errno;
      TIDE_FAIL(io, "cannot stat checkpoint ", path_.string(), ": ", checkpoint_detail::errno_text(e));
    }
    TIDE_CHECK(S_ISREG(st.st_mode), io, "checkpoint ", path_.string(), " is not a regular file");
    auto const file_size = static_cast<std::uint64_t>(st.st_size);

    // Header.
    std::array<std::byte, checkpoint_detail::header_bytes> header{};
    std::uint64_t const got = read_at(header, 0, "the header");
    auto const& magic = checkpoint_detail::magic;
    bool magic_ok = true;  // on the bytes there are: a short file of other bytes is not a checkpoint
    for (std::size_t i = 0; i < std::min<std::uint64_t>(got, magic.size()); ++i)
      magic_ok = magic_ok && header[i] == static_cast<std::byte>(magic[i]);
    TIDE_CHECK(magic_ok, corrupt, path_.string(), ": not a tide checkpoint (the header does not start with \"",
               std::string_view(magic.data(), magic.size()), "\")");
    TIDE_CHECK(got == header.size(), corrupt, path_.string(), ": truncated in the header (the file has ", got,
               " bytes, the header needs ", header.size(), ")");
    auto const version = static_cast<std::uint32_t>(checkpoint_detail::get_le(header.data() + 8, 4));
    TIDE_CHECK(version == checkpoint_version, usage, path_.string(), ": header says checkpoint format version ",
               version, ", this tide reads ", checkpoint_version,
               " (load it with the tide that wrote it, or the header is damaged)");
    auto const count = static_cast<std::uint32_t>(checkpoint_detail::get_le(header.data() + 12, 4));
    std::uint64_t const table_bytes = checkpoint_detail::get_le(header.data() + 16, 8);

    // Section table and its CRC, which covers the header too.
    std::uint64_t const fixed = checkpoint_detail::header_bytes + 4;  // header + table CRC
    TIDE_CHECK(file_size >= fixed && table_bytes <= file_size - fixed, corrupt, path_.string(),
               ": truncated in the section table (the header announces ", table_bytes,
               " table bytes + 4 CRC bytes at byte ", checkpoint_detail::header_bytes, ", the file has ", file_size,
               " bytes)");
    std::vector<std::byte> table(checkpoint_detail::header_bytes + table_bytes + 4);
    std::copy(header.begin(), header.end(), table.begin());
    std::span<std::byte> const rest = std::span{table}.subspan(header.size());
    TIDE_CHECK(read_at(rest, header.size(), "the section table") == rest.size(), corrupt, path_.string(),
               ": truncated in the section table (the file shrank while being read)");
    auto const body = std::span<std::byte const>(table).first(table.size() - 4);
    auto const stored = static_cast<std::uint32_t>(checkpoint_detail::get_le(table.data() + body.size(), 4));
    auto const computed = crc32c(body);
    TIDE_CHECK(stored == computed, corrupt, path_.string(), ": section table: checksum mismatch (stored ",
               hex(stored), ", computed ", hex(computed), "); the header or the section table is damaged");

    // Entries: trusted now (the CRC passed), parsed with bounds checks all the same.
    std::size_t at = checkpoint_detail::header_bytes;
    std::uint64_t offset = table.size();  // where the first record starts
    sections_.reserve(std::min<std::size_t>(count, table_bytes / checkpoint_detail::entry_bytes(1)));
    for (std::uint32_t i = 0; i < count; ++i) {
      std::size_t const left = body.size() - at;
      std::size_t const name_bytes = left > 0 ? std::to_integer<std::size_t>(body[at]) : 0;
      TIDE_CHECK(left > 0 && name_bytes >= 1 && name_bytes <= checkpoint_max_name &&
                     left >= checkpoint_detail::entry_bytes(name_bytes),
                 corrupt, path_.string(), ": section table: entry ", i, " of ", count, " is malformed");
      section_entry s;
      s.name.assign(reinterpret_cast<char const*>(body.data() + at + 1), name_bytes);
      s.entry_bytes = checkpoint_detail::entry_bytes(name_bytes);
      s.size = checkpoint_detail::get_le(body.data() + at + 1 + name_bytes, 8);
      s.crc = static_cast<std::uint32_t>(checkpoint_detail::get_le(body.data() + at + 1 + name_bytes + 8, 4));
      TIDE_CHECK(!contains(s.name), corrupt, path_.string(), ": section table: section \"", s.name,
                 "\" appears twice");
      s.record = offset;
      s.payload = offset + s.entry_bytes;
      TIDE_CHECK(s.size <= file_size && s.payload <= file_size - s.size, corrupt, path_.string(),
                 ": truncated in section \"", s.name, "\" (its record starts at byte ", s.record, " and takes ",
                 s.entry_bytes, " + ", s.size, " bytes, the file has ", file_size, " bytes)");
      // The record header before the payload repeats the table entry.
      std::array<std::byte, checkpoint_detail::entry_bytes(checkpoint_max_name)> copy{};
      auto const mine = std::span{copy}.first(s.entry_bytes);
      TIDE_CHECK(read_at(mine, s.record, s.name) == mine.size(), corrupt, path_.string(),
                 ": truncated in section \"", s.name, "\" (the file shrank while being read)");
      TIDE_CHECK(std::equal(mine.begin(), mine.end(), body.begin() + static_cast<std::ptrdiff_t>(at)), corrupt,
                 path_.string(), ": section \"", s.name, "\": record header at byte ", s.record,
                 " does not match the section table");
      offset = s.payload + s.size;
      at += s.entry_bytes;
      sections_.push_back(std::move(s));
    }
    TIDE_CHECK(at == body.size(), corrupt, path_.string(), ": section table: ", body.size() - at,
               " bytes after the last of its ", count, " entries");
    std::string const last =
        sections_.empty() ? std::string("the section table") : "section \"" + sections_.back().name + "\"";
    TIDE_CHECK(offset == file_size, corrupt, path_.string(), ": ", file_size - offset, " unexpected bytes after ",
               last, " (the file should end at byte ", offset, ")");
  }

  [[nodiscard]] std::filesystem::path const& path() const noexcept { return path_; }

  [[nodiscard]] bool contains(std::string_view section) const noexcept { return find(section) != nullptr; }

  // Section names in file order.
  [[nodiscard]] std::vector<std::string> sections() const {
    std::vector<std::string> names;
    names.reserve(sections_.size());
    for (auto const& s : sections_) names.push_back(s.name);
    return names;
  }

  [[nodiscard]] std::size_t size_of(std::string_view section) const {
    return static_cast<std::size_t>(at(section).size);
  }

  // Streams the section into `out`, which must have exactly its size, and checks its CRC.
  void read(std::string_view section, std::span<std::byte> out) const {
    auto const& s = at(section);
    TIDE_CHECK(s.size == out.size(), usage, path_.string(), ": section \"", s.name, "\" holds ", s.size,
               " bytes, the model needs ", out.size(), " (shape mismatch: the checkpoint was saved from a "
               "model of another shape or configuration; load it into the configuration that saved it)");
    constexpr std::size_t piece = 1_MiB;  // CRC each piece while it is still in cache
    std::uint32_t crc = 0;
    for (std::size_t done = 0; done < out.size(); done += piece) {
      auto const part = out.subspan(done, std::min(piece, out.size() - done));
      TIDE_CHECK(read_at(part, s.payload + done, s.name) == part.size(), corrupt, path_.string(),
                 ": truncated in section \"", s.name, "\" (the file shrank after it was opened)");
      crc = crc32c(part, crc);
    }
    check_crc(s, crc);
  }

  // A trivially copyable value stored with add_value.
  template <class T>
  [[nodiscard]] T read_value(std::string_view section) const {
    static_assert(std::is_trivially_copyable_v<T>,
                  "read_value reads the bytes of T: T must be trivially copyable");
    std::array<std::byte, sizeof(T)> raw{};
    read(section, raw);
    return std::bit_cast<T>(raw);
  }

  // Checks every section's CRC without touching any caller buffer.
  void verify() const {
    std::vector<std::byte> buffer(std::min<std::uint64_t>(largest(), 1_MiB));
    for (auto const& s : sections_) {
      std::uint32_t crc = 0;
      for (std::uint64_t done = 0; done < s.size; done += buffer.size()) {
        auto const n = std::min<std::uint64_t>(buffer.size(), s.size - done);
        auto const part = std::span{buffer}.first(static_cast<std::size_t>(n));
        TIDE_CHECK(read_at(part, s.payload + done, s.name) == part.size(), corrupt, path_.string(),
                   ": truncated in section \"", s.name, "\" (the file shrank after it was opened)");
        crc = crc32c(part, crc);
      }
      check_crc(s, crc);
    }
  }

 private:
  struct section_entry {
    std::string name;
    std::uint64_t size = 0;
    std::uint32_t crc = 0;
    std::size_t entry_bytes = 0;
    std::uint64_t record = 0;   // file offset of the record header
    std::uint64_t payload = 0;  // file offset of the payload
  };

  static std::string hex(std::uint32_t v) {
    constexpr char digits[] = "0123456789abcdef";
    std::string s = "0x00000000";
    for (int i = 0; i < 8; ++i) s[9 - static_cast<std::size_t>(i)] = digits[(v >> (4 * i)) & 0xFu];
    return s;
  }

  [[nodiscard]] section_entry const* find(std::string_view name) const noexcept {
    for (auto const& s : sections_)
      if (s.name == name) return &s;
    return nullptr;
  }

  [[nodiscard]] section_entry const& at(std::string_view name) const {
    if (auto const* s = find(name)) return *s;
    std::string present;
    for (auto const& s : sections_) present += (present.empty() ? "\"" : ", \"") + s.name + "\"";
    TIDE_FAIL(usage, path_.string(), ": no section \"", name, "\"; the checkpoint holds ",
              present.empty() ? std::string("no sections") : present,
              " (was it saved by another version of the model or trainer?)");
  }

  [[nodiscard]] std::uint64_t largest() const noexcept {
    std::uint64_t n = 0;
    for (auto const& s : sections_) n = std::max(n, s.size);
    return n;
  }

  void check_crc(section_entry const& s, std::uint32_t computed) const {
    TIDE_CHECK(computed == s.crc, corrupt, path_.string(), ": section \"", s.name,
               "\": checksum mismatch (stored ", hex(s.crc), ", computed ", hex(computed),
               "); the file is damaged, load an earlier checkpoint");
  }

  // Bytes read (fewer at end of file); io error on a failed read.
  // `what`: "the header", "the section table" or a section's name.
  std::uint64_t read_at(std::span<std::byte> out, std::uint64_t offset, std::string_view what) const {
    std::int64_t const n = checkpoint_detail::pread_all(fd_.get(), out, offset);
    if (n < 0) {
      int const e = static_cast<int>(-n);
      bool const named = what.starts_with("the ");
      TIDE_FAIL(io, "cannot read ", named ? "" : "section \"", what, named ? "" : "\"", " of checkpoint ",
                path_.string(), " at byte ", offset, ": ", checkpoint_detail::errno_text(e));
    }
    return static_cast<std::uint64_t>(n);
  }

  std::filesystem::path path_;
  checkpoint_detail::file_descriptor fd_;
  std::vector<section_entry> sections_;
};

}  // namespace tide::train
