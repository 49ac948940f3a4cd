// Reading the API key file (see api_key.hpp).
#include "cpp_only.hpp"

#include "api_key.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace billguard {

namespace {

// A key is at most 255 characters; more than this is not a key file.
constexpr size_t kMaxFileSize = 4096;

bool LooksLikeStripeKey(const std::string& key) {
  if (key.size() < 8 || key.size() > 255) return false;
  const std::string prefix = key.substr(0, 3);
  if (prefix != "rk_" && prefix != "sk_" && prefix != "vk_") return false;
  for (char c : key) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string Octal(unsigned mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", mode & 07777);
  return text;
}

// Why the opened file must not be used, or "" when it may.
std::string OwnershipError(const struct stat& file) {
  if (!S_ISREG(file.st_mode)) return "billguard.api_key_file is not a regular file";
  // Its owner could rewrite or expose the key at will.
  if (file.st_uid != geteuid()) {
    return "billguard.api_key_file is owned by uid " + std::to_string(file.st_uid) +
           ", not by the server's user (uid " + std::to_string(geteuid()) +
           "): chown it to that user";
  }
  if ((file.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return "billguard.api_key_file has group or world access (mode " + Octal(file.st_mode) +
           "): it must be readable by its owner only, chmod 600 it";
  }
  return "";
}

}  // namespace

ApiKeyResult LoadApiKey(const std::string& path) {
  if (path.empty()) return {"", "billguard.api_key_file is not set"};
  // Checked through the descriptor that is read, so the file cannot be
  // swapped between the check and the read; O_NONBLOCK keeps a FIFO from
  // hanging the worker.
  FileDescriptor file(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (file.get() < 0)
    return {"", std::string("cannot open billguard.api_key_file: ") + std::strerror(errno)};
  struct stat status;
  if (fstat(file.get(), &status) != 0)
    return {"", std::string("cannot stat billguard.api_key_file: ") + std::strerror(errno)};
  const std::string refused = OwnershipError(status);
  if (!refused.empty()) return {"", refused};

  std::string key;
  char buffer[512];
  ssize_t n;
  while ((n = read(file.get(), buffer, sizeof(buffer))) > 0 && key.size() <= kMaxFileSize)
    key.append(buffer, static_cast<size_t>(n));
  if (n < 0)
    return {"", std::string("cannot read billguard.api_key_file: ") + std::strerror(errno)};
  const auto first = key.find_first_not_of(" \t\r\n");
  const auto last = key.find_last_not_of(" \t\r\n");
  key = first == std::string::npos ? "" : key.substr(first, last - first + 1);
  if (!LooksLikeStripeKey(key))
    return {"", "billguard.api_key_file does not hold a Stripe key (rk_..., sk_... or vk_...)"};
  return {key, ""};
}

}  // namespace billguard
