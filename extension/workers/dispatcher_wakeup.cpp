// Commit-time wake-ups (see dispatcher_wakeup.hpp).
#include "postgres/pg_boundary.hpp"
#include "workers/billing_database.hpp"
#include "workers/database_statements.hpp"
#include "workers/dispatcher_wakeup.hpp"
#include "functions/history_guard.hpp"
#include "postgres/shared_state.hpp"
#include "postgres/sql_function.hpp"

extern "C" {
#include "access/xact.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
}

namespace billguard {

namespace {

bool wake_at_commit = false;
bool request_at_commit = false;
bool rescan_at_commit = false;
bool callback_registered = false;
ProcessUtility_hook_type previous_utility_hook = nullptr;

void OnTransactionEnd(XactEvent event, void* /*arg*/) {
  switch (event) {
    case XACT_EVENT_COMMIT:
      if (request_at_commit) RequestService(MyDatabaseId);
      if (rescan_at_commit) RequestRescan();
      if (wake_at_commit) WakeDispatcherOf(MyDatabaseId);
      wake_at_commit = request_at_commit = rescan_at_commit = false;
      break;
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PREPARE:
      wake_at_commit = request_at_commit = rescan_at_commit = false;
      break;
    default:
      break;
  }
}

void RegisterCallbackOnce() {
  if (callback_registered) return;
  RegisterXactCallback(OnTransactionEnd, nullptr);
  callback_registered = true;
}

// Plain PostgreSQL code: errors of the statement pass through it.
void ProcessUtility(PlannedStmt* statement, const char* query, bool read_only_tree,
                    ProcessUtilityContext context, ParamListInfo params,
                    QueryEnvironment* environment, DestReceiver* destination,
                    QueryCompletion* completion) {
  Node* node = statement->utilityStmt;
  const bool creates_billguard =
      IsA(node, CreateExtensionStmt) &&
      strcmp(castNode(CreateExtensionStmt, node)->extname, "billguard") == 0;
  NameCurrentCommand(GetCommandTagName(CreateCommandTag(node)));
  PG_TRY();
  {
    if (creates_billguard) NoteCreateExtensionSession();
    PrepareDatabaseStatement(node);
    if (previous_utility_hook != nullptr) {
      previous_utility_hook(statement, query, read_only_tree, context, params, environment,
                            destination, completion);
    } else {
      standard_ProcessUtility(statement, query, read_only_tree, context, params, environment,
                              destination, completion);
    }
  }
  PG_FINALLY();
  {
    // The script's own statements come through here too.
    if (creates_billguard) ForgetCreateExtensionSession();
    EndDatabaseStatement();
  }
  PG_END_TRY();
  if (creates_billguard) {
    RegisterCallbackOnce();
    request_at_commit = true;
  } else if (IsA(node, AlterDatabaseStmt) || IsA(node, CreatedbStmt) || IsA(node, DropdbStmt) ||
             (IsA(node, RenameStmt) && castNode(RenameStmt, node)->renameType == OBJECT_DATABASE)) {
    // The launcher looks at pg_database again once it commits: a copy of a
    // database with the extension is served at once, a renamed one under
    // its new name; with ALLOW_CONNECTIONS false or IS_TEMPLATE true the
    // dispatcher leaves.
    RegisterCallbackOnce();
    rescan_at_commit = true;
  }
}

}  // namespace

void InstallCreateExtensionHook() {
  previous_utility_hook = ProcessUtility_hook;
  ProcessUtility_hook = ProcessUtility;
}

}  // namespace billguard

// billguard.wake_dispatcher(): wake this database's dispatcher at COMMIT.
BILLGUARD_SQL_FUNCTION(wake_dispatcher) {
  billguard::CallPostgres([] { billguard::RegisterCallbackOnce(); });
  billguard::wake_at_commit = true;
  PG_RETURN_VOID();
}
