// Statements on a whole database that PostgreSQL runs only while no other
// session is connected to it: DROP DATABASE, ALTER DATABASE ... RENAME TO
// and SET TABLESPACE, CREATE DATABASE ... TEMPLATE. A served database has
// its dispatcher connected, so each of them would wait 5 s and fail. The
// preloaded ProcessUtility hook asks first: the backend holds the database
// (the launcher starts no dispatcher there until the statement is over),
// stops its dispatcher, and the statement runs as on a plain server. A
// DROP DATABASE is refused, before anything is stopped, while the database
// holds billing history it bills (history_probe.hpp), with the same hint
// as a DROP EXTENSION: archive the history first.
#pragma once

extern "C" {
#include "postgres.h"
#include "nodes/nodes.h"
}

namespace billguard {

// Plain PostgreSQL code (it may ereport): before `statement` runs.
void PrepareDatabaseStatement(Node* statement);
// Once the statement is over, also when it failed: what it held is released.
void EndDatabaseStatement();

}  // namespace billguard
