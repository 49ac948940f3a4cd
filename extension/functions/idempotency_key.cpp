// SQL functions billguard.idempotency_key(customer_id, billing_period, namespace),
// billguard.key_namespace() (the default namespace) and
// billguard.is_billing_period(text).
#include "common/key_derivation.hpp"
#include "settings/settings.hpp"
#include "postgres/sql_values.hpp"
#include "postgres/sql_function.hpp"

// IMMUTABLE STRICT PARALLEL SAFE: the key depends on its three arguments only.
BILLGUARD_SQL_FUNCTION(idempotency_key) {
  char key[billguard::kIdempotencyKeyLength];
  billguard::DeriveIdempotencyKey(billguard::TextArgument(fcinfo, 0),
                                  billguard::TextArgument(fcinfo, 1),
                                  billguard::TextArgument(fcinfo, 2), key);
  return billguard::TextDatum(std::string_view(key, sizeof(key)));
}

// The default of idempotency_key's namespace argument. A C function rather
// than current_setting(): calling it loads billguard.so, which defines the
// setting, so the default also works in sessions that did not preload it.
BILLGUARD_SQL_FUNCTION(key_namespace) {
  return billguard::TextDatum(billguard::settings::key_namespace);
}

// The period rule of idempotency_key(), for CHECK constraints and SQL.
BILLGUARD_SQL_FUNCTION(is_billing_period) {
  return BoolGetDatum(billguard::IsValidBillingPeriod(billguard::TextArgument(fcinfo, 0)));
}
