// A minimal TAP printer shared by the unit test programs.
#pragma once

#include <cstdio>
#include <string>

namespace tap {

inline int test_number = 0;
inline int failures = 0;

inline void Ok(bool passed, const std::string& name) {
  ++test_number;
  if (!passed) ++failures;
  std::printf("%s %d - %s\n", passed ? "ok" : "not ok", test_number, name.c_str());
}

inline void Is(const std::string& got, const std::string& expected, const std::string& name) {
  Ok(got == expected, name);
  if (got != expected)
    std::printf("#   got:      %s\n#   expected: %s\n", got.c_str(), expected.c_str());
}

// Prints the plan; the program's exit status.
inline int Done() {
  std::printf("1..%d\n", test_number);
  return failures == 0 ? 0 : 1;
}

}  // namespace tap
