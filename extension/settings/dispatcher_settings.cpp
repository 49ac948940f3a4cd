// The settings a dispatcher runs with (see dispatcher_settings.hpp).
#include "settings/dispatcher_settings.hpp"

#include <map>
#include <string>
#include <vector>

#include "postgres/pg_boundary.hpp"
#include "postgres/pg_compat.hpp"
#include "postgres/spi_transaction.hpp"

extern "C" {
#include "access/xact.h"
#include "utils/guc.h"
#include "utils/guc_tables.h"
}

namespace billguard {

namespace {

// What the dispatcher sets itself, whoever set it before: it resolves names
// in pg_catalog only; it commits answers without waiting for the WAL flush
// (one lost in a crash is re-sent with the same key and replayed by Stripe,
// and a single-threaded worker must not pay a disk flush per charge; claims
// still flush, billguard.claim_due_records); it waits kLockTimeoutMs for a
// lock and no longer, runs statements of any length, in READ COMMITTED
// transactions, as the bootstrap superuser, with every trigger firing as on
// a primary.
struct OwnSetting {
  const char* name;
  const char* value;  // nullptr: kLockTimeoutMs
};
const OwnSetting kOwnSettings[] = {
    {"role", "none"},
    {"search_path", "pg_catalog, pg_temp"},
    {"synchronous_commit", "off"},
    {"lock_timeout", nullptr},
    {"statement_timeout", "0"},
    {"idle_in_transaction_session_timeout", "0"},
    {"default_transaction_isolation", "read committed"},
    {"session_replication_role", "origin"},
};

// The settings set for the database or the role, which the dispatcher
// takes from the server instead: everything the planner, its statements
// and its memory go by.
bool DependsOn(const config_generic& setting) {
  switch (setting.group) {
    case RESOURCES_MEM:
    case QUERY_TUNING_METHOD:
    case QUERY_TUNING_COST:
    case QUERY_TUNING_GEQO:
    case QUERY_TUNING_OTHER:
    case CLIENT_CONN_STATEMENT:
      return true;
    default:
      return false;
  }
}

bool SetForDatabaseOrRole(const config_generic& setting) {
  return setting.source == PGC_S_DATABASE || setting.source == PGC_S_USER ||
         setting.source == PGC_S_DATABASE_USER;
}

const OwnSetting* OwnValueOf(const char* name) {
  for (const OwnSetting& own : kOwnSettings) {
    if (pg_strcasecmp(own.name, name) == 0) return &own;
  }
  return nullptr;
}

// PostgreSQL's default of a setting, as text SetConfigOption reads.
std::string BootValue(config_generic* setting) {
  switch (setting->vartype) {
    case PGC_BOOL:
      return reinterpret_cast<config_bool*>(setting)->boot_val ? "on" : "off";
    case PGC_INT:
      return std::to_string(reinterpret_cast<config_int*>(setting)->boot_val);
    case PGC_REAL: {
      char text[64];
      snprintf(text, sizeof(text), "%.17g", reinterpret_cast<config_real*>(setting)->boot_val);
      return text;
    }
    case PGC_STRING: {
      const char* boot = reinterpret_cast<config_string*>(setting)->boot_val;
      return boot != nullptr ? boot : "";
    }
    case PGC_ENUM: {
      auto* enumerated = reinterpret_cast<config_enum*>(setting);
      return CallPostgres(
          [enumerated] { return config_enum_lookup_by_value(enumerated, enumerated->boot_val); });
    }
  }
  return "";
}

// The value postgresql.conf and ALTER SYSTEM give each setting they name,
// by lower-case name; the later line wins, as when the server reads them.
std::map<std::string, std::string> ServerFileValues() {
  std::map<std::string, std::string> values;
  for (const SqlRow& row : ExecuteInTransaction(
           "SELECT lower(name), setting FROM pg_catalog.pg_file_settings WHERE error IS NULL "
           "ORDER BY seqno",
           {})) {
    if (row[0] && row[1]) values[*row[0]] = *row[1];
  }
  return values;
}

std::string Lower(std::string text) {
  for (char& c : text) c = static_cast<char>(pg_tolower(static_cast<unsigned char>(c)));
  return text;
}

void Set(const std::string& name, const std::string& value) {
  CallPostgres([&] { SetConfigOption(name.c_str(), value.c_str(), PGC_SUSET, PGC_S_SESSION); });
}

void Log(const std::string& message) {
  CallPostgres([&] { ereport(LOG, (errmsg("billguard dispatcher: %s", message.c_str()))); });
}

// The settings taken from the server rather than the database or role:
// after a reload they take the server's new values.
std::vector<std::string> taken_from_server;

void TakeServerValues(const std::map<std::string, std::string>& file) {
  for (const std::string& name : taken_from_server) {
    const auto found = file.find(Lower(name));
    std::string value;
    if (found != file.end()) {
      value = found->second;
    } else {
      config_generic* setting = nullptr;
      int count = 0;
      config_generic** all = compat::GucVariables(&count);
      for (int i = 0; i < count && setting == nullptr; ++i) {
        if (strcmp(all[i]->name, name.c_str()) == 0) setting = all[i];
      }
      if (setting == nullptr) continue;
      value = BootValue(setting);
    }
    Set(name, value);
  }
}

}  // namespace

void TakeDispatcherSettings(bool log) {
  // Before any statement: a role without access to billguard's schema, or
  // a statement_timeout of a millisecond, would fail the first one.
  struct Ignored {
    std::string name;
    std::string value;
  };
  std::vector<Ignored> ignored;
  int count = 0;
  config_generic** all = compat::GucVariables(&count);
  for (int i = 0; i < count; ++i) {
    config_generic& setting = *all[i];
    if (!SetForDatabaseOrRole(setting)) continue;
    if (OwnValueOf(setting.name) == nullptr && !DependsOn(setting)) continue;
    const char* current =
        CallPostgres([&] { return GetConfigOptionByName(setting.name, nullptr, false); });
    ignored.push_back({setting.name, current != nullptr ? current : ""});
    if (OwnValueOf(setting.name) == nullptr) taken_from_server.push_back(setting.name);
  }
  for (const OwnSetting& own : kOwnSettings)
    Set(own.name, own.value != nullptr ? own.value : std::to_string(kLockTimeoutMs));
  TakeServerValues(ServerFileValues());
  for (const Ignored& setting : ignored) {
    if (!log) break;
    // A read-only database is a fence the dispatcher honours (ReadOnlyFence).
    if (setting.name == "default_transaction_read_only") continue;
    const char* now =
        CallPostgres([&] { return GetConfigOptionByName(setting.name.c_str(), nullptr, false); });
    Log("ignores " + setting.name + " = '" + setting.value +
        "', set for this database or its role (ALTER DATABASE or ALTER ROLE ... SET): it runs "
        "with '" +
        (now != nullptr ? now : "") + "'");
  }
}

void RetakeDispatcherSettings() {
  if (!taken_from_server.empty()) TakeServerValues(ServerFileValues());
}

std::string ReadOnlyFence() {
  if (DefaultXactReadOnly)
    return "the server is read-only (default_transaction_read_only = on): waiting until it is not";
  // The most specific setting wins, as when a session connects: the role's
  // in this database, the role's, the database's.
  const std::vector<SqlRow> rows = ExecuteInTransaction(R"(
SELECT substr(c, length('default_transaction_read_only=') + 1)::boolean
  FROM pg_catalog.pg_db_role_setting s, unnest(s.setconfig) c,
       (SELECT d.oid AS database FROM pg_catalog.pg_database d
         WHERE d.datname = current_database()) me,
       (SELECT r.oid AS role FROM pg_catalog.pg_roles r WHERE r.rolname = session_user) who
 WHERE split_part(c, '=', 1) = 'default_transaction_read_only'
   AND s.setdatabase IN (0, me.database) AND s.setrole IN (0, who.role)
   AND (s.setdatabase, s.setrole) <> (0, 0)
 ORDER BY s.setdatabase <> 0 AND s.setrole <> 0 DESC, s.setrole <> 0 DESC
 LIMIT 1)",
                                                        {});
  if (rows.empty() || !rows[0][0] || *rows[0][0] != "t") return "";
  return "this database is read-only (ALTER DATABASE or ALTER ROLE ... SET "
         "default_transaction_read_only = on): waiting until it is not";
}

}  // namespace billguard
