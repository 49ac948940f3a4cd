// The one way a C++ function becomes SQL-callable: each is declared with its
// name said once, and its body always runs inside GuardedCall, so no C++
// exception can reach PostgreSQL.
//
//   BILLGUARD_SQL_FUNCTION(is_billing_period) {
//     return BoolGetDatum(billguard::IsValidBillingPeriod(billguard::TextArgument(fcinfo, 0)));
//   }
//
// defines the C symbol billguard_is_billing_period (CREATE FUNCTION ... AS
// 'MODULE_PATHNAME', 'billguard_is_billing_period') with its version-1
// calling convention record. The body sees `fcinfo` as any PostgreSQL
// function does (PG_GETARG_*, PG_ARGISNULL, PG_RETURN_NULL); an unexpected
// C++ error names `name` in its context.
#pragma once

#include "postgres/pg_boundary.hpp"

extern "C" {
#include "postgres.h"
#include "fmgr.h"
}

#define BILLGUARD_SQL_FUNCTION(name)                                                           \
  static Datum billguard_##name##_body(FunctionCallInfo fcinfo);                               \
  extern "C" {                                                                                 \
  PG_FUNCTION_INFO_V1(billguard_##name);                                                       \
  }                                                                                            \
  extern "C" Datum billguard_##name(PG_FUNCTION_ARGS) {                                        \
    return billguard::GuardedCall(#name,                                                       \
                                  [&]() -> Datum { return billguard_##name##_body(fcinfo); }); \
  }                                                                                            \
  static Datum billguard_##name##_body([[maybe_unused]] FunctionCallInfo fcinfo)
