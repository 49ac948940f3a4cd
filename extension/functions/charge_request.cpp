// SQL function billguard.charge_request_body(...): the form body of a
// record's charge, encoded by common/stripe_request.*. The claim that first
// sends a record stores it, so every later attempt sends exactly these bytes
// whatever a later version of this encoder would produce.
//
// Two C symbols, one per body shape (ChargeForm): billguard_charge_request_body
// is the one 0.1.0 had, and still builds 0.1.0's body, because the upgrade
// script from 0.1.0 calls it to store the request of the records 0.1.0 had
// sent; billguard.charge_request_body is billguard_charge_request_body_v2.
#include "common/errors.hpp"
#include "common/stripe_request.hpp"

#include "postgres/sql_values.hpp"
#include "postgres/sql_function.hpp"

namespace {

// (endpoint, idempotency_key, customer_id, billing_period, amount_cents,
//  currency, stripe_customer, payment_method) -> text; payment_method may be
// NULL, nothing else may.
Datum ChargeRequestBody(FunctionCallInfo fcinfo, billguard::ChargeForm form) {
  for (int i = 0; i < 7; ++i) {
    if (PG_ARGISNULL(i)) {
      throw billguard::InvalidParameter("charge_request_body: argument " + std::to_string(i + 1) +
                                        " must not be NULL");
    }
  }
  using billguard::TextArgument;
  billguard::ChargeRecord record;
  record.idempotency_key = TextArgument(fcinfo, 1);
  record.customer_id = TextArgument(fcinfo, 2);
  record.billing_period = TextArgument(fcinfo, 3);
  record.amount_cents = PG_GETARG_INT64(4);
  record.currency = TextArgument(fcinfo, 5);
  record.stripe_customer = TextArgument(fcinfo, 6);
  if (!PG_ARGISNULL(7)) record.payment_method = TextArgument(fcinfo, 7);
  const std::string endpoint(TextArgument(fcinfo, 0));
  return billguard::TextDatum(
      billguard::FormEncode(billguard::ChargeFields(record, endpoint, form)));
}

}  // namespace

BILLGUARD_SQL_FUNCTION(charge_request_body) {
  return ChargeRequestBody(fcinfo, billguard::ChargeForm::kRelease010);
}

BILLGUARD_SQL_FUNCTION(charge_request_body_v2) {
  return ChargeRequestBody(fcinfo, billguard::ChargeForm::kOffSession);
}
