# examples/01_train_gpt.cuda: the demo's CUDA build (PROGRAM) on this machine.
#   with a CUDA device (or TIDE_REQUIRE_GPU=1): a tiny GPT trained 40 steps under DIR; the loss
#     must fall by 1.0, as in the host's smoke run
#   without one: exit 2 and one line on stderr saying so, nothing on stdout, no run folder
cmake_minimum_required(VERSION 3.25)
file(GLOB devices /dev/nvidia[0-9]*)
file(REMOVE_RECURSE "${DIR}")
if(devices OR "$ENV{TIDE_REQUIRE_GPU}" STREQUAL "1")
  execute_process(COMMAND "${PROGRAM}" --model tiny --seq 32 --batch 4 --warmup 5 --lr 3e-3 --steps 40
                          --eval-every 20 --sample 32 --check-falls 1.0 --checkpoint-dir "${DIR}"
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the demo's CUDA build exited ${rc} on this GPU")
  endif()
  return()
endif()
execute_process(COMMAND "${PROGRAM}" --model tiny --checkpoint-dir "${DIR}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX MATCHALL "\n" newlines "${err}")
list(LENGTH newlines lines)
if(NOT rc EQUAL 2 OR NOT out STREQUAL "" OR NOT lines EQUAL 1
   OR NOT err MATCHES "^example_01_train_gpt_cuda: --backend cuda: no CUDA device here")
  message(FATAL_ERROR "without a CUDA device the demo's CUDA build must exit 2 with one line on stderr; "
    "it exited ${rc}, stdout:\n${out}\nstderr:\n${err}")
endif()
if(EXISTS "${DIR}")
  message(FATAL_ERROR "without a CUDA device the demo's CUDA build created ${DIR}")
endif()
message(STATUS "no CUDA device: exit 2, one line: ${err}")
