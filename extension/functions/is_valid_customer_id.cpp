// SQL function billguard.is_valid_customer_id(text): the one definition of a
// valid customer id, used by the CHECK on billguard.accounts. The character
// rule is common/customer_id.cpp; NFC is PostgreSQL's own is_normalized(),
// the function behind IS NFC NORMALIZED.
#include "common/customer_id.hpp"

#include "postgres/sql_values.hpp"
#include "postgres/sql_function.hpp"

extern "C" {
#include "mb/pg_wchar.h"
}

namespace {

// PostgreSQL normalizes only UTF8 text. In a database of another encoding
// an id is ASCII only, which is NFC as it stands.
bool IsNfc(Datum customer_id) {
  return billguard::CallPostgres([&] {
    return DatumGetBool(
        DirectFunctionCall2(unicode_is_normalized, customer_id, CStringGetTextDatum("NFC")));
  });
}

}  // namespace

// IMMUTABLE STRICT PARALLEL SAFE: a database's encoding never changes.
BILLGUARD_SQL_FUNCTION(is_valid_customer_id) {
  const bool unicode = GetDatabaseEncoding() == PG_UTF8;
  const bool valid = billguard::IsValidCustomerIdText(
      billguard::TextArgument(fcinfo, 0),
      unicode ? billguard::CustomerIdCharset::kUnicode : billguard::CustomerIdCharset::kAsciiOnly);
  return BoolGetDatum(valid && (!unicode || IsNfc(PG_GETARG_DATUM(0))));
}
