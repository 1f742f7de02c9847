// The unit that builds the tests' precompiled header (support/pch.hpp); it has no code.
