#!/usr/bin/env python3
"""Each tide header includes the standard headers of the std names it uses.

    python3 std_includes.py <tide's include/>

The header check (tests/headers) compiles every header on its own with the standard library
precompiled, so it cannot see a missing #include <vector>; this check can, and more strictly
than a compile: a header that gets <vector> through another header still fails here. Names are
read from the text with comments and literals removed. The table holds the std names tide's
headers use (and the x86 intrinsics, which the check also precompiles), not the whole library: a
name missing from it, an unqualified C name (size_t, memcpy) or a feature-test macro without
<version> is not checked.
"""
import pathlib
import re
import sys

# (header, names that need it, other headers that declare those names too). Names are regular
# expressions on the text; where the standard declares a name in several headers, any will do.
NEEDS = [
    ("algorithm", [r"std::(ranges::)?(sort|stable_sort|min|max|minmax|fill|fill_n|copy|copy_n|find|find_if|"
                   r"any_of|all_of|none_of|max_element|min_element|nth_element|partial_sort|clamp|reverse|"
                   r"equal|lower_bound|upper_bound|binary_search|count|count_if|transform|unique|remove_if|"
                   r"for_each)\b"], []),
    ("array", [r"std::array\b"], []),
    ("atomic", [r"std::(atomic|atomic_thread_fence|memory_order\w*)\b"], []),
    ("bit", [r"std::(bit_cast|bit_width|countr_zero|countl_zero|popcount|has_single_bit|bit_ceil|bit_floor|"
             r"endian|rotl|rotr)\b"], []),
    ("charconv", [r"std::(to_chars|from_chars)\b"], []),
    ("chrono", [r"std::chrono\b"], []),
    ("cmath", [r"std::(sqrt|exp|exp2|expm1|log|log2|log10|log1p|pow|fabs|fmax|fmin|abs|tanh|erf|cos|sin|ceil|"
               r"floor|trunc|round|lround|llround|lrint|isfinite|isnan|isinf|nan|fma|nextafter|frexp|ldexp|"
               r"hypot|cbrt|signbit|copysign)\b"], []),
    ("concepts", [r"std::(same_as|convertible_to|integral|floating_point|invocable|derived_from|"
                  r"unsigned_integral|signed_integral|default_initializable|copyable|movable|regular)\b"], []),
    ("condition_variable", [r"std::condition_variable\b"], []),
    ("csignal", [r"std::(signal|raise|sig_atomic_t)\b"], []),
    ("cstddef", [r"std::(size_t|ptrdiff_t|byte|to_integer|nullptr_t|max_align_t)\b"], []),
    ("cstdint", [r"std::u?int(8|16|32|64)_t\b", r"std::u?intptr_t\b"], []),
    ("cstdio", [r"std::(snprintf|printf|fprintf|sprintf|fopen|fclose|fwrite|fread|fflush|FILE|puts|fputs)\b"], []),
    ("cstdlib", [r"std::(getenv|abort|exit|_Exit|quick_exit|atexit|strtol|strtoul|strtoull|strtod|atoi|"
                 r"malloc|free|aligned_alloc)\b"], []),
    ("cstring", [r"std::(memcpy|memset|memcmp|memmove|strlen|strcmp|strncmp|strerror)\b"], []),
    ("deque", [r"std::deque\b"], []),
    ("exception", [r"std::(exception_ptr|current_exception|rethrow_exception|make_exception_ptr|terminate)\b"], []),
    ("exception", [r"std::exception\b"], ["stdexcept", "system_error", "new"]),
    ("filesystem", [r"std::filesystem\b"], []),
    ("fstream", [r"std::(ifstream|ofstream|fstream)\b"], []),
    ("functional", [r"std::(plus|less|greater|equal_to|invoke|ref|cref|hash|identity|reference_wrapper)\b"], []),
    ("initializer_list", [r"std::initializer_list\b"], []),
    ("ios", [r"std::ios(_base)?::"], ["iostream", "istream", "ostream", "sstream", "fstream"]),
    ("iterator", [r"std::(begin|end|size|data|next|prev|distance|advance|back_inserter|iterator_traits|"
                  r"contiguous_iterator|input_iterator)\b"],
     ["vector", "array", "string", "string_view", "span", "deque", "ranges", "initializer_list", "unordered_map"]),
    ("limits", [r"std::numeric_limits\b"], []),
    ("memory", [r"std::(unique_ptr|shared_ptr|make_unique|make_shared|addressof|construct_at|destroy_at)\b"], []),
    ("mutex", [r"std::(mutex|lock_guard|unique_lock|scoped_lock)\b"], []),
    ("new", [r"std::(align_val_t|bad_alloc|launder|nothrow|hardware_destructive_interference_size)\b"], []),
    ("numbers", [r"std::numbers::"], []),
    ("numeric", [r"std::(accumulate|iota|inner_product|partial_sum|exclusive_scan|inclusive_scan|reduce|gcd|lcm|"
                 r"midpoint|transform_reduce)\b"], []),
    ("optional", [r"std::(optional|nullopt)\b"], []),
    ("ostream", [r"std::ostream\b"], ["iostream", "sstream", "fstream"]),
    ("queue", [r"std::(queue|priority_queue)\b"], []),
    ("random", [r"std::(mt19937\w*|uniform_\w+_distribution|normal_distribution|random_device|minstd_rand|"
                r"seed_seq)\b"], []),
    ("ranges", [r"std::views::", r"std::ranges::(begin|end|size|range|input_range|sized_range|forward_range|"
                r"random_access_range|contiguous_range|iota_view|subrange|range_value_t|iterator_t)\b"], []),
    ("ratio", [r"std::(ratio|milli|micro|nano|kilo|mega)\b"], ["chrono"]),
    ("source_location", [r"std::source_location\b"], []),
    ("span", [r"std::(span|dynamic_extent|as_bytes|as_writable_bytes)\b"], []),
    ("sstream", [r"std::(o|i)?stringstream\b"], []),
    ("stdexcept", [r"std::(runtime_error|logic_error|invalid_argument|out_of_range|length_error|"
                   r"overflow_error|range_error)\b"], []),
    ("string", [r"std::(string|to_string)\b"], []),
    ("string_view", [r"std::string_view\b"], []),
    ("system_error", [r"std::(system_error|error_code|errc|generic_category|system_category)\b"], []),
    ("thread", [r"std::(thread|jthread|this_thread)\b"], []),
    ("tuple", [r"std::(tuple|tie|make_tuple|apply)\b"], []),
    ("type_traits", [r"std::(is_\w+|remove_\w+|enable_if\w*|conditional(_t)?|decay(_t)?|integral_constant|"
                     r"true_type|false_type|underlying_type_t|invoke_result_t|add_\w+|void_t|common_type_t|"
                     r"type_identity_t|bool_constant)\b"], []),
    ("unordered_map", [r"std::unordered_map\b"], []),
    ("utility", [r"std::(move|forward|swap|exchange|pair|make_pair|declval|in_place|index_sequence|"
                 r"make_index_sequence|integer_sequence|as_const|unreachable|cmp_less|to_underlying)\b"], []),
    ("variant", [r"std::(variant|visit|holds_alternative|monostate)\b"], []),
    ("vector", [r"std::vector\b"], []),
    # Not the standard library, but precompiled with it by the header check: the x86 intrinsics.
    ("immintrin.h", [r"\b_mm(256|512)?_\w+", r"\b__m(128|256|512)[a-z]*\b"],
     ["x86intrin.h", "xmmintrin.h", "emmintrin.h", "pmmintrin.h", "tmmintrin.h", "smmintrin.h", "nmmintrin.h"]),
]


def code_of(text: str) -> str:
    """The text with comments removed and string and character literals emptied."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            delim = text[i + 2:text.find("(", i + 2)]
            j = text.find(")" + delim + '"', i)
            i = n if j < 0 else j + len(delim) + 2
            out.append('""')
        elif c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum()):  # 1'000 is a digit separator
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1])
    headers = sorted(p for p in root.rglob("tide/**/*") if p.suffix in (".hpp", ".cuh"))
    if not headers:
        print(f"no tide headers under {root}", file=sys.stderr)
        return 2
    missing = []
    for path in headers:
        code = code_of(path.read_text())
        included = set(re.findall(r"#\s*include\s*<([^>]+)>", code))
        for header, names, also in NEEDS:
            if included & {header, *also}:
                continue
            for pattern in names:
                use = re.search(pattern, code)
                if use:
                    missing.append(f"{path.relative_to(root)} uses {use.group(0)}: add #include <{header}>")
                    break
    if missing:
        print("\n".join(missing))
        print(f"{len(missing)} standard includes missing in {len(headers)} headers")
        return 1
    print(f"{len(headers)} headers include the standard headers of the names they use")
    return 0


if __name__ == "__main__":
    sys.exit(main())
