// Builders of journal events that are written once per billing record, so
// their cost is paid a million times by a large bill_period. Building the
// jsonb directly avoids jsonb_build_object's per-call type lookups.
#include "postgres/pg_boundary.hpp"
#include "postgres/pg_compat.hpp"
#include "postgres/sql_function.hpp"

extern "C" {
#include "catalog/pg_type_d.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "common/jsonapi.h"
#include "mb/pg_wchar.h"
#include "utils/numeric.h"
#include "utils/datetime.h"
}

namespace {

void PushKey(JsonbParseState** state, const char* key) {
  JsonbValue v;
  v.type = jbvString;
  v.val.string.val = const_cast<char*>(key);
  v.val.string.len = static_cast<int>(strlen(key));
  pushJsonbValue(state, WJB_KEY, &v);
}

void PushString(JsonbParseState** state, const char* key, const char* value, int length) {
  PushKey(state, key);
  JsonbValue v;
  v.type = jbvString;
  v.val.string.val = const_cast<char*>(value);
  v.val.string.len = length;
  pushJsonbValue(state, WJB_VALUE, &v);
}

void PushText(JsonbParseState** state, const char* key, Datum value) {
  text* t = DatumGetTextPP(value);
  PushString(state, key, VARDATA_ANY(t), static_cast<int>(VARSIZE_ANY_EXHDR(t)));
}

// Plain C-style PostgreSQL code: it may ereport, so it owns no C++ objects
// and runs inside CallPostgres.
Datum BuildBillingInitiated(FunctionCallInfo fcinfo) {
  for (int i = 0; i < 6; ++i) {
    if (PG_ARGISNULL(i)) {
      ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                      errmsg("billing_initiated_event: argument %d must not be NULL", i + 1)));
    }
  }
  JsonbParseState* state = nullptr;
  pushJsonbValue(&state, WJB_BEGIN_OBJECT, nullptr);
  PushText(&state, "customer_id", PG_GETARG_DATUM(0));
  PushText(&state, "billing_period", PG_GETARG_DATUM(1));
  PushText(&state, "idempotency_key", PG_GETARG_DATUM(2));
  PushKey(&state, "amount_cents");
  JsonbValue amount;
  amount.type = jbvNumeric;
  amount.val.numeric = int64_to_numeric(PG_GETARG_INT64(3));
  pushJsonbValue(&state, WJB_VALUE, &amount);
  PushText(&state, "currency", PG_GETARG_DATUM(4));
  char timestamp[MAXDATELEN + 1];
  JsonEncodeDateTime(timestamp, PG_GETARG_DATUM(5), TIMESTAMPTZOID, nullptr);
  PushString(&state, "initiated_at", timestamp, static_cast<int>(strlen(timestamp)));
  if (PG_NARGS() > 6 && !PG_ARGISNULL(6)) PushText(&state, "request_id", PG_GETARG_DATUM(6));
  JsonbValue* object = pushJsonbValue(&state, WJB_END_OBJECT, nullptr);
  PG_RETURN_POINTER(JsonbValueToJsonb(object));
}

}  // namespace

// billguard.billing_initiated_event(customer_id, billing_period, idempotency_key,
//   amount_cents, currency, initiated_at, request_id DEFAULT NULL) -> jsonb
BILLGUARD_SQL_FUNCTION(billing_initiated_event) {
  return billguard::CallPostgres([&] { return BuildBillingInitiated(fcinfo); });
}

// billguard.is_json(text) -> boolean of 0.1.0, which parsed Stripe's answers
// in SQL. 0.2.0 reads them in C++ (common/stripe_response.cpp) and drops the
// function; the symbol stays for 0.1.0's install script and for databases
// still at 0.1.0.
namespace {

Datum IsJson(FunctionCallInfo fcinfo) {
  text* body = PG_GETARG_TEXT_PP(0);
  JsonLexContext* lex = billguard::compat::MakeJsonLexContext(
      VARDATA_ANY(body), VARSIZE_ANY_EXHDR(body), GetDatabaseEncoding(), true);
  PG_RETURN_BOOL(pg_parse_json(lex, &nullSemAction) == JSON_SUCCESS);
}

}  // namespace

BILLGUARD_SQL_FUNCTION(is_json) {
  return billguard::CallPostgres([&] { return IsJson(fcinfo); });
}
