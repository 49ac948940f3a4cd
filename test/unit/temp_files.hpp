// Temporary files for the unit tests of secret files: written with a mode,
// remembered, and removed by RemoveAll() at the end of the program.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace temp_files {

inline std::vector<std::string> created;

// A new file under /tmp holding `content`, with `mode`.
inline std::string Write(const std::string& content, mode_t mode) {
  char path[] = "/tmp/billguard-unit-XXXXXX";
  const int fd = mkstemp(path);
  std::FILE* f = fdopen(fd, "w");
  std::fputs(content.c_str(), f);
  std::fclose(f);
  chmod(path, mode);
  created.push_back(path);
  return path;
}

inline void RemoveAll() {
  for (const std::string& path : created) unlink(path.c_str());
}

}  // namespace temp_files
