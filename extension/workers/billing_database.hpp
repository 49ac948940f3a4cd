// Whether this database is the one that bills its history.
//
// A template copy (CREATE DATABASE ... TEMPLATE) and a pg_restore into a
// new database hold billing history that another database bills: sending
// what they hold, or billing a period by their scheduler, would charge
// customers the original charges, or has deactivated, once more. A
// promoted standby and a pg_upgrade'd cluster are the same database, and
// bill on. billguard tells them apart by billguard.installation, which
// CREATE EXTENSION writes with the database's OID and pg_dump never
// carries, and billguard.billing_installations, which pg_dump carries:
// every installation that billed this history (sql/install/12_billing_database.sql).
// A database whose history is another's waits until an operator adopts it
// (billguard.adopt_database()).
#pragma once

#include <string>

namespace billguard {

// Why this database bills nothing ("" when it is the billing database):
// billguard.billing_database_problem(), in a transaction of its own.
std::string BillingDatabaseProblem();

// Whether the database has an account or a billing record, in a
// transaction of its own.
bool HasCustomers();

// Registers the namespace this database bills with (when `bills`) and
// answers why it must not ("" when it may): another served database of
// this cluster, created earlier, bills with the same billguard.key_namespace,
// and the two would share every idempotency key at Stripe.
std::string KeyNamespaceConflict(bool bills);

// Around CREATE EXTENSION billguard (the ProcessUtility hook): whether the
// session restores a dump. pg_dump's output, which pg_restore and psql run,
// turns check_function_bodies off before it creates anything; pg_restore
// names itself in application_name. The install script asks
// billguard.created_by_restore() (0 = no).
void NoteCreateExtensionSession();
void ForgetCreateExtensionSession();

}  // namespace billguard
