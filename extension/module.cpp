// Module initialisation: settings and, when preloaded, shared memory and the
// background workers.
#include "module.hpp"

#include <cstring>

#include "shared_state.hpp"

extern "C" {
#include "postgres.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

PG_MODULE_MAGIC;
void _PG_init(void);
}

namespace billguard::settings {
char* key_namespace = nullptr;
int snapshot_every = 100;
}

namespace {

// The namespace is part of every key: ':' would make keys ambiguous and an
// empty one would break compatibility with the seed's "akka-billing".
bool CheckKeyNamespace(char** newval, void** /*extra*/, GucSource /*source*/) {
  if (*newval == nullptr || (*newval)[0] == '\0') {
    GUC_check_errdetail("billguard.key_namespace must not be empty.");
    return false;
  }
  if (std::strchr(*newval, ':') != nullptr) {
    GUC_check_errdetail("billguard.key_namespace must not contain ':'.");
    return false;
  }
  return true;
}

void DefineSettings() {
  // SUSET: a session that could change the namespace could mint a second key
  // for a billing that already has one.
  DefineCustomStringVariable(
      "billguard.key_namespace", "Namespace hashed into every idempotency key.",
      "Keys are sha256(customer_id:billing_period:namespace); changing it changes all new keys.",
      &billguard::settings::key_namespace, "akka-billing", PGC_SUSET, 0, CheckKeyNamespace,
      nullptr, nullptr);
  // Read by billguard.append_event(); billing entities rarely reach it, the
  // scheduler entity does after years of periods.
  DefineCustomIntVariable("billguard.snapshot_every",
                          "Save a snapshot of an entity every this many appended events (0 = never).",
                          nullptr, &billguard::settings::snapshot_every, 100, 0, 1000000, PGC_SUSET,
                          0, nullptr, nullptr, nullptr);
}

}  // namespace

extern "C" void _PG_init(void) {
  if (IsBinaryUpgrade) return;
  DefineSettings();
  MarkGUCPrefixReserved("billguard");
  if (process_shared_preload_libraries_in_progress) billguard::InstallSharedState();
}
