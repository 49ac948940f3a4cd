// Event trigger function billguard.protect_history(): DROP EXTENSION
// billguard, DROP SCHEMA billguard and DROP OWNED BY the role owning either
// (with or without CASCADE) would drop billguard.billing_records, and a
// billguard installed again would claim, and charge, periods already billed.
// They are refused while that table holds rows; archive_history() moves the
// history out of the extension first.
//
// It runs at ddl_command_start, before anything is dropped, and reads the
// statement from the parse tree: a sql_drop trigger would be dropped with
// the extension before it could object. PostgreSQL loads billguard.so to
// call it, so it guards every session, preloaded or not.
#include "pg_boundary.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "commands/event_trigger.h"
#include "executor/spi.h"
#include "nodes/parsenodes.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

PG_FUNCTION_INFO_V1(billguard_protect_history);
}

namespace {

// What a statement must name to drop billguard.
struct Installation {
  bool installed = false;
  Oid schema = InvalidOid;
  const char* schema_name = nullptr;
  Oid extension_owner = InvalidOid;
  Oid schema_owner = InvalidOid;
};

Installation FindInstallation() {
  Installation found;
  Relation catalog = table_open(ExtensionRelationId, AccessShareLock);
  ScanKeyData key;
  ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
              CStringGetDatum("billguard"));
  SysScanDesc scan = systable_beginscan(catalog, ExtensionNameIndexId, true, nullptr, 1, &key);
  HeapTuple tuple = systable_getnext(scan);
  if (HeapTupleIsValid(tuple)) {
    const auto* extension = reinterpret_cast<Form_pg_extension>(GETSTRUCT(tuple));
    found.installed = true;
    found.schema = extension->extnamespace;
    found.extension_owner = extension->extowner;
  }
  systable_endscan(scan);
  table_close(catalog, AccessShareLock);
  if (found.installed) {
    HeapTuple schema = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(found.schema));
    if (HeapTupleIsValid(schema)) {
      const auto* form = reinterpret_cast<Form_pg_namespace>(GETSTRUCT(schema));
      found.schema_name = pstrdup(NameStr(form->nspname));
      found.schema_owner = form->nspowner;
      ReleaseSysCache(schema);
    }
  }
  return found;
}

bool NamesInclude(List* names, const char* name) {
  ListCell* cell;
  foreach (cell, names) {
    if (strcmp(strVal(lfirst(cell)), name) == 0) return true;
  }
  return false;
}

bool DropsBillguard(Node* statement, const Installation& billguard) {
  if (IsA(statement, DropStmt)) {
    const auto* drop = reinterpret_cast<DropStmt*>(statement);
    if (drop->removeType == OBJECT_EXTENSION) return NamesInclude(drop->objects, "billguard");
    if (drop->removeType == OBJECT_SCHEMA && billguard.schema_name != nullptr) {
      return NamesInclude(drop->objects, billguard.schema_name);
    }
    return false;
  }
  if (IsA(statement, DropOwnedStmt)) {
    ListCell* cell;
    foreach (cell, reinterpret_cast<DropOwnedStmt*>(statement)->roles) {
      const Oid role = get_rolespec_oid(static_cast<RoleSpec*>(lfirst(cell)), true);
      if (role == billguard.extension_owner || role == billguard.schema_owner) return true;
    }
  }
  return false;
}

int64 BillingRecordCount(const Installation& billguard) {
  if (billguard.schema_name == nullptr ||
      !OidIsValid(get_relname_relid("billing_records", billguard.schema))) {
    return 0;
  }
  const char* query =
      psprintf("SELECT count(*) FROM %s",
               quote_qualified_identifier(billguard.schema_name, "billing_records"));
  SPI_connect();
  if (SPI_execute(query, true, 1) != SPI_OK_SELECT || SPI_processed != 1) {
    ereport(ERROR, (errmsg("billguard: could not count billing records")));
  }
  bool is_null = false;
  const int64 count =
      DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null));
  SPI_finish();
  return count;
}

// Plain C-style PostgreSQL code: it may ereport, so it owns no C++ objects
// and runs inside CallPostgres.
void ProtectHistory(FunctionCallInfo fcinfo) {
  if (!CALLED_AS_EVENT_TRIGGER(fcinfo)) {
    ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                    errmsg("billguard.protect_history() is an event trigger function")));
  }
  const auto* event = reinterpret_cast<EventTriggerData*>(fcinfo->context);
  const Installation billguard = FindInstallation();
  if (!billguard.installed || !DropsBillguard(event->parsetree, billguard)) return;
  const int64 records = BillingRecordCount(billguard);
  if (records == 0) return;
  const char* command = GetCommandTagName(event->tag);
  ereport(ERROR,
          (errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
           errmsg("%s would drop billguard's billing history (%lld billing records)", command,
                  static_cast<long long>(records)),
           errdetail("A billguard installed again without them would claim, and charge, periods "
                     "that are already billed."),
           errhint("Archive the history first: SELECT * FROM "
                   "billguard.archive_history('billguard_archive'); then run %s again.",
                   command)));
}

}  // namespace

extern "C" Datum billguard_protect_history(PG_FUNCTION_ARGS) {
  return billguard::GuardedCall("protect_history", [&]() -> Datum {
    billguard::CallPostgres([&] { ProtectHistory(fcinfo); });
    fcinfo->isnull = true;
    return Datum(0);
  });
}
