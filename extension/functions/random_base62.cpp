// SQL function billguard.random_base62(length): the secrets and ids of vault
// keys, from PostgreSQL's cryptographic random source.
#include "common/random_text.hpp"

#include "postgres/sql_values.hpp"
#include "postgres/sql_function.hpp"

// VOLATILE STRICT; at most 1024 characters, a secret is 32.
BILLGUARD_SQL_FUNCTION(random_base62) {
  const int32 length = PG_GETARG_INT32(0);
  if (length < 1 || length > 1024) {
    throw billguard::InvalidParameter("length must be 1..1024, got " + std::to_string(length));
  }
  const std::string text = billguard::RandomBase62(
      static_cast<std::size_t>(length),
      [](unsigned char* bytes, std::size_t size) { return pg_strong_random(bytes, size); });
  return billguard::TextDatum(text);
}
