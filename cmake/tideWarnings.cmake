# Warnings for tide's own targets (tests, benchmarks, examples); never forced on consumers.
option(TIDE_WARNINGS "Compile tide's own targets with warnings" OFF)
option(TIDE_WARNINGS_AS_ERRORS "Turn those warnings into errors" OFF)

function(tide_add_warnings target)
  if(NOT TIDE_WARNINGS)
    return()
  endif()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
  if(TIDE_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()
