# Upgrading from the released 0.1.0. A database created with 0.1.0 and
# holding billing history (completed, failed, pending records, journal,
# snapshots) is updated with ALTER EXTENSION billguard UPDATE:
#   - its schema is then exactly the schema of a fresh install (pg_dump
#     --schema-only --binary-upgrade, which dumps the extension's objects,
#     compared with OIDs masked; configuration tables compared as a set);
#   - every row it held is still there, unchanged, except that its settled
#     records (completed, failed, needs_review) have left the dispatch
#     queue: their next_attempt_at is NULL; the scheduler's 0.1.0 snapshot
#     (state version 1) is upcast when folded;
#   - the dispatcher (already the new library) waits while the database is
#     at 0.1.0 (and is kept from sending while rows are compared), then
#     bills on the updated schema: the pending records of
#     0.1.0 and a new period, one charge per key at the emulator.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use DispatchScenario;

my $emulator = start_emulator();
my $node = dispatch_node('upgrade', $emulator, { extension_version => '0.1.0' });
is(q1($node, "SELECT extversion FROM pg_extension WHERE extname = 'billguard'"), '0.1.0',
	'the database starts at the released 0.1.0');

# ---- history written under 0.1.0 --------------------------------------------------

add_accounts($node, 30);
q1($node, q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method, active)
	VALUES ('cust_eur', 'cus_eur', 2500, 'eur', 'pm_card_visa', true),
	       ('cust_gone', 'cus_gone', 990, 'usd', NULL, false)});
is(q1($node, "SELECT initiated FROM billguard.bill_period('2026-06')"), '31', '0.1.0: 2026-06 claimed');
# What the 0.1.0 dispatcher would have left behind: completed, failed and
# needs_review records with their journal events (written here by hand, as
# no 0.1.0 library runs).
q1($node, q{
	UPDATE billguard.billing_records
	   SET status = CASE WHEN customer_id = 'cust_000001' THEN 'failed'
	                     WHEN customer_id = 'cust_000002' THEN 'needs_review' ELSE 'completed' END,
	       charge_id = CASE WHEN customer_id IN ('cust_000001', 'cust_000002') THEN NULL
	                        ELSE 'pi_old_' || customer_id END,
	       attempts = 1, first_dispatched_at = now() - interval '40 days',
	       completed_at = now() - interval '40 days',
	       last_error = CASE WHEN customer_id = 'cust_000001' THEN '402 card_error/card_declined: declined' END
	 WHERE billing_period = '2026-06'});
q1($node, q{
	SELECT billguard.append_billing_event(customer_id, billing_period,
	         CASE status WHEN 'completed' THEN 'BillingCompleted' WHEN 'failed' THEN 'BillingFailed' ELSE 'NeedsReview' END,
	         jsonb_build_object('charge_id', charge_id, 'attempt', 1))
	  FROM billguard.billing_records WHERE billing_period = '2026-06'});
q1($node, "SELECT billguard.save_snapshot('billing-cust_000003-2026-06')");
is(q1($node, "SELECT initiated FROM billguard.bill_period('2026-07')"), '31', '0.1.0: 2026-07 claimed, not yet sent');
q1($node, "SELECT billguard.save_snapshot('billing-scheduler')");
is(q1($node, "SELECT status FROM billguard.bill_customer('cust_000005', '2026-08', 'req-upgrade')"), 'initiated',
	'0.1.0: one customer claimed for 2026-08');

# The new library's dispatcher does not touch a 0.1.0 schema.
ok(wait_for('the dispatcher to report it waits for the update', 20, sub {
	q1($node, 'SELECT pause_reason FROM billguard.dispatch_status') =~ /ALTER EXTENSION billguard UPDATE/ }),
	'0.1.0: the dispatcher waits for ALTER EXTENSION billguard UPDATE, and says so');
is(q1($node, q{SELECT count(*) FROM billguard.billing_records WHERE status <> 'pending' AND billing_period > '2026-06'}), '0',
	'0.1.0: nothing of 2026-07 or 2026-08 was claimed for sending');
is($emulator->stats->{requests} // 0, 0, '0.1.0: no request reached the emulator');

# Every row of every table as text, in key order, by the columns 0.1.0 had.
my %columns;
for my $table (qw(accounts currencies billing_records journal snapshots)) {
	$columns{$table} = q1($node, qq{
		SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
		 WHERE attrelid = 'billguard.$table'::regclass AND attnum > 0 AND NOT attisdropped});
}
sub table_rows {
	my ($table, $select) = @_;
	$select //= $columns{$table};
	return q1($node, "SELECT string_agg(t::text, E'\\n' ORDER BY t::text) FROM (SELECT $select FROM billguard.$table) t");
}
my %before = map { ($_ => table_rows($_)) } keys %columns;
# What the update makes of billing_records: a settled record leaves the
# dispatch queue, every other value is kept.
$before{billing_records} = table_rows('billing_records', $columns{billing_records} =~ s/\bnext_attempt_at\b/CASE WHEN status IN ('pending', 'dispatching', 'unknown') THEN next_attempt_at END AS next_attempt_at/r);

# ---- the update ---------------------------------------------------------------------

# Without an API key the dispatcher sends nothing, so every row stays as it
# was while the update runs and is compared.
my $key_file = q1($node, 'SHOW billguard.api_key_file');
reload_with($node, api_key_file => '');
q1($node, 'ALTER EXTENSION billguard UPDATE');
is(q1($node, "SELECT extversion FROM pg_extension WHERE extname = 'billguard'"), '0.2.0',
	'ALTER EXTENSION billguard UPDATE reaches 0.2.0');
for my $table (sort keys %columns) {
	is(table_rows($table), $before{$table}, "every row of billguard.$table is intact");
}

# ---- the same schema as a fresh install ---------------------------------------------

q1($node, 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION billguard');

# pg_dump leaves an extension's objects out of a plain dump; the binary
# upgrade mode includes them. Masked: OIDs and transaction ids it
# preserves, the per-run \restrict key and the configuration table list (compared below as a set).
sub schema_of {
	my ($database) = @_;
	my ($dump, $errors) = run_command(
		[ 'pg_dump', '--schema-only', '--binary-upgrade', '-d', $node->connstr($database) ]);
	die "pg_dump $database: $errors" if $errors;
	return join("\n", map {
		s/binary_upgrade_create_empty_extension\(.*\);/binary_upgrade_create_empty_extension(...);/r
		  =~ s/relfrozenxid = '\d+', relminmxid = '\d+'/relfrozenxid = ?, relminmxid = ?/r
		  =~ s/WHERE oid = '\d+'/WHERE oid = ?/r
	} grep { !/binary_upgrade_set_next_|^\\(un)?restrict / } split /\n/, $dump);
}
my ($updated, $fresh) = (schema_of('postgres'), schema_of('fresh'));
cmp_ok(length($fresh), '>', 10000, 'the dump holds the extension\'s objects');
my $same = is($updated, $fresh, 'the updated schema is the fresh schema');
diag(first_difference($updated, $fresh)) unless $same;

my $config_tables = q{
	SELECT string_agg(c::regclass::text || ' ' || coalesce(w, ''), ', ' ORDER BY c::regclass::text)
	  FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS u (c, w) WHERE e.extname = 'billguard'};
is(q1($node, $config_tables), $node->safe_psql('fresh', $config_tables),
	'the same tables are dumped with their data, with the same conditions');

# The first lines where two dumps differ, for the diagnostics.
sub first_difference {
	my ($a, $b) = @_;
	my @a = split /\n/, $a;
	my @b = split /\n/, $b;
	my $i = 0;
	$i++ while $i < @a && $i < @b && $a[$i] eq $b[$i];
	my $from = $i > 5 ? $i - 5 : 0;
	return "first difference at line $i:\n--- updated\n" . join("\n", @a[$from .. ($i + 10 < $#a ? $i + 10 : $#a)])
	  . "\n--- fresh\n" . join("\n", @b[$from .. ($i + 10 < $#b ? $i + 10 : $#b)]);
}

# ---- the dispatcher works on the updated schema -------------------------------------

# The scheduler's 0.1.0 snapshot (state version 1) is upcast when folded.
is(q1($node, q{SELECT state_version FROM billguard.snapshots WHERE persistence_id = 'billing-scheduler'}), '1',
	'the scheduler entity has its 0.1.0 snapshot, of state version 1');
is(q1($node, q{SELECT billguard.entity_state('billing-scheduler') ->> 'last_issued_period'}), '2026-07',
	'folding it upcasts it: the last period issued is the greatest of its issued periods');

reload_with($node, api_key_file => $key_file);

ok(wait_until_settled($node, '2026-07'), 'the records claimed under 0.1.0 are sent after the update');
is(q1($node, "SELECT initiated FROM billguard.bill_period('2026-09')"), '31', '0.2.0: 2026-09 claimed');
ok(wait_until_settled($node, '2026-09'), '0.2.0: 2026-09 settles');
ok(wait_until_settled($node, '2026-08'), '0.2.0: the single 2026-08 claim settles');
is(q1($node, q{SELECT string_agg(billing_period || ' ' || status || '=' || n, ', ') FROM
	(SELECT billing_period, status, count(*) n FROM billguard.billing_records GROUP BY 1, 2 ORDER BY 1, 2) s}),
	'2026-06 completed=29, 2026-06 failed=1, 2026-06 needs_review=1, 2026-07 completed=31, '
	  . '2026-08 completed=1, 2026-09 completed=31',
	'every record sent after the update is completed; the history of 2026-06 is as it was');
is(q1($node, q{SELECT billguard.entity_state('billing-scheduler') -> 'issued_periods'}), '["2026-06", "2026-07", "2026-09"]',
	'the periods issued before and after the update, folded from the 0.1.0 snapshot and the events after it');
my $by_key = charges_by_key($emulator);
is(scalar(keys %$by_key), 63, 'the emulator holds charges for 63 keys');
is(scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), 0, 'exactly one successful charge per key');
my %record_charge = map { split /\|/ } split /\n/, q1($node, q{
	SELECT idempotency_key || '|' || charge_id FROM billguard.billing_records WHERE billing_period > '2026-06'});
is(scalar(grep { ($record_charge{$_} // '') ne $by_key->{$_}[0] } keys %$by_key), 0,
	"every record sent after the update carries the emulator's charge id for its key");

$node->stop;
$emulator->stop;
done_testing();
