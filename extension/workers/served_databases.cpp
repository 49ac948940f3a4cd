// Which databases billguard serves (see served_databases.hpp).
#include "postgres/pg_boundary.hpp"
#include "workers/served_databases.hpp"

#include "settings/settings.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
}

namespace billguard {

namespace {

// Copied out of a pg_database tuple; no C++ object is alive around it, so
// the catalog calls may raise.
struct RawFacts {
  Oid oid;
  NameData name;
  bool is_template;
  bool allows_connections;
  bool invalid;
};

RawFacts ToRaw(HeapTuple tuple) {
  const Form_pg_database row = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
  return {row->oid, row->datname, row->datistemplate, row->datallowconn,
          database_is_invalid_form(row)};
}

DatabaseFacts FromRaw(const RawFacts& raw) {
  DatabaseFacts facts;
  facts.oid = raw.oid;
  facts.name = NameStr(raw.name);
  facts.is_template = raw.is_template;
  facts.allows_connections = raw.allows_connections;
  facts.invalid = raw.invalid;
  return facts;
}

}  // namespace

std::string NotServedReason(const DatabaseFacts& database) {
  const std::string only = settings::database;
  if (!only.empty() && only != database.name)
    return "billguard.database is \"" + only + "\": only that database is served";
  // A connection to a template would make CREATE DATABASE ... TEMPLATE fail.
  if (database.is_template) return "it is a template database";
  if (!database.allows_connections) return "it does not allow connections";
  if (database.invalid) return "it is invalid (an interrupted DROP DATABASE)";
  return "";
}

std::vector<DatabaseFacts> ListDatabases() {
  std::vector<RawFacts> raw;
  CallPostgres([&] {
    StartTransactionCommand();
    // heap_getnext needs a snapshot to read the catalog safely.
    PushActiveSnapshot(GetTransactionSnapshot());
    Relation relation = table_open(DatabaseRelationId, AccessShareLock);
    TableScanDesc scan = table_beginscan_catalog(relation, 0, nullptr);
    HeapTuple tuple;
    while (HeapTupleIsValid(tuple = heap_getnext(scan, ForwardScanDirection)))
      raw.push_back(ToRaw(tuple));
    table_endscan(scan);
    table_close(relation, AccessShareLock);
    PopActiveSnapshot();
    CommitTransactionCommand();
  });
  std::vector<DatabaseFacts> databases;
  for (const RawFacts& r : raw) databases.push_back(FromRaw(r));
  return databases;
}

DatabaseFacts CurrentDatabase() {
  const RawFacts raw = CallPostgres([] {
    HeapTuple tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(MyDatabaseId));
    if (!HeapTupleIsValid(tuple)) elog(ERROR, "cache lookup failed for database %u", MyDatabaseId);
    const RawFacts facts = ToRaw(tuple);
    ReleaseSysCache(tuple);
    return facts;
  });
  return FromRaw(raw);
}

}  // namespace billguard
