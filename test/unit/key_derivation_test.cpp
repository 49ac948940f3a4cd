// Unit tests of the pure C++ key derivation, printing TAP.
// Expected keys come from an independent implementation:
//   printf '%s' 'cust_123:2026-08:akka-billing' | sha256sum | cut -c1-32
#include <cstdio>
#include <string>

#include "errors.hpp"
#include "key_derivation.hpp"

namespace {

int test_number = 0;
int failures = 0;

void Ok(bool passed, const std::string& name) {
  ++test_number;
  if (!passed) ++failures;
  std::printf("%s %d - %s\n", passed ? "ok" : "not ok", test_number, name.c_str());
}

std::string Key(const std::string& c, const std::string& p, const std::string& ns) {
  char out[billguard::kIdempotencyKeyLength];
  billguard::DeriveIdempotencyKey(c, p, ns, out);
  return std::string(out, sizeof(out));
}

// True when DeriveIdempotencyKey rejects the input with a message naming `argument`.
bool Rejects(const std::string& c, const std::string& p, const std::string& ns,
             const std::string& argument) {
  try {
    Key(c, p, ns);
  } catch (const billguard::InvalidParameter& e) {
    return std::string(e.what()).find(argument) != std::string::npos;
  }
  return false;
}

}  // namespace

int main() {
  std::printf("1..16\n");
  Ok(Key("cust_123", "2026-08", "akka-billing") == "0f3fe6c7ee131571ac54c216d9553542",
     "seed example key");
  Ok(Key("cust_123", "2026-09", "akka-billing") == "775752ca751ed766598910e10176f25d",
     "another period gives another key");
  Ok(Key("cust_123", "2026-08", "akka-billing") == Key("cust_123", "2026-08", "akka-billing"),
     "deterministic");
  Ok(Key("ü", "2026-08", "ns") == "25b1597e0f7b9cb77ed964319119138c",
     "UTF-8 bytes are hashed as-is");
  Ok(Key(std::string(255, 'x'), "2026-08", "akka-billing").size() == 32, "255-byte customer id");
  Ok(Rejects("", "2026-08", "ns", "customer_id"), "empty customer_id rejected");
  Ok(Rejects(std::string(256, 'x'), "2026-08", "ns", "customer_id"),
     "256-byte customer_id rejected");
  Ok(Rejects("c", "2026-13", "ns", "billing_period"), "month 13 rejected");
  Ok(Rejects("c", "2026-00", "ns", "billing_period"), "month 00 rejected");
  Ok(Rejects("c", "2026-8", "ns", "billing_period"), "one-digit month rejected");
  Ok(Rejects("c", " 2026-08", "ns", "billing_period"), "leading blank rejected");
  Ok(Rejects("c", "1969-12", "ns", "billing_period"), "year before 1970 rejected");
  Ok(Rejects("c", "2026-08", "", "namespace"), "empty namespace rejected");
  Ok(Rejects("c", "2026-08", "a:b", "namespace"), "namespace with ':' rejected");
  Ok(billguard::IsValidBillingPeriod("1970-01") && billguard::IsValidBillingPeriod("9999-12"),
     "period bounds accepted");
  Ok(!billguard::IsValidBillingPeriod("2026-08 ") && !billguard::IsValidBillingPeriod("2026/08"),
     "period shape enforced");
  return failures == 0 ? 0 : 1;
}
