// Unit tests of the dispatcher's pure C++ pieces, printing TAP: Stripe form
// encoding and parameters, the search path and request pacing.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "rate_pacer.hpp"
#include "stripe_request.hpp"
#include "tap.hpp"

namespace {

using tap::Is;
using tap::Ok;

billguard::ChargeRecord Record() {
  billguard::ChargeRecord r;
  r.idempotency_key = "0f3fe6c7ee131571ac54c216d9553542";
  r.customer_id = "cust 1&2";
  r.billing_period = "2026-08";
  r.amount_cents = 4900;
  r.currency = "usd";
  r.stripe_customer = "cus_123";
  r.payment_method = "pm_card_visa";
  return r;
}

}  // namespace

int main() {
  using billguard::FormEncode;
  Is(FormEncode({{"a", "1"}, {"b c", "x&y=z"}, {"metadata[k]", "ü~"}}),
     "a=1&b+c=x%26y%3Dz&metadata%5Bk%5D=%C3%BC~",
     "form encoding escapes reserved bytes, UTF-8 and spaces");
  using billguard::ChargeForm;
  Is(FormEncode(billguard::ChargeFields(Record(), "/v1/payment_intents", ChargeForm::kOffSession)),
     "amount=4900&currency=usd&customer=cus_123&payment_method=pm_card_visa&confirm=true"
     "&off_session=true&automatic_payment_methods%5Benabled%5D=true"
     "&automatic_payment_methods%5Ballow_redirects%5D=never"
     "&description=billguard+cust+1%262+2026-08"
     "&metadata%5Bbillguard_key%5D=0f3fe6c7ee131571ac54c216d9553542"
     "&metadata%5Bbilling_period%5D=2026-08&metadata%5Bcustomer_id%5D=cust+1%262",
     "PaymentIntent parameters, in a fixed order, saying how it may be paid (no redirects)");
  // What 0.1.0 sent, byte for byte: the upgrade stores it for the records
  // 0.1.0 had sent, which must be re-sent exactly so.
  Is(FormEncode(billguard::ChargeFields(Record(), "/v1/payment_intents", ChargeForm::kRelease010)),
     "amount=4900&currency=usd&customer=cus_123&payment_method=pm_card_visa&confirm=true"
     "&off_session=true&description=billguard+cust+1%262+2026-08"
     "&metadata%5Bbillguard_key%5D=0f3fe6c7ee131571ac54c216d9553542"
     "&metadata%5Bbilling_period%5D=2026-08&metadata%5Bcustomer_id%5D=cust+1%262",
     "0.1.0's PaymentIntent parameters, unchanged");
  Ok(FormEncode(
         billguard::ChargeFields(Record(), "/v1/payment_intents", ChargeForm::kOffSession)) ==
         FormEncode(
             billguard::ChargeFields(Record(), "/v1/payment_intents", ChargeForm::kOffSession)),
     "byte-identical on every attempt");
  auto no_method = Record();
  no_method.payment_method.clear();
  Ok(FormEncode(billguard::ChargeFields(no_method, "/v1/payment_intents", ChargeForm::kOffSession))
             .find("payment_method=") == std::string::npos,
     "no payment_method when the account has none");
  Is(FormEncode(billguard::ChargeFields(Record(), "/v1/charges", ChargeForm::kOffSession)),
     FormEncode(billguard::ChargeFields(Record(), "/v1/charges", ChargeForm::kRelease010)),
     "a Charge has no payment method choice to make: the same body in both shapes");
  Is(FormEncode(billguard::ChargeFields(Record(), "/v1/charges", ChargeForm::kOffSession))
         .substr(0, 62),
     "amount=4900&currency=usd&customer=cus_123&source=pm_card_visa&", "charges use source");
  auto detailed = Record();
  detailed.description = "August: 1,284 calls";
  detailed.metadata = {{"billguard_key", "forged"}, {"plan", "pro & more"}, {"customer_id", "x"}};
  detailed.application_fee_cents = 120;
  Is(FormEncode(billguard::ChargeFields(detailed, "/v1/payment_intents", ChargeForm::kOffSession)),
     "amount=4900&currency=usd&customer=cus_123&payment_method=pm_card_visa&confirm=true"
     "&off_session=true&automatic_payment_methods%5Benabled%5D=true"
     "&automatic_payment_methods%5Ballow_redirects%5D=never&application_fee_amount=120"
     "&description=August%3A+1%2C284+calls"
     "&metadata%5Bbillguard_key%5D=0f3fe6c7ee131571ac54c216d9553542"
     "&metadata%5Bbilling_period%5D=2026-08&metadata%5Bcustomer_id%5D=cust+1%262"
     "&metadata%5Bplan%5D=pro+%26+more",
     "a period amount's description and metadata, and the fee: billguard's keys win");
  auto zero_fee = Record();
  zero_fee.application_fee_cents = 0;
  Ok(FormEncode(billguard::ChargeFields(zero_fee, "/v1/charges", ChargeForm::kOffSession))
             .find("&application_fee_amount=0&") != std::string::npos,
     "a fee of 0 is sent (the account says so), none when it has none");
  bool threw = false;
  try {
    billguard::ChargeFields(Record(), "/v1/refunds", ChargeForm::kOffSession);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  Ok(threw, "an unknown endpoint is refused");
  Is(billguard::SearchPath("/v1/payment_intents", "abc"),
     "/v1/payment_intents/search?query=metadata%5B%27billguard_key%27%5D%3A%27abc%27",
     "search path");

  using Clock = billguard::RatePacer::Clock;
  billguard::RatePacer pacer(100);
  const auto t0 = Clock::now();
  int started = 0;
  for (int ms = 0; ms < 1000; ++ms) {
    const auto now = t0 + std::chrono::milliseconds(ms);
    while (pacer.Ready(now)) {
      pacer.Take(now);
      ++started;
    }
  }
  Ok(started >= 95 && started <= 100,
     "100/s paces 95..100 starts in a second (got " + std::to_string(started) + ")");
  billguard::RatePacer slow(100);
  slow.SlowDown(t0);
  Ok(slow.Rate(t0) < 50 && slow.Rate(t0 + std::chrono::seconds(10)) > 97,
     "a 429 halves the rate, which recovers");

  return tap::Done();
}
