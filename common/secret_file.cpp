// Reading secret files (see secret_file.hpp).
#include "cpp_only.hpp"

#include "secret_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace billguard {

namespace {

// Secrets are short; a larger file is not a secret file.
constexpr size_t kMaxFileSize = 4096;

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
std::string OwnershipError(const struct stat& file, const std::string& name) {
  if (!S_ISREG(file.st_mode)) return name + " is not a regular file";
  // Its owner could rewrite or expose the secret at will.
  if (file.st_uid != geteuid()) {
    return name + " is owned by uid " + std::to_string(file.st_uid) +
           ", not by this process's user (uid " + std::to_string(geteuid()) +
           "): chown it to that user";
  }
  if ((file.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return name + " has group or world access (mode " + Octal(file.st_mode) +
           "): it must be readable by its owner only, chmod 600 it";
  }
  return "";
}

}  // namespace

SecretFile ReadSecretFile(const std::string& path, const std::string& name) {
  // Checked through the descriptor that is read, so the file cannot be
  // swapped between the check and the read; O_NONBLOCK keeps a FIFO from
  // hanging the reader.
  FileDescriptor file(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (file.get() < 0) return {"", "cannot read " + name + ": " + std::strerror(errno)};
  struct stat status;
  if (fstat(file.get(), &status) != 0)
    return {"", "cannot read " + name + ": " + std::strerror(errno)};
  if (std::string refused = OwnershipError(status, name); !refused.empty()) return {"", refused};

  std::string content;
  char buffer[512];
  ssize_t n;
  while ((n = read(file.get(), buffer, sizeof(buffer))) > 0 && content.size() <= kMaxFileSize)
    content.append(buffer, static_cast<size_t>(n));
  if (n < 0) return {"", "cannot read " + name + ": " + std::strerror(errno)};
  if (content.size() > kMaxFileSize) return {"", name + " is larger than 4 KiB: not a secret file"};
  const auto first = content.find_first_not_of(" \t\r\n");
  const auto last = content.find_last_not_of(" \t\r\n");
  return {first == std::string::npos ? "" : content.substr(first, last - first + 1), ""};
}

}  // namespace billguard
