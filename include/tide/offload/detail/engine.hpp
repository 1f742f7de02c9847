#pragma once
// The offload engine, whole: the class (detail/engine_core.hpp) and its members defined out of
// line by what they do: the step (engine_step.hpp), the updates (engine_update.hpp), and where
// the bytes come from (engine_tiers.hpp). offload/scheduler.hpp, the public face, owns one.

#include "tide/offload/detail/engine_core.hpp"
#include "tide/offload/detail/engine_step.hpp"
#include "tide/offload/detail/engine_tiers.hpp"
#include "tide/offload/detail/engine_update.hpp"
