// What keeps a statement from dropping billguard's billing history: while
// billguard.billing_records holds rows, any statement whose deletions reach
// that table is refused, whatever it names: DROP EXTENSION billguard, DROP
// SCHEMA billguard, DROP OWNED BY their owner, and the cascades that reach
// billguard from elsewhere (DROP EXTENSION plpgsql CASCADE, DROP LANGUAGE
// plpgsql CASCADE). A billguard installed again would claim, and charge,
// periods already billed; archive_history() moves the history out of the
// extension first.
//
// PostgreSQL calls the object access hook for every object a statement
// deletes, cascades included, just before it goes, so the guard sees what
// a statement drops rather than what it names. The hook is installed when
// the library is preloaded, and otherwise by the event trigger
// billguard_protect_history, which PostgreSQL fires before every DROP in
// this database (ENABLE ALWAYS: with session_replication_role = replica
// too) and which loads billguard.so to do so. DROP DATABASE is guarded by
// the preloaded ProcessUtility hook (database_statements.cpp).
#include "functions/history_guard.hpp"

#include "postgres/pg_boundary.hpp"
#include "postgres/sql_function.hpp"

extern "C" {
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_class.h"
#include "commands/event_trigger.h"
#include "executor/tuptable.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
}

namespace billguard {

namespace {

object_access_hook_type previous_object_access_hook = nullptr;
bool guard_installed = false;
// The command the event trigger saw last, for the message.
char current_command[NAMEDATALEN] = "this statement";

// Plain PostgreSQL code: the visible rows of `relation`.
int64 VisibleRows(Oid relation) {
  Relation rel = table_open(relation, AccessShareLock);
  Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
  TableScanDesc scan = table_beginscan(rel, snapshot, 0, nullptr);
  TupleTableSlot* slot = table_slot_create(rel, nullptr);
  int64 rows = 0;
  while (table_scan_getnextslot(scan, ForwardScanDirection, slot)) ++rows;
  ExecDropSingleTupleTableSlot(slot);
  table_endscan(scan);
  UnregisterSnapshot(snapshot);
  table_close(rel, NoLock);
  return rows;
}

// Plain PostgreSQL code: refuses the deletion of billguard.billing_records
// while it holds rows.
void GuardDrop(ObjectAccessType access, Oid class_id, Oid object_id, int sub_id, void* arg) {
  if (previous_object_access_hook != nullptr)
    previous_object_access_hook(access, class_id, object_id, sub_id, arg);
  if (access != OAT_DROP || class_id != RelationRelationId || sub_id != 0) return;
  const Oid schema = get_namespace_oid("billguard", true);
  if (!OidIsValid(schema) || object_id != get_relname_relid("billing_records", schema)) return;
  const int64 records = VisibleRows(object_id);
  if (records == 0) return;
  ereport(ERROR,
          (errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
           errmsg("%s would drop billguard's billing history (%lld billing records)",
                  current_command, static_cast<long long>(records)),
           errdetail("A billguard installed again without them would claim, and charge, periods "
                     "that are already billed."),
           errhint("Archive the history first: SELECT * FROM "
                   "billguard.archive_history('billguard_archive'); then run %s again.",
                   current_command)));
}

}  // namespace

void NameCurrentCommand(const char* tag) {
  strlcpy(current_command, tag, sizeof(current_command));
}

void InstallHistoryGuard() {
  if (guard_installed) return;
  previous_object_access_hook = object_access_hook;
  object_access_hook = GuardDrop;
  guard_installed = true;
}

}  // namespace billguard

// Event trigger function billguard.protect_history(), at ddl_command_start
// of every DROP: installs the guard in this session and names the command.
BILLGUARD_SQL_FUNCTION(protect_history) {
  billguard::CallPostgres([&] {
    if (!CALLED_AS_EVENT_TRIGGER(fcinfo)) {
      ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                      errmsg("billguard.protect_history() is an event trigger function")));
    }
    const auto* event = reinterpret_cast<EventTriggerData*>(fcinfo->context);
    billguard::NameCurrentCommand(GetCommandTagName(event->tag));
    billguard::InstallHistoryGuard();
  });
  fcinfo->isnull = true;
  return Datum(0);
}
