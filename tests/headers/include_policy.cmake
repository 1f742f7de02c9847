# What tide's public headers may include, checked on their text:
#   - the module order: a header under include/tide/<module>/ includes tide headers only from
#     its own module and the modules before it in the table "Modules, bottom-up" of
#     docs/architecture.md (the order is read from that table, so the docs and the code cannot
#     drift apart). tide.hpp and cuda.cuh, the umbrella headers, may include anything.
#   - no range-v3: tide::tide does not depend on it (a consumer need not install it); tide's
#     ranges are contiguous ranges that std::ranges and range-v3 adaptors take as they are.
#
#   cmake -DINCLUDE_DIR=<tide's include/> -DARCHITECTURE=<docs/architecture.md> -P include_policy.cmake

if(NOT INCLUDE_DIR OR NOT ARCHITECTURE)
  message(FATAL_ERROR "pass -DINCLUDE_DIR=<path to tide's include/> -DARCHITECTURE=<path to docs/architecture.md>")
endif()

# The order: rows "| 4 | `chunk/` | ..." of the module table.
file(STRINGS "${ARCHITECTURE}" rows REGEX "^\\| *[0-9]+ *\\| *`[a-z_]+/[^`]*` *\\|")
set(modules "")
foreach(row IN LISTS rows)
  string(REGEX REPLACE "^\\| *[0-9]+ *\\| *`([a-z_]+)/[^`]*`.*" "\\1" module "${row}")
  list(APPEND modules "${module}")
endforeach()
list(LENGTH modules module_count)
if(module_count LESS 3)
  message(FATAL_ERROR "${ARCHITECTURE}: found ${module_count} rows of the module table (\"| 1 | `core/` | ...\"); "
                      "the include-order check needs that table")
endif()

file(GLOB_RECURSE headers "${INCLUDE_DIR}/tide/*.hpp" "${INCLUDE_DIR}/tide/*.cuh")
list(LENGTH headers count)
if(count EQUAL 0)
  message(FATAL_ERROR "no headers under ${INCLUDE_DIR}/tide")
endif()
set(problems "")
set(edges 0)
foreach(header IN LISTS headers)
  file(RELATIVE_PATH shown "${INCLUDE_DIR}" "${header}")
  file(STRINGS "${header}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]range/v3/")
  foreach(line IN LISTS lines)
    list(APPEND problems "${shown}: ${line} (range-v3: tide::tide does not depend on it)")
  endforeach()
  if(NOT shown MATCHES "^tide/([a-z_]+)/")
    continue()  # tide.hpp, cuda.cuh: the umbrellas
  endif()
  set(from "${CMAKE_MATCH_1}")
  list(FIND modules "${from}" from_rank)
  if(from_rank EQUAL -1)
    list(APPEND problems "${shown}: module ${from}/ is not in the module table of docs/architecture.md; add a row")
    continue()
  endif()
  file(STRINGS "${header}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]tide/[a-z_]+/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE ".*[<\"]tide/([a-z_]+)/.*" "\\1" to "${line}")
    list(FIND modules "${to}" to_rank)
    math(EXPR edges "${edges} + 1")
    if(to_rank EQUAL -1 OR to_rank GREATER from_rank)
      list(APPEND problems "${shown}: ${line} (${from}/ may include only ${from}/ and the modules before it in "
                           "docs/architecture.md, and ${to}/ comes after it)")
    endif()
  endforeach()
endforeach()
if(problems)
  string(REPLACE ";" "\n  " problems "${problems}")
  message(FATAL_ERROR "tide's headers break the include policy:\n  ${problems}")
endif()
string(REPLACE ";" " < " order "${modules}")
message(STATUS "${count} headers, ${edges} includes between modules, all in the order ${order}; none includes range-v3")
