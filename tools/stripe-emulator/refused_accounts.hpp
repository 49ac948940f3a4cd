// The connected accounts that refuse the platform (access revoked, or never
// connected), set through the control API: a request naming one in
// Stripe-Account gets Stripe's 403, as an account of a bad shape does.
#pragma once

#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace stripe_emulator {

class RefusedAccounts {
 public:
  bool contains(const std::string& account) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return accounts_.count(account) > 0;
  }
  void replace(std::vector<std::string> accounts) {
    std::lock_guard<std::mutex> lock(mutex_);
    accounts_ = std::set<std::string>(accounts.begin(), accounts.end());
  }
  std::vector<std::string> list() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {accounts_.begin(), accounts_.end()};
  }

 private:
  mutable std::mutex mutex_;
  std::set<std::string> accounts_;
};

}  // namespace stripe_emulator
