// Unit tests of loading the Stripe key from billguard.api_key_file
// (common/api_key.cpp), printing TAP: only a regular file that the server's
// user owns and no one else may read or write is used; no error message
// contains the key or the file's path.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "api_key.hpp"

#include "tap.hpp"
#include "temp_files.hpp"

namespace {

const std::string kKey = "rk_test_51Abc_def";
using temp_files::created;

// A symbolic link to `target`, next to it.
std::string LinkTo(const std::string& target) {
  const std::string link = target + ".link";
  unlink(link.c_str());
  if (symlink(target.c_str(), link.c_str()) != 0) std::perror("symlink");
  created.push_back(link);
  return link;
}

void Loaded(const std::string& path, const std::string& name) {
  const auto loaded = billguard::LoadApiKey(path);
  tap::Is(loaded.key, kKey, name);
  if (!loaded.error.empty()) std::printf("#   error: %s\n", loaded.error.c_str());
}

// Refused with a reason containing `reason_part`, and neither the key nor the path in it.
void Refused(const std::string& path, const std::string& reason_part, const std::string& name) {
  const auto loaded = billguard::LoadApiKey(path);
  const bool clean =
      loaded.error.find(kKey) == std::string::npos && loaded.error.find(path) == std::string::npos;
  tap::Ok(loaded.key.empty() && loaded.error.find(reason_part) != std::string::npos && clean, name);
  if (loaded.error.find(reason_part) == std::string::npos || !clean)
    std::printf("#   error: '%s', expected '%s'\n", loaded.error.c_str(), reason_part.c_str());
}

}  // namespace

int main() {
  Loaded(temp_files::Write("  " + kKey + " \n", 0600), "mode 0600: loaded, whitespace trimmed");
  Loaded(temp_files::Write(kKey, 0400), "mode 0400: loaded");
  Loaded(LinkTo(temp_files::Write(kKey, 0600)),
         "a link to a 0600 file: loaded (the target is checked)");

  Refused(temp_files::Write(kKey, 0644), "group or world access (mode 0644)", "mode 0644: refused");
  Refused(temp_files::Write(kKey, 0640), "mode 0640", "mode 0640 (group-readable): refused");
  Refused(temp_files::Write(kKey, 0604), "mode 0604", "mode 0604 (world-readable): refused");
  Refused(temp_files::Write(kKey, 0620), "mode 0620", "mode 0620 (group-writable): refused");
  Refused(temp_files::Write(kKey, 0601), "mode 0601", "mode 0601 (world-executable): refused");
  Refused(temp_files::Write(kKey, 0644), "chmod 600", "the reason says what to do");
  Refused(LinkTo(temp_files::Write(kKey, 0644)), "mode 0644", "a link to a 0644 file: refused");
  Refused("/tmp", "not a regular file", "a directory: refused");
  const std::string fifo = temp_files::Write("", 0600) + ".fifo";
  mkfifo(fifo.c_str(), 0600);
  created.push_back(fifo);
  Refused(fifo, "not a regular file", "a FIFO: refused at once, not waited on");
  if (geteuid() == 0) {
    const std::string foreign = temp_files::Write(kKey, 0600);
    if (chown(foreign.c_str(), 65534, 65534) != 0) std::perror("chown");
    Refused(foreign, "owned by uid 65534, not by this process's user", "another owner: refused");
  } else {
    tap::Ok(true, "another owner: refused # skip chown needs root");
  }

  Refused(temp_files::Write("password=hunter2\n", 0600), "does not hold a Stripe key",
          "a file without a Stripe key: refused");
  tap::Ok(
      billguard::LoadApiKey(temp_files::Write("password=hunter2\n", 0600)).error.find("hunter2") ==
          std::string::npos,
      "... without echoing its content");
  Refused(temp_files::Write(std::string(5000, 'a'), 0600), "larger than 4 KiB",
          "a large file: refused");
  Refused("/nonexistent/key", "cannot read billguard.api_key_file: No such file",
          "a missing file: reported");
  tap::Ok(!billguard::LoadApiKey("").error.empty(), "an unset path: reported");
  temp_files::RemoveAll();
  return tap::Done();
}
