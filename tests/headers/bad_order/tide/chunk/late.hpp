#pragma once
// A fixture for headers/include_policy_catches: chunk/ comes before nn/, so this include breaks
// the module order and the check must say so. Never compiled.
#include <tide/core/error.hpp>
#include <tide/nn/gpt.hpp>
