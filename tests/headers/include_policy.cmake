# What tide's public headers may include, checked on their text:
#   - no range-v3: tide::tide does not depend on it (a consumer need not install it); tide's
#     ranges are contiguous ranges that std::ranges and range-v3 adaptors take as they are.
#
#   cmake -DINCLUDE_DIR=<tide's include/> -P include_policy.cmake

if(NOT INCLUDE_DIR)
  message(FATAL_ERROR "pass -DINCLUDE_DIR=<path to tide's include/>")
endif()
file(GLOB_RECURSE headers "${INCLUDE_DIR}/tide/*.hpp" "${INCLUDE_DIR}/tide/*.cuh")
list(LENGTH headers count)
if(count EQUAL 0)
  message(FATAL_ERROR "no headers under ${INCLUDE_DIR}/tide")
endif()
set(problems "")
foreach(header IN LISTS headers)
  file(STRINGS "${header}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]range/v3/")
  foreach(line IN LISTS lines)
    file(RELATIVE_PATH shown "${INCLUDE_DIR}" "${header}")
    list(APPEND problems "${shown}: ${line}")
  endforeach()
endforeach()
if(problems)
  string(REPLACE ";" "\n  " problems "${problems}")
  message(FATAL_ERROR "tide's headers must not include range-v3 (tide::tide does not depend on it):\n  ${problems}")
endif()
message(STATUS "${count} headers, none includes range-v3")
