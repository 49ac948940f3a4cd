// SQL function billguard.charge_request_body(...): the form body of a
// record's charge, encoded by common/stripe_request.*. The claim that first
// sends a record stores it, so every later attempt sends exactly these bytes
// whatever a later version of this encoder would produce.
//
// Three C symbols: billguard_charge_request_body is the one 0.1.0 had, and
// still builds 0.1.0's body (ChargeForm::kRelease010), because the upgrade
// script from 0.1.0 calls it to store the request of the records 0.1.0 had
// sent; billguard_charge_request_body_v2 is 0.2.0's eight arguments;
// billguard_charge_request_body_v3, 0.3.0's, adds the record's description,
// metadata and application fee (without them, the bytes of _v2).
#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "common/stripe_request.hpp"

#include "postgres/sql_values.hpp"
#include "postgres/sql_function.hpp"

extern "C" {
#include "utils/jsonb.h"
}

namespace {

// (endpoint, idempotency_key, customer_id, billing_period, amount_cents,
//  currency, stripe_customer, payment_method) of fcinfo; payment_method may
// be NULL, nothing else may.
billguard::ChargeRecord RecordArguments(FunctionCallInfo fcinfo) {
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
  return record;
}

Datum EncodedBody(FunctionCallInfo fcinfo, const billguard::ChargeRecord& record,
                  billguard::ChargeForm form) {
  const std::string endpoint(billguard::TextArgument(fcinfo, 0));
  return billguard::TextDatum(
      billguard::FormEncode(billguard::ChargeFields(record, endpoint, form)));
}

// The text of jsonb argument `n`, as jsonb_out writes it.
std::string JsonbArgument(FunctionCallInfo fcinfo, int n) {
  char* text = billguard::CallPostgres([&] {
    Jsonb* value = PG_GETARG_JSONB_P(n);
    return JsonbToCString(nullptr, &value->root, VARSIZE(value));
  });
  return std::string(text);
}

// A metadata object's keys and string values, in the byte order of the keys
// (nlohmann's object is sorted), so the same object always encodes alike.
std::vector<std::pair<std::string, std::string>> MetadataPairs(const std::string& json_text) {
  const nlohmann::json metadata = nlohmann::json::parse(json_text, nullptr, false);
  if (!metadata.is_object()) {
    throw billguard::InvalidParameter("charge_request_body: metadata must be a JSON object");
  }
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) {
      throw billguard::InvalidParameter("charge_request_body: metadata value of \"" + key +
                                        "\" must be a string");
    }
    pairs.emplace_back(key, value.get<std::string>());
  }
  return pairs;
}

}  // namespace

BILLGUARD_SQL_FUNCTION(charge_request_body) {
  return EncodedBody(fcinfo, RecordArguments(fcinfo), billguard::ChargeForm::kRelease010);
}

BILLGUARD_SQL_FUNCTION(charge_request_body_v2) {
  return EncodedBody(fcinfo, RecordArguments(fcinfo), billguard::ChargeForm::kOffSession);
}

// ... plus (description, metadata jsonb, application_fee_cents), each NULL
// when the record has none.
BILLGUARD_SQL_FUNCTION(charge_request_body_v3) {
  billguard::ChargeRecord record = RecordArguments(fcinfo);
  if (!PG_ARGISNULL(8)) record.description = billguard::TextArgument(fcinfo, 8);
  if (!PG_ARGISNULL(9)) record.metadata = MetadataPairs(JsonbArgument(fcinfo, 9));
  if (!PG_ARGISNULL(10)) record.application_fee_cents = PG_GETARG_INT64(10);
  return EncodedBody(fcinfo, record, billguard::ChargeForm::kOffSession);
}
