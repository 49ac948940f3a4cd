// Unit tests of RandomBase62: length, alphabet, the bytes it discards to stay
// unbiased, and a failing source.
#include <algorithm>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "random_text.hpp"
#include "tap.hpp"

namespace {

// A source that hands out `bytes` in order, repeating them.
billguard::RandomBytes Replay(std::vector<unsigned char> bytes) {
  auto next = std::make_shared<std::size_t>(0);
  return [bytes, next](unsigned char* out, std::size_t size) {
    for (std::size_t i = 0; i < size; ++i) out[i] = bytes[(*next)++ % bytes.size()];
    return true;
  };
}

}  // namespace

int main() {
  tap::Is(billguard::RandomBase62(4, Replay({0, 10, 36, 61})), "0Aaz",
          "bytes 0, 10, 36, 61 map to 0, A, a, z");
  tap::Is(billguard::RandomBase62(3, Replay({62, 63, 247})), "01z",
          "62, 63 and 247 wrap around modulo 62");
  tap::Is(billguard::RandomBase62(2, Replay({248, 255, 1, 250, 2})), "12",
          "bytes 248..255 are discarded, never mapped");
  tap::Is(billguard::RandomBase62(1, Replay({255, 255, 255, 5})), "5",
          "a batch of discarded bytes is followed by another batch");

  std::vector<unsigned char> every_byte;
  for (int b = 0; b < 256; ++b) every_byte.push_back(static_cast<unsigned char>(b));
  const std::string text = billguard::RandomBase62(248 * 4, Replay(every_byte));
  std::set<char> seen(text.begin(), text.end());
  tap::Ok(text.size() == 248 * 4, "the requested length is returned");
  tap::Ok(seen.size() == 62, "every byte value 0..247 gives all 62 characters");
  bool even = true;
  for (char c : seen) even = even && std::count(text.begin(), text.end(), c) == 16;
  tap::Ok(even, "over every byte value, each character appears equally often (16 times)");

  bool threw = false;
  try {
    billguard::RandomBase62(8, [](unsigned char*, std::size_t) { return false; });
  } catch (const std::runtime_error&) {
    threw = true;
  }
  tap::Ok(threw, "a failing random source raises instead of returning weak text");
  return tap::Done();
}
