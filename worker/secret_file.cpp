// Secret files (see secret_file.hpp).
#include "secret_file.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace billguard::proxy {

std::string ReadSecretFile(const std::string& flag, const std::string& path) {
  const std::string named = flag + " " + path;
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    throw StartupError("cannot read " + named + ": " + std::strerror(errno));
  }
  if (!S_ISREG(info.st_mode)) throw StartupError(named + " is not a regular file");
  if ((info.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(info.st_mode & 07777));
    throw StartupError(named + " is open to group or others (mode " + mode +
                       "); it must be readable by its owner only: chmod 600");
  }
  std::ifstream file(path);
  if (!file) throw StartupError("cannot read " + named + ": " + std::strerror(errno));
  std::stringstream content;
  content << file.rdbuf();
  std::string secret = content.str();
  const auto first = secret.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) throw StartupError(named + " is empty");
  const auto last = secret.find_last_not_of(" \t\r\n");
  return secret.substr(first, last - first + 1);
}

std::string ReadTokenFile(const std::string& flag, const std::string& path) {
  std::string token = ReadSecretFile(flag, path);
  if (token.size() < 24) throw StartupError(flag + " " + path + " holds fewer than 24 characters");
  return token;
}

}  // namespace billguard::proxy
