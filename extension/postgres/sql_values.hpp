// Conversions between SQL values and C++ views, each PostgreSQL call made
// through CallPostgres so an error inside it unwinds C++ frames properly.
#pragma once

#include <string_view>

#include "postgres/pg_boundary.hpp"
#include "postgres/pg_compat.hpp"

extern "C" {
#include "utils/builtins.h"
}

namespace billguard {

// A view of text argument `n`, valid for the rest of the call.
inline std::string_view TextArgument(FunctionCallInfo fcinfo, int n) {
  text* value = CallPostgres([&] { return PG_GETARG_TEXT_PP(n); });
  return std::string_view(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));
}

inline Datum TextDatum(std::string_view value) {
  return CallPostgres(
      [&] { return PointerGetDatum(cstring_to_text_with_len(value.data(), value.size())); });
}

}  // namespace billguard
