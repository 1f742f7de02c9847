// tide-schedule: a pipeline schedule simulated, as JSON, an ASCII grid or an SVG timeline.
//
//   tide-schedule --schedule gpipe|one_f_one_b|interleaved|zb_h1|zb_h2|zb_v|dualpipe_v --stages P --micro M
//                 [--virtual V] [--costs F,B,W,C] [--format json|ascii|svg]
//
// Costs are of one stage per micro-batch (F forward, B input gradient, W weight gradient, C a send
// between stages); the default is 1,1,1,0. A bad flag or an impossible schedule prints one line,
// "tide-schedule: <what is wrong>", and exits with status 2.

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

#include <tide/pipeline/report.hpp>

namespace {

namespace pp = tide::pipeline;

template <class T>
T parse(std::string_view flag, std::string_view text) {
  T v{};
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  TIDE_REQUIRE(ec == std::errc{} && end == text.data() + text.size(), flag, " wants a number, got '", text, "'");
  return v;
}

constexpr char const* usage_text =
    "usage: tide-schedule [--schedule S] [--stages P] [--micro M] [--virtual V] [--costs F,B,W,C] [--format F]\n"
    "A pipeline schedule simulated: its timeline as an ASCII grid, JSON or an SVG, and its bubble.\n"
    "  --schedule S   gpipe, one_f_one_b, interleaved, zb_h1, zb_h2, zb_v or dualpipe_v [one_f_one_b]\n"
    "  --stages P     pipeline stages [4]\n"
    "  --micro M      micro-batches per step [8]\n"
    "  --virtual V    model chunks per stage (interleaved) [1]\n"
    "  --costs F,B,W,C  a stage's forward, input gradient, weight gradient and send per micro-batch [1,1,1,0]\n"
    "  --format F     ascii, json or svg [ascii]\n"
    "  --help         this text\n"
    "A bad flag or an impossible schedule prints one line and exits with status 2.\n";

int run(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
      std::fputs(usage_text, stdout);
      return 0;
    }
  std::string_view name = "one_f_one_b", format = "ascii";
  int p = 4, m = 8, v = 1;
  pp::costs c{};
  for (int i = 1; i < argc; i += 2) {
    std::string_view const flag = argv[i];
    TIDE_REQUIRE(i + 1 < argc, flag, " needs a value");
    std::string_view const value = argv[i + 1];
    if (flag == "--schedule") name = value;
    else if (flag == "--stages") p = parse<int>(flag, value);
    else if (flag == "--micro") m = parse<int>(flag, value);
    else if (flag == "--virtual") v = parse<int>(flag, value);
    else if (flag == "--format") format = value;
    else if (flag == "--costs") {
      double x[4] = {1, 1, 1, 0};
      std::size_t at = 0;
      for (int k = 0; k < 4; ++k) {
        std::size_t const comma = value.find(',', at);
        x[k] = parse<double>(flag, value.substr(at, comma == std::string_view::npos ? value.npos : comma - at));
        TIDE_REQUIRE(std::isfinite(x[k]) && x[k] >= 0 && (k == 3 || x[k] > 0),
                     "--costs F,B,W,C wants finite F, B, W > 0 and C >= 0, got '", value, "'");
        TIDE_REQUIRE((comma == std::string_view::npos) == (k == 3), "--costs wants four numbers F,B,W,C, got '",
                     value, "'");
        at = comma + 1;
      }
      c = {x[0], x[1], x[2], x[3]};
    } else {
      TIDE_FAIL(usage, "unknown flag ", flag, " (flags: --schedule --stages --micro --virtual --costs --format)");
    }
  }
  pp::kind k{};
  bool found = false;
  for (pp::kind each : {pp::kind::gpipe, pp::kind::one_f_one_b, pp::kind::interleaved, pp::kind::zb_h1,
                        pp::kind::zb_h2, pp::kind::zb_v, pp::kind::dualpipe_v})
    if (pp::to_string(each) == name) k = each, found = true;
  TIDE_REQUIRE(found, "--schedule ", name, " is not one of gpipe, one_f_one_b, interleaved, zb_h1, zb_h2, zb_v, dualpipe_v");
  TIDE_REQUIRE(format == "json" || format == "ascii" || format == "svg", "--format ", format,
               " is not one of json, ascii, svg");
  auto const s = pp::generate(k, p, m, v);
  auto const r = pp::check(s, c);
  std::string const out = format == "json" ? pp::to_json(s, r, c) : format == "svg" ? pp::to_svg(s, r) : pp::to_ascii(s, r);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (tide::error const& e) {
    std::fprintf(stderr, "tide-schedule: %s\n", e.message().c_str());
    return 2;
  }
}
