// Statements on a whole database (see database_statements.hpp).
#include "workers/database_statements.hpp"

#include <cerrno>
#include <csignal>

#include "workers/history_probe.hpp"
#include "postgres/pg_compat.hpp"
#include "postgres/shared_state.hpp"
#include "postgres/wait_events.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "storage/procarray.h"
#include "utils/acl.h"
#include "utils/syscache.h"
}

namespace billguard {

namespace {

// How long a statement waits for the dispatcher it stopped to leave; past
// it, PostgreSQL's own wait of 5 s for other sessions follows.
constexpr int kStopWaitMs = 10000;

// This backend holds a database (a statement of its own runs).
bool holding = false;

struct Facts {
  bool is_template = false;
  bool invalid = false;  // left by an interrupted DROP DATABASE
};

Facts FactsOf(Oid database) {
  Facts facts;
  HeapTuple tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(database));
  if (!HeapTupleIsValid(tuple)) return facts;
  const Form_pg_database row = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
  facts.is_template = row->datistemplate;
  facts.invalid = database_is_invalid_form(row);
  ReleaseSysCache(tuple);
  return facts;
}

struct Target {
  Oid database = InvalidOid;
  const char* name = nullptr;
  bool drop = false;
};

bool DefNamed(List* options, const char* name, DefElem** found) {
  ListCell* cell;
  foreach (cell, options) {
    DefElem* option = static_cast<DefElem*>(lfirst(cell));
    if (strcmp(option->defname, name) == 0) {
      *found = option;
      return true;
    }
  }
  return false;
}

// The database `statement` needs without connections, when the current
// user may run it (else PostgreSQL refuses it as usual, and nothing here
// happens: no user can stop a dispatcher by a statement it may not run).
Target TargetOf(Node* statement) {
  Target target;
  bool owner_needed = true;
  if (IsA(statement, DropdbStmt)) {
    target.name = castNode(DropdbStmt, statement)->dbname;
    target.drop = true;
  } else if (IsA(statement, RenameStmt) &&
             castNode(RenameStmt, statement)->renameType == OBJECT_DATABASE) {
    target.name = castNode(RenameStmt, statement)->subname;
  } else if (IsA(statement, AlterDatabaseStmt)) {
    DefElem* tablespace = nullptr;
    if (DefNamed(castNode(AlterDatabaseStmt, statement)->options, "tablespace", &tablespace))
      target.name = castNode(AlterDatabaseStmt, statement)->dbname;
  } else if (IsA(statement, CreatedbStmt)) {
    DefElem* source = nullptr;
    if (DefNamed(castNode(CreatedbStmt, statement)->options, "template", &source) &&
        source->arg != nullptr) {
      target.name = defGetString(source);
      owner_needed = false;
    }
  }
  if (target.name == nullptr) return target;
  const Oid database = get_database_oid(target.name, true);
  if (!OidIsValid(database) || database == MyDatabaseId) return target;
  // As PostgreSQL checks: the owner; for a copy, CREATEDB and the owner
  // or a template.
  const bool owner = compat::OwnsDatabase(database, GetUserId());
  if (owner_needed ? !owner
                   : !have_createdb_privilege() || (!owner && !FactsOf(database).is_template)) {
    return target;
  }
  target.database = database;
  return target;
}

// Stops the database's dispatcher and waits until it has left.
void StopDispatcherOf(Oid database) {
  const int pid = DispatcherPidOf(database);
  if (pid == 0) return;
  // The dispatcher runs as the bootstrap superuser; the statement's own
  // permission was checked above (TargetOf).
  if (kill(pid, SIGTERM) != 0) return;
  for (int waited = 0; waited < kStopWaitMs && BackendPidGetProc(pid) != nullptr; waited += 10) {
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10,
                    WaitEventOf(WaitFor::kDispatcherExit));
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
  }
}

}  // namespace

void PrepareDatabaseStatement(Node* statement) {
  const Target target = TargetOf(statement);
  if (!OidIsValid(target.database)) return;
  // Full: the statement runs as before, and may meet a dispatcher.
  if (!HoldDatabase(target.database)) return;
  holding = true;
  // DROP DATABASE refuses a template itself, and cannot be probed in an
  // invalid database.
  const Facts facts = FactsOf(target.database);
  if (target.drop && !facts.is_template && !facts.invalid) {
    bool has_history = false;
    int64 records = 0;
    ProbeHistory(target.database, target.name, &has_history, &records);
    if (has_history) {
      ereport(ERROR,
              (errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
               errmsg("DROP DATABASE would drop billguard's billing history (%lld billing records)",
                      static_cast<long long>(records)),
               errdetail("Database \"%s\" bills that history; a billguard installed again "
                         "without it would claim, and charge, periods that are already billed.",
                         target.name),
               errhint("Archive the history first: in database \"%s\", SELECT * FROM "
                       "billguard.archive_history('billguard_archive'); then run DROP DATABASE "
                       "again.",
                       target.name)));
    }
  }
  StopDispatcherOf(target.database);
}

void EndDatabaseStatement() {
  if (!holding) return;
  holding = false;
  ReleaseHolds();
}

}  // namespace billguard
