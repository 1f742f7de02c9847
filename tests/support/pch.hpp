// The tests' precompiled header: the header check's (the standard library and the x86
// intrinsics) and doctest. Nothing of tide's: a tide header here would hide a test's missing
// tide include and come before any macro a test defines. A test that forgets a standard include
// still compiles here; tests are not a library's interface, so that is the price of the time.
#pragma once

#include "../headers/outside.hpp"

#include <doctest/doctest.h>
