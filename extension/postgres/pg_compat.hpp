// Every difference between the PostgreSQL majors billguard builds against
// (15, 16, 17, 18), in one place. Each condition names the major that
// changed and what changed, so that dropping a major is deleting its branch.
// The rest of the extension calls these names and never tests
// PG_VERSION_NUM itself.
#pragma once

extern "C" {
#include "postgres.h"
#include "fmgr.h"
// 16 moved the varlena macros (VARDATA_ANY, VARSIZE_ANY_EXHDR, ...) out of
// postgres.h into varatt.h.
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif
#include "catalog/pg_database.h"
#include "common/jsonapi.h"
#include "utils/acl.h"
#include "utils/datetime.h"
#include "utils/guc_tables.h"
#include "utils/wait_event.h"
}

#include <cstddef>

// 18 records a library's name and version for pg_get_loaded_modules();
// before it the magic block carries neither.
#if PG_VERSION_NUM >= 180000
#define BILLGUARD_MODULE_MAGIC PG_MODULE_MAGIC_EXT(.name = "billguard", .version = EXTVERSION)
#else
#define BILLGUARD_MODULE_MAGIC PG_MODULE_MAGIC
#endif

namespace billguard::compat {

// 16: DecodeDateTime reports the field that failed in a DateTimeErrorExtra,
// which callers that only test the result ignore.
inline int DecodeDateTime(char** fields, int* types, int count, int* kind, pg_tm* tm,
                          fsec_t* fraction, int* zone) {
#if PG_VERSION_NUM >= 160000
  DateTimeErrorExtra extra;
  return ::DecodeDateTime(fields, types, count, kind, tm, fraction, zone, &extra);
#else
  return ::DecodeDateTime(fields, types, count, kind, tm, fraction, zone);
#endif
}

// 16: one ownership check for every catalog (object_ownercheck) replaced
// pg_database_ownercheck and its siblings.
inline bool OwnsDatabase(Oid database, Oid role) {
#if PG_VERSION_NUM >= 160000
  return object_ownercheck(DatabaseRelationId, database, role);
#else
  return pg_database_ownercheck(database, role);
#endif
}

// 16: get_guc_variables returns the count through its argument, and
// GetNumConfigOptions is gone.
inline config_generic** GucVariables(int* count) {
#if PG_VERSION_NUM >= 160000
  return get_guc_variables(count);
#else
  *count = GetNumConfigOptions();
  return get_guc_variables();
#endif
}

// 17: makeJsonLexContextCstringLen takes the context to fill first (NULL
// allocates one, as before 17 it always did).
inline JsonLexContext* MakeJsonLexContext(const char* json, size_t length, int encoding,
                                          bool need_escapes) {
#if PG_VERSION_NUM >= 170000
  return makeJsonLexContextCstringLen(nullptr, json, length, encoding, need_escapes);
#else
  return makeJsonLexContextCstringLen(const_cast<char*>(json), static_cast<int>(length), encoding,
                                      need_escapes);
#endif
}

// 17: an extension names its own wait events (WaitEventExtensionNew), and
// pg_stat_activity.wait_event shows that name; before 17 every wait of an
// extension shows as "Extension". Needs shared memory: call it in a backend
// or background worker, not in _PG_init.
inline uint32 WaitEventNamed([[maybe_unused]] const char* name) {
#if PG_VERSION_NUM >= 170000
  return WaitEventExtensionNew(name);
#else
  return PG_WAIT_EXTENSION;
#endif
}

}  // namespace billguard::compat
