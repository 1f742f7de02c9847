#!/usr/bin/env python3
"""Each tide header includes the standard headers of the std names it uses.

    python3 std_includes.py <tide's include/>

The header check (tests/headers) compiles every header on its own with the standard library
precompiled, so it cannot see a missing #include <vector>; this check can, and more strictly
than a compile: a header that gets <vector> through another header still fails here. Names are
read from the text with comments and string literals removed. The table holds the names tide's
headers use, not the whole library: a name missing from it is not checked.
"""
import pathlib
import re
import sys

# header -> the names that need it (regular expressions on the text)
NEEDS = {
    "algorithm": [r"std::(ranges::)?(sort|stable_sort|min|max|minmax|fill|fill_n|copy|copy_n|find|find_if|"
                  r"any_of|all_of|none_of|max_element|min_element|nth_element|partial_sort|clamp|reverse|"
                  r"equal|lower_bound|upper_bound|count|count_if|transform|unique|remove_if|for_each)\b"],
    "array": [r"std::array\b"],
    "atomic": [r"std::atomic\b", r"std::memory_order"],
    "bit": [r"std::(bit_cast|bit_width|countr_zero|countl_zero|popcount|has_single_bit|bit_ceil|bit_floor|"
            r"endian|rotl|rotr)\b"],
    "charconv": [r"std::(to_chars|from_chars)\b"],
    "chrono": [r"std::chrono::"],
    "cmath": [r"std::(sqrt|exp|exp2|expm1|log|log2|log1p|pow|fabs|abs|tanh|erf|cos|sin|ceil|floor|trunc|round|"
              r"lround|llround|lrint|isfinite|isnan|isinf|fma|nextafter|frexp|ldexp|hypot|cbrt|signbit|copysign)\b"],
    "concepts": [r"std::(same_as|convertible_to|integral|floating_point|invocable|derived_from|"
                 r"unsigned_integral|signed_integral|default_initializable|copyable|movable|regular)\b"],
    "condition_variable": [r"std::condition_variable\b"],
    "cstddef": [r"std::(size_t|ptrdiff_t|byte|nullptr_t|max_align_t)\b"],
    "cstdint": [r"std::u?int(8|16|32|64)_t\b", r"std::u?intptr_t\b"],
    "cstdio": [r"std::(snprintf|printf|fprintf|sprintf|fopen|fclose|fwrite|fread|fflush|FILE|puts|fputs)\b"],
    "cstdlib": [r"std::(getenv|abort|exit|_Exit|quick_exit|atexit|strtol|strtoul|strtoull|strtod|atoi|"
                r"malloc|free|aligned_alloc)\b"],
    "cstring": [r"std::(memcpy|memset|memcmp|memmove|strlen|strcmp|strncmp)\b"],
    "deque": [r"std::deque\b"],
    "exception": [r"std::(exception_ptr|current_exception|rethrow_exception|exception|terminate)\b"],
    "filesystem": [r"std::filesystem::"],
    "fstream": [r"std::(ifstream|ofstream|fstream)\b"],
    "functional": [r"std::(plus|less|greater|equal_to|invoke|ref|cref|hash|identity|reference_wrapper)\b"],
    "initializer_list": [r"std::initializer_list\b"],
    "iterator": [r"std::(begin|end|size|data|next|prev|distance|advance|back_inserter|iterator_traits|"
                 r"contiguous_iterator|input_iterator)\b"],
    "limits": [r"std::numeric_limits\b"],
    "memory": [r"std::(unique_ptr|shared_ptr|make_unique|make_shared|addressof|construct_at|destroy_at)\b"],
    "mutex": [r"std::(mutex|lock_guard|unique_lock|scoped_lock)\b"],
    "new": [r"std::(align_val_t|bad_alloc|launder|nothrow|hardware_destructive_interference_size)\b"],
    "numbers": [r"std::numbers::"],
    "numeric": [r"std::(accumulate|iota|inner_product|partial_sum|exclusive_scan|inclusive_scan|reduce|gcd|lcm|"
                r"midpoint|transform_reduce)\b"],
    "optional": [r"std::(optional|nullopt)\b"],
    "ostream": [r"std::ostream\b"],
    "queue": [r"std::(queue|priority_queue)\b"],
    "random": [r"std::(mt19937\w*|uniform_\w+_distribution|normal_distribution|random_device|minstd_rand|"
               r"seed_seq)\b"],
    "ranges": [r"std::views::", r"std::ranges::(begin|end|size|range|input_range|sized_range|forward_range|"
               r"random_access_range|contiguous_range|iota_view|subrange|range_value_t|iterator_t)\b"],
    "source_location": [r"std::source_location\b"],
    "span": [r"std::(span|dynamic_extent)\b"],
    "sstream": [r"std::(o|i)?stringstream\b"],
    "stdexcept": [r"std::(runtime_error|logic_error|invalid_argument|out_of_range|length_error|overflow_error|"
                  r"range_error)\b"],
    "string": [r"std::(string|to_string)\b"],
    "string_view": [r"std::string_view\b"],
    "system_error": [r"std::(system_error|error_code|generic_category|system_category)\b"],
    "thread": [r"std::(thread|this_thread)\b"],
    "tuple": [r"std::(tuple|tie|make_tuple|apply|tuple_size|tuple_element)\b"],
    "type_traits": [r"std::(is_\w+|remove_\w+|enable_if\w*|conditional(_t)?|decay(_t)?|integral_constant|"
                    r"true_type|false_type|underlying_type_t|invoke_result_t|add_\w+|void_t|common_type_t|"
                    r"type_identity_t|bool_constant)\b"],
    "unordered_map": [r"std::unordered_map\b"],
    "utility": [r"std::(move|forward|swap|exchange|pair|make_pair|declval|in_place|index_sequence|"
                r"make_index_sequence|integer_sequence|as_const|unreachable|cmp_less|to_underlying)\b"],
    "variant": [r"std::(variant|visit|holds_alternative|monostate)\b"],
    "vector": [r"std::vector\b"],
}
# Where the standard declares a name in several headers, any of them will do.
ALSO = {
    "cstddef": ["cstdlib", "cstring", "cstdio", "cstdint"],
    "exception": ["stdexcept", "system_error"],
    "iterator": ["vector", "array", "string", "string_view", "span", "deque", "ranges", "initializer_list",
                 "unordered_map"],
    "ostream": ["iostream", "sstream", "fstream"],
    "tuple": ["array", "utility", "variant"],
    "utility": ["algorithm"],
}


def code_of(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', text)


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
        for header, names in NEEDS.items():
            if included & {header, *ALSO.get(header, [])}:
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
