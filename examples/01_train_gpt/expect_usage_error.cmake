# Runs the demo with bad input and checks that it failed as a command-line tool should: exit
# status 2, exactly one line of output (stdout and stderr together), naming the problem, with no
# source path in it.
#
#   cmake -DPROGRAM=<example_01_train_gpt> -DEXPECT=<regex> [-DFRESH_DIR=<dir>] [-DNAME=<name>]
#         -P expect_usage_error.cmake -- ARGS...
#
# NAME: the program's name, which the line must start with (default example_01_train_gpt; the
# data-parallel demo's tests run mpiexec as PROGRAM and pass NAME=example_04_data_parallel).
#
# FRESH_DIR: a folder emptied (created empty) before the run.

if(NOT PROGRAM OR NOT DEFINED EXPECT)
  message(FATAL_ERROR "pass -DPROGRAM=<demo binary> -DEXPECT=<regex>")
endif()
set(args "")
set(after_dashes FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(after_dashes)
    list(APPEND args "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(after_dashes TRUE)
  endif()
endforeach()
if(FRESH_DIR)
  file(REMOVE_RECURSE "${FRESH_DIR}")
  file(MAKE_DIRECTORY "${FRESH_DIR}")
endif()

execute_process(COMMAND "${PROGRAM}" ${args} RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output
                TIMEOUT 60)
string(REGEX REPLACE "\n$" "" text "${output}")
string(REGEX MATCHALL "\n" newlines "${text}")
list(LENGTH newlines extra_lines)

set(problems "")
if(NOT status STREQUAL "2")
  list(APPEND problems "exit status '${status}', want 2")
endif()
if(text STREQUAL "")
  list(APPEND problems "no output")
elseif(NOT extra_lines EQUAL 0)
  math(EXPR lines "${extra_lines} + 1")
  list(APPEND problems "${lines} lines of output, want 1")
endif()
if(text MATCHES "/main\\.cpp")
  list(APPEND problems "a source path in the message")
endif()
if(NOT NAME)
  set(NAME example_01_train_gpt)
endif()
if(NOT text MATCHES "^${NAME}: ")
  list(APPEND problems "the line does not start with '${NAME}: '")
endif()
if(NOT text MATCHES "${EXPECT}")
  list(APPEND problems "the message does not match '${EXPECT}'")
endif()

string(REPLACE ";" " " shown "${args}")
if(problems)
  string(REPLACE ";" "; " problems "${problems}")
  message(FATAL_ERROR "${NAME} ${shown}: ${problems}\n--- output ---\n${output}--------------")
endif()
message(STATUS "${NAME} ${shown}: exit 2, one line: ${text}")
