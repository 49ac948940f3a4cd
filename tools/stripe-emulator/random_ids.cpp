#include "random_ids.hpp"

#include <chrono>
#include <functional>
#include <random>
#include <thread>

namespace stripe_emulator {

namespace {

// One generator per thread: no lock on the hot path, and the seed mixes the
// thread id so threads started in the same instant do not share a sequence.
std::mt19937_64& thread_generator() {
  thread_local std::mt19937_64 generator([] {
    std::random_device device;
    const auto thread_hash = std::hash<std::thread::id>{}(std::this_thread::get_id());
    const auto now =
        static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::seed_seq seed{static_cast<std::uint64_t>(device()), static_cast<std::uint64_t>(device()),
                       static_cast<std::uint64_t>(thread_hash), now};
    return std::mt19937_64(seed);
  }());
  return generator;
}

}  // namespace

std::string random_alphanumeric(std::size_t length) {
  static const char kAlphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  std::uniform_int_distribution<std::size_t> pick(0, sizeof(kAlphabet) - 2);
  auto& generator = thread_generator();
  std::string text(length, '0');
  for (auto& c : text) c = kAlphabet[pick(generator)];
  return text;
}

std::string new_object_id(std::string_view prefix) {
  std::string id(prefix);
  id += '_';
  id += random_alphanumeric(24);
  return id;
}

std::string new_request_id() {
  return "req_" + random_alphanumeric(14);
}

}  // namespace stripe_emulator
