// The tests' precompiled header: the outside headers tide includes (the header check's list)
// and doctest. Nothing of tide's: a tide header here would hide a test's missing include.
// Adding a header here never changes what a test means, only how fast it compiles.
#pragma once

#include "../headers/outside.hpp"

#include <doctest/doctest.h>
