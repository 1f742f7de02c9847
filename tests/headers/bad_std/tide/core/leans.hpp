// A fixture for headers/std_includes_catches: it uses std::vector without #include <vector>
// (it may still compile, through <string>), so the check must name it.
#pragma once

#include <string>

inline std::vector<std::string> leans() { return {}; }
