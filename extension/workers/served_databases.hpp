// Which databases billguard serves: every database that allows connections
// and is not a template, or only the one billguard.database names. The
// launcher lists them from pg_database (a shared catalog it reads without
// connecting to any database); dispatcher_state() says why the current
// database is not one of them.
#pragma once

#include <string>
#include <vector>

extern "C" {
#include "postgres.h"
}

namespace billguard {

struct DatabaseFacts {
  Oid oid = InvalidOid;
  std::string name;
  bool is_template = false;
  bool allows_connections = true;
  bool invalid = false;  // left behind by an interrupted DROP DATABASE
};

// Why billguard does not serve `database`, or "" when it does.
std::string NotServedReason(const DatabaseFacts& database);

// Every row of pg_database, read in a transaction of its own (the
// launcher, connected to no database).
std::vector<DatabaseFacts> ListDatabases();

// The current database's row, read in the caller's transaction.
DatabaseFacts CurrentDatabase();

}  // namespace billguard
