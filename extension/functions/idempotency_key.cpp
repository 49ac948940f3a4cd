// SQL functions billguard.idempotency_key(customer_id, billing_period, namespace),
// billguard.key_namespace() (the default namespace) and
// billguard.is_billing_period(text).
#include "common/key_derivation.hpp"
#include "module.hpp"
#include "postgres/sql_values.hpp"

extern "C" {
PG_FUNCTION_INFO_V1(billguard_idempotency_key);
PG_FUNCTION_INFO_V1(billguard_key_namespace);
PG_FUNCTION_INFO_V1(billguard_is_billing_period);
}

// IMMUTABLE STRICT PARALLEL SAFE: the key depends on its three arguments only.
extern "C" Datum billguard_idempotency_key(PG_FUNCTION_ARGS) {
  return billguard::GuardedCall("idempotency_key", [&]() -> Datum {
    char key[billguard::kIdempotencyKeyLength];
    billguard::DeriveIdempotencyKey(billguard::TextArgument(fcinfo, 0),
                                    billguard::TextArgument(fcinfo, 1),
                                    billguard::TextArgument(fcinfo, 2), key);
    return billguard::TextDatum(std::string_view(key, sizeof(key)));
  });
}

// The default of idempotency_key's namespace argument. A C function rather
// than current_setting(): calling it loads billguard.so, which defines the
// setting, so the default also works in sessions that did not preload it.
extern "C" Datum billguard_key_namespace(PG_FUNCTION_ARGS) {
  return billguard::GuardedCall("key_namespace", [&]() -> Datum {
    return billguard::TextDatum(billguard::settings::key_namespace);
  });
}

// The period rule of idempotency_key(), for CHECK constraints and SQL.
extern "C" Datum billguard_is_billing_period(PG_FUNCTION_ARGS) {
  return billguard::GuardedCall("is_billing_period", [&]() -> Datum {
    return BoolGetDatum(billguard::IsValidBillingPeriod(billguard::TextArgument(fcinfo, 0)));
  });
}
