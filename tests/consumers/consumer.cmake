# Included by each consumer project once tide is available: builds consumer.cpp against
# tide::tide with strict warnings as errors, and checks what tide must not leak into a consumer.
set(CMAKE_CXX_EXTENSIONS OFF)
add_executable(consumer ${CMAKE_CURRENT_LIST_DIR}/consumer.cpp)
target_link_libraries(consumer PRIVATE tide::tide)
# Stricter than tide's own flags: tide's headers must arrive as SYSTEM to survive them.
target_compile_options(consumer PRIVATE -Wall -Wextra -Wpedantic -Wconversion -Wsign-conversion -Wshadow
  -Wold-style-cast -Wcast-qual -Wundef -Werror)

# tide's developer targets exist only when tide is the top-level project.
foreach(target tide_test_main tide_header_tests test_core_dtype test_kernels_cast bench_roofline)
  if(TARGET ${target})
    message(FATAL_ERROR "tide created its developer target '${target}' in a consumer's build")
  endif()
endforeach()
if(TIDE_SUBPROJECT)
  foreach(option TIDE_BUILD_TESTS TIDE_BUILD_EXAMPLES TIDE_BUILD_BENCH TIDE_INSTALL)
    if(${option})
      message(FATAL_ERROR "${option} is ${${option}} in a consumer's build; it must default to OFF there")
    endif()
  endforeach()
endif()

# The optional targets the parent build of tide created must exist here too.
foreach(target IN LISTS TIDE_EXPECTED_TARGETS)
  if(NOT TARGET ${target})
    message(FATAL_ERROR "${target} exists in tide's own build but not in this consumer's")
  endif()
endforeach()
message(STATUS "consumer: tide ${tide_VERSION}, targets checked: tide::tide ${TIDE_EXPECTED_TARGETS}")
