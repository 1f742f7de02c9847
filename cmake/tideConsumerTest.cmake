# One consumer test, run by ctest as
#   cmake -DCONFIG=<build>/tests/consumers/consumer_config.cmake -DKIND=<kind> -P tideConsumerTest.cmake
# KIND is find_package, add_subdirectory, fetch_content or cuda: the project
# tests/consumers/<KIND> is configured fresh with Ninja, built and run, after
#   find_package:  tide configured alone (tests, benchmarks, examples off), built and installed
#                  into a temporary prefix, which the consumer finds through CMAKE_PREFIX_PATH;
#   fetch_content: tide's source tree packed into a .tar.gz the consumer fetches by file:// URL;
#   cuda:          nothing: it finds the prefix the find_package test installed (a ctest fixture)
#                  and compiles a .cu file against tide::cuda with CMake's CUDA language.
# Then the consumer's compile command must see tide's include directory as -isystem, never -I.
#
# CONFIG (written by tests/consumers/CMakeLists.txt) sets: tide_source_dir, tide_consumer_dir,
# tide_consumer_work_dir, tide_cxx_compiler, tide_make_program, tide_expected_targets, tide_nvcc.
cmake_minimum_required(VERSION 3.25)

if(NOT CONFIG OR NOT EXISTS "${CONFIG}")
  message(FATAL_ERROR "pass -DCONFIG=<the consumer_config.cmake written at configure time>")
endif()
include("${CONFIG}")
if(NOT KIND MATCHES "^(find_package|add_subdirectory|fetch_content|cuda)$")
  message(FATAL_ERROR "KIND must be find_package, add_subdirectory, fetch_content or cuda, got '${KIND}'")
endif()

set(work "${tide_consumer_work_dir}/${KIND}")
file(REMOVE_RECURSE "${work}")
file(MAKE_DIRECTORY "${work}")
set(generator -G Ninja "-DCMAKE_MAKE_PROGRAM=${tide_make_program}" "-DCMAKE_CXX_COMPILER=${tide_cxx_compiler}")

function(now_ms out)
  string(TIMESTAMP s "%s" UTC)
  string(TIMESTAMP us "%f" UTC)
  math(EXPR ms "${s} * 1000 + ${us} / 1000")
  set(${out} ${ms} PARENT_SCOPE)
endfunction()

# step(<name> command...): runs the command in ${work}, fails the test with its output.
set(timings "")
function(step name)
  now_ms(start)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY "${work}"
    RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  now_ms(end)
  math(EXPR ms "${end} - ${start}")
  set(timings "${timings}  ${name}: ${ms} ms\n" PARENT_SCOPE)
  set(step_output "${out}" PARENT_SCOPE)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "consumer test '${KIND}', step '${name}' failed (${result}):\n${ARGN}\n${out}")
  endif()
endfunction()

set(consumer_options "")
if(KIND STREQUAL "find_package")
  set(prefix "${work}/prefix")
  step("configure tide" ${CMAKE_COMMAND} -S "${tide_source_dir}" -B "${work}/tide-build" ${generator}
       -DCMAKE_BUILD_TYPE=Release -DTIDE_BUILD_TESTS=OFF -DTIDE_BUILD_BENCH=OFF -DTIDE_BUILD_EXAMPLES=OFF
       -DTIDE_INSTALL=ON "-DCMAKE_INSTALL_PREFIX=${prefix}")
  step("build tide" ${CMAKE_COMMAND} --build "${work}/tide-build")
  step("install tide" ${CMAKE_COMMAND} --install "${work}/tide-build")
  foreach(f include/tide/core/dtype.hpp include/tide/kernels/cast/cast.hpp share/tide/cmake/tideConfig.cmake
            share/tide/cmake/tideConfigVersion.cmake share/tide/cmake/tideTargets.cmake)
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "the install of tide lacks ${f}")
    endif()
  endforeach()
  list(APPEND consumer_options "-DCMAKE_PREFIX_PATH=${prefix}")
elseif(KIND STREQUAL "cuda")
  set(prefix "${tide_consumer_work_dir}/find_package/prefix")
  if(NOT EXISTS "${prefix}/share/tide/cmake/tideConfig.cmake")
    message(FATAL_ERROR "no tide installed in ${prefix}: run the test consumers/find_package first")
  endif()
  list(APPEND consumer_options "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_CUDA_COMPILER=${tide_nvcc}")
elseif(KIND STREQUAL "add_subdirectory")
  list(APPEND consumer_options "-DTIDE_SOURCE_DIR=${tide_source_dir}")
else()
  # What a release tarball holds: the tree without build outputs and version control.
  file(GLOB entries RELATIVE "${tide_source_dir}" "${tide_source_dir}/*")
  list(FILTER entries EXCLUDE REGEX "^(build|\\.git|runs|bench-results)$|^build-.*\\.log$")
  step("pack tide" ${CMAKE_COMMAND} -E chdir "${tide_source_dir}" ${CMAKE_COMMAND} -E tar czf
       "${work}/tide-src.tar.gz" ${entries})
  list(APPEND consumer_options "-DTIDE_ARCHIVE=${work}/tide-src.tar.gz")
endif()

step("configure consumer" ${CMAKE_COMMAND} -S "${tide_consumer_dir}/${KIND}" -B "${work}/build" ${generator}
     -DCMAKE_BUILD_TYPE=Debug -DCMAKE_EXPORT_COMPILE_COMMANDS=ON ${consumer_options}
     "-DTIDE_EXPECTED_TARGETS=${tide_expected_targets}")
if(KIND MATCHES "find_package|cuda" AND NOT step_output MATCHES "consumer: tide 0\\.")
  message(FATAL_ERROR "find_package(tide) did not report a version:\n${step_output}")
endif()
step("build consumer" ${CMAKE_COMMAND} --build "${work}/build")
step("run consumer" "${work}/build/consumer")
set(run_output "${step_output}")
if(KIND STREQUAL "cuda")
  set(expected "skipped: no CUDA device|bf16\\(pi\\) on the device: bits 0x4049")
else()
  set(expected "bf16\\(pi\\) = 3\\.140625")
endif()
if(NOT run_output MATCHES "${expected}")
  message(FATAL_ERROR "the consumer printed something unexpected:\n${run_output}")
endif()

# tide's include directory reaches the consumer's compiler as -isystem, never as -I: that is
# what keeps tide's headers out of the consumer's warnings.
file(READ "${work}/build/compile_commands.json" commands)
string(REGEX MATCHALL "-isystem[= ]+[^ \"]+" system_flags "${commands}")
string(REGEX MATCHALL "-I[^ \"]+" plain_flags "${commands}")
set(tide_system "")
foreach(flag IN LISTS system_flags)
  string(REGEX REPLACE "^-isystem[= ]+" "" dir "${flag}")
  if(EXISTS "${dir}/tide/core/dtype.hpp")
    list(APPEND tide_system "${dir}")
  endif()
endforeach()
foreach(flag IN LISTS plain_flags)
  string(REGEX REPLACE "^-I=?" "" dir "${flag}")
  if(EXISTS "${dir}/tide/core/dtype.hpp")
    message(FATAL_ERROR "tide's headers reach the consumer as -I${dir}, not -isystem")
  endif()
endforeach()
if(NOT tide_system)
  message(FATAL_ERROR "no -isystem directory of the consumer's compile command holds tide's headers:\n${commands}")
endif()
if(KIND MATCHES "find_package|cuda" AND NOT tide_system MATCHES "^${prefix}/include")
  message(FATAL_ERROR "the consumer compiled against ${tide_system}, not the installed ${prefix}/include")
endif()

message(STATUS "consumer (${KIND}) printed: ${run_output}")
message(STATUS "tide's headers came in as -isystem ${tide_system}")
message(STATUS "steps:\n${timings}")
