// Unit tests of loading the Stripe key from billguard.api_key_file
// (common/api_key.cpp), printing TAP. The key is a secret: no error message
// may contain the file's content.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "api_key.hpp"

#include "tap.hpp"

namespace {

std::string WriteFile(const std::string& content) {
  char path[] = "/tmp/billguard-key-XXXXXX";
  const int fd = mkstemp(path);
  std::FILE* f = fdopen(fd, "w");
  std::fputs(content.c_str(), f);
  std::fclose(f);
  return path;
}

}  // namespace

int main() {
  auto good = billguard::LoadApiKey(WriteFile("  rk_test_51Abc_def \n"));
  tap::Is(good.key, "rk_test_51Abc_def", "a restricted key is loaded, whitespace trimmed");
  auto bad = billguard::LoadApiKey(WriteFile("password=hunter2\n"));
  tap::Ok(bad.key.empty() && bad.error.find("hunter2") == std::string::npos,
          "a file without a Stripe key is refused without echoing its content");
  tap::Ok(!billguard::LoadApiKey("/nonexistent/key").error.empty(), "a missing file is reported");
  tap::Ok(!billguard::LoadApiKey("").error.empty(), "an unset path is reported");
  return tap::Done();
}
