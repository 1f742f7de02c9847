# Runs lost_rank under mpiexec with 3 ranks and checks that the job ends, and how.
#   cmake -DMPIEXEC=... -DPROGRAM=... -DHOW=stop|kill|pipeline|heartbeat -DDEADLINE_MS=... [-DDIR=...] -P lost_rank.cmake
# stop: the two live ranks print the error naming the all-reduce, rank 2 and the deadline, and
#       the job exits non-zero; kill: mpiexec ends the job, non-zero, and the checkpoint set in DIR
#       still is the one saved after step 2 (3 steps), whole: it loads on one rank; pipeline: the
#       two live stages print a deadline error of comm::mpi and the job exits non-zero (tensor: the
#       same, from inside a tensor-parallel block); heartbeat
#       (DEADLINE_MS is the heartbeat's timeout, the communicator's deadline 10 minutes): the two
#       live ranks name rank 2, its host, pid and step 3, and the job ends within 30 s of the
#       stop, though rank 0 was busy for twice the timeout at step 1. Never a hang:
#       the job gets 120 s, far more than the deadline and the roll call need.
set(args ${HOW} ${DEADLINE_MS})
if(HOW STREQUAL "kill")
  file(REMOVE_RECURSE ${DIR})
  list(APPEND args ${DIR})
endif()
string(TIMESTAMP started "%s")
execute_process(
  COMMAND ${MPIEXEC} -n 3 --oversubscribe --allow-run-as-root --bind-to none ${PROGRAM} ${args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
string(TIMESTAMP ended "%s")
math(EXPR took "${ended} - ${started}")
set(all "${out}\n${err}")
message(STATUS "mpiexec exit: ${rc}\n${all}")
if(rc MATCHES "timeout" OR rc MATCHES "Process terminated")
  message(FATAL_ERROR "the job hung: mpiexec did not end within 120 s")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "the job exited 0 although rank 2 was lost")
endif()
string(REGEX MATCHALL "rank [0-9]: step 2 done" before "${all}")
list(LENGTH before ranks_before)
if(NOT ranks_before EQUAL 3)
  message(FATAL_ERROR "expected all 3 ranks to finish step 2 before the loss, saw ${ranks_before}")
endif()
if(all MATCHES "step 3 done")
  message(FATAL_ERROR "a step completed without rank 2")
endif()
# What each live rank must print: the deadline's roll call, the heartbeat's report, or (a lost
# pipeline stage) any deadline error of comm::mpi.
set(expected_stop "comm::mpi: all_reduce #4 \\(1.00 MiB of f32, sum\\) on rank RANK of 3 did not complete within its deadline of ${DEADLINE_MS} ms; not heard from: rank 2 \\(died, stopped or hangs\\)")
set(expected_heartbeat "rank 2 \\([^,]+, pid [0-9]+\\) stopped answering at step 3: no heartbeat for [0-9.]+ s \\(timeout [0-9.]+ s\\)\\. the last checkpoint is nowhere")
set(expected_pipeline "comm::mpi: [^\n]* did not complete within its deadline of ${DEADLINE_MS} ms")
set(expected_tensor "${expected_pipeline}")
# The heartbeat's ranks notice within a poll of each other, and mpiexec ends the job as soon as
# the first exits: one report is all that is sure to reach the output there.
if(DEFINED expected_${HOW})
  set(reported 0)
  foreach(r 0 1)
    string(REPLACE "RANK" "${r}" want "${expected_${HOW}}")
    if(all MATCHES "lost_rank: rank ${r}: ${want}")
      math(EXPR reported "${reported} + 1")
    endif()
  endforeach()
  if(HOW STREQUAL "heartbeat" AND reported LESS 1 OR NOT HOW STREQUAL "heartbeat" AND reported LESS 2)
    message(FATAL_ERROR "${reported} live ranks reported the lost rank as expected")
  endif()
endif()
if(HOW STREQUAL "heartbeat")
  # Start-up, 2 timeouts busy at step 1, then the stop: the loss must be noticed in seconds.
  math(EXPR most "${DEADLINE_MS} * 2 / 1000 + 30")
  if(took GREATER most)
    message(FATAL_ERROR "the job took ${took} s to end; the heartbeat should end it within ${most} s")
  endif()
endif()
if(HOW STREQUAL "kill")
  execute_process(
    COMMAND ${MPIEXEC} -n 1 --oversubscribe --allow-run-as-root --bind-to none ${PROGRAM} verify ${DIR}
    RESULT_VARIABLE vrc OUTPUT_VARIABLE vout ERROR_VARIABLE verr TIMEOUT 120)
  message(STATUS "verify exit: ${vrc}\n${vout}\n${verr}")
  if(NOT vrc EQUAL 0 OR NOT vout MATCHES "checkpoint set intact: step 3, 3 shards")
    message(FATAL_ERROR "the last checkpoint set (step 3) did not load after the kill")
  endif()
  file(REMOVE_RECURSE ${DIR})
endif()
message(STATUS "lost_rank ${HOW}: the job ended (exit ${rc}) as expected")
