# Updating a database that holds billing history, from each released
# version, with ALTER EXTENSION billguard UPDATE: 0.1.0 -> 0.2.0 and on to
# the version under development in a second update, 0.2.0 (created so) ->
# the version under development, and 0.1.0 -> the version under development
# in one update. After each update:
#   - the schema is exactly the schema of a fresh install of the version it
#     reached (pg_dump --schema-only --binary-upgrade, which dumps the
#     extension's objects, compared with OIDs masked; configuration tables
#     compared as a set);
#   - every row of every table is still there, unchanged (by the columns
#     the table had), except that the update from 0.1.0 takes the records
#     0.1.0 settled (completed, failed, needs_review) out of the dispatch
#     queue: their next_attempt_at is NULL;
#   - the dispatcher (already the library under development) waits, and
#     says so, while the database is at an older version, and is kept from
#     sending while rows are compared; then it sends what was claimed before
#     the update, and a new period: one charge per key at the emulator. The
#     scheduler's 0.1.0 snapshot (state version 1) is upcast when folded.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use DatabaseContents;

# ---- what a database holds before it is updated -------------------------------------

# What a database of 0.1.0 holds, with what 0.1.0's dispatcher would have
# left behind (written by hand, as no 0.1.0 library runs): 2026-06 settled
# (completed, one failed, one needs_review) with journal events and a
# snapshot, 2026-07 claimed and not sent, one claim for 2026-08, and the
# scheduler's snapshot of state version 1.
sub history_of_0_1_0 {
	my ($node) = @_;
	$node->add_accounts(30);
	$node->q1(q{
		INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method, active)
		VALUES ('cust_eur', 'cus_eur', 2500, 'eur', 'pm_card_visa', true),
		       ('cust_gone', 'cus_gone', 990, 'usd', NULL, false)});
	is($node->q1("SELECT initiated FROM billguard.bill_period('2026-06')"), '31', '0.1.0: 2026-06 claimed');
	settle_by_hand($node, '2026-06');
	$node->q1("SELECT billguard.save_snapshot('billing-cust_000003-2026-06')");
	is($node->q1("SELECT initiated FROM billguard.bill_period('2026-07')"), '31', '0.1.0: 2026-07 claimed, not yet sent');
	$node->q1("SELECT billguard.save_snapshot('billing-scheduler')");
	is($node->q1("SELECT status FROM billguard.bill_customer('cust_000005', '2026-08', 'req-upgrade')"), 'initiated',
		'0.1.0: one customer claimed for 2026-08');
}

# The period's records as a dispatcher settles them: failed, needs_review
# and completed, with their journal events. $settled_queue: what the
# release's dispatcher leaves in next_attempt_at of a settled record (0.1.0
# its due time, 0.2.0 NULL).
sub settle_by_hand {
	my ($node, $period, $settled_queue) = @_;
	$node->q1(qq{
		UPDATE billguard.billing_records
		   SET status = CASE WHEN customer_id = 'cust_000001' THEN 'failed'
		                     WHEN customer_id = 'cust_000002' THEN 'needs_review' ELSE 'completed' END,
		       charge_id = CASE WHEN customer_id IN ('cust_000001', 'cust_000002') THEN NULL
		                        ELSE 'pi_old_' || customer_id END,
		       attempts = 1, first_dispatched_at = now() - interval '40 days',
		       completed_at = now() - interval '40 days',
		       last_error = CASE WHEN customer_id = 'cust_000001' THEN '402 card_error/card_declined: declined' END
		       @{[ $settled_queue ? ", next_attempt_at = $settled_queue" : '' ]}
		 WHERE billing_period = '$period'});
	$node->q1(qq{
		SELECT billguard.append_billing_event(customer_id, billing_period,
		         CASE status WHEN 'completed' THEN 'BillingCompleted' WHEN 'failed' THEN 'BillingFailed' ELSE 'NeedsReview' END,
		         jsonb_build_object('charge_id', charge_id, 'attempt', 1))
		  FROM billguard.billing_records WHERE billing_period = '$period'});
}

# What 0.2.0 adds to a database's history: a cancelled record, the
# spend-cap ledger (a budget, a key, a settled and a reserved charge, their
# audit), the dispatcher's vault key, an applied Stripe event.
sub ledger_of_0_2_0 {
	my ($node) = @_;
	is($node->q1("SELECT billguard.cancel_record('cust_000030', '2026-07')"), 'cancelled',
		'0.2.0: one record of 2026-07 cancelled');
	$node->add_vault_ledger('2026-07', q{
		SELECT billguard.store_vault_credential('http://127.0.0.1:9/', '2026-07', 'usd', k.key_id, k.vault_key, 50000)
		  FROM k;
		INSERT INTO billguard.stripe_events (event_id, event_type, object_id, customer_id, billing_period,
		                                     idempotency_key, effect, stripe_created_at)
		SELECT 'evt_upgrade', 'payment_intent.succeeded', charge_id, customer_id, billing_period,
		       idempotency_key, 'confirmed', now() - interval '39 days'
		  FROM billguard.billing_records WHERE customer_id = 'cust_000003' AND billing_period = '2026-06'});
	is($node->q1(q{SELECT settled_cents || '/' || reserved_cents FROM billguard.vault_spend WHERE billing_period = '2026-07'}),
		'1000/2000', '0.2.0: the ledger holds a settled and a reserved charge');
}

# ---- what an update must keep -----------------------------------------------------------

# The update from 0.1.0 takes the records 0.1.0 settled out of the dispatch
# queue; every other value is kept.
my %settled_leave_the_queue = (billing_records => sub {
	$_[0] =~ s/\bnext_attempt_at\b/CASE WHEN status IN ('pending', 'dispatching', 'unknown') THEN next_attempt_at END AS next_attempt_at/r });

# ---- the same schema as a fresh install -------------------------------------------------

# The database postgres, updated to $version, is a fresh install of it.
sub same_as_fresh {
	my ($node, $version) = @_;
	is($node->q1("SELECT extversion FROM pg_extension WHERE extname = 'billguard'"), $version,
		"ALTER EXTENSION billguard UPDATE reaches $version");
	my $fresh = 'fresh_' . ($version =~ tr/./_/r);
	$node->q1("CREATE DATABASE $fresh");
	$node->safe_psql($fresh, "CREATE EXTENSION billguard VERSION '$version'");
	same_schema($node, 'postgres', $fresh, "updated to $version");
}

# ---- the dispatcher ------------------------------------------------------------------

# The dispatcher of a library newer than the schema calls none of its
# functions: it waits for the update and says which versions it sees.
sub dispatcher_waits {
	my ($node, $emulator, $version, $library) = @_;
	ok(wait_until('the dispatcher to report it waits for the update', 20, sub {
		($node->q1('SELECT pause_reason FROM billguard.dispatch_status') // '')
		  =~ /^waiting for ALTER EXTENSION billguard UPDATE: the database has \Q$version\E, the library is \Q$library\E$/ }),
		"$version: the dispatcher waits for ALTER EXTENSION billguard UPDATE, and says so")
	  or diag('pause_reason: ' . ($node->q1('SELECT pause_reason FROM billguard.dispatch_status') // 'NULL'));
	is($node->q1(q{SELECT count(*) FROM billguard.billing_records WHERE status = 'dispatching'}), '0',
		"$version: nothing was claimed for sending");
	is($emulator->stats->{requests} // 0, 0, "$version: no request reached the emulator");
}

# Once the API key is back, the records claimed before the update are sent,
# and a new period; exactly one charge per key, carried by its record.
sub sends_what_was_claimed {
	my ($node, $emulator, $key_file, $claimed, $history) = @_;
	$node->reload_with(api_key_file => $key_file);
	ok($node->wait_until_settled($_), "$_, claimed before the update, is sent after it") for @$claimed;
	is($node->q1("SELECT initiated FROM billguard.bill_period('2026-09')"), '31', 'after the update: 2026-09 claimed');
	ok($node->wait_until_settled('2026-09'), 'after the update: 2026-09 settles');
	is($node->q1(q{SELECT string_agg(billing_period || ' ' || status || '=' || n, ', ') FROM
		(SELECT billing_period, status, count(*) n FROM billguard.billing_records GROUP BY 1, 2 ORDER BY 1, 2) s}),
		$history, 'every record sent after the update is completed; the settled history is as it was');
	my $by_key = charges_by_key($emulator);
	my $sent = $node->q1(q{SELECT count(*) FROM billguard.billing_records WHERE charge_id NOT LIKE 'pi_old_%'});
	is(scalar(keys %$by_key), $sent, "the emulator holds charges for the $sent keys sent");
	is(scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), 0, 'exactly one successful charge per key');
	my %record_charge = map { split /\|/ } split /\n/, $node->q1(q{
		SELECT idempotency_key || '|' || charge_id FROM billguard.billing_records WHERE charge_id NOT LIKE 'pi_old_%'});
	is(scalar(grep { ($record_charge{$_} // '') ne $by_key->{$_}[0] } keys %$by_key), 0,
		"every record sent after the update carries the emulator's charge id for its key");
}

# The scheduler's 0.1.0 snapshot (state version 1) is upcast when folded,
# with the events after it.
sub scheduler_state_upcast {
	my ($node) = @_;
	is($node->q1(q{SELECT state_version FROM billguard.snapshots WHERE persistence_id = 'billing-scheduler'}), '1',
		'the scheduler entity has its 0.1.0 snapshot, of state version 1');
	is($node->q1(q{SELECT billguard.entity_state('billing-scheduler') ->> 'last_issued_period'}), '2026-07',
		'folding it upcasts it: the last period issued is the greatest of its issued periods');
}

# A node and its emulator, the extension created at $version, the API key
# file withheld: the dispatcher sends nothing until sends_what_was_claimed.
sub upgrade_node {
	my ($name, $version) = @_;
	my $emulator = start_emulator();
	my $node = BillguardNode->dispatching($name, $emulator, { extension_version => $version });
	is($node->q1("SELECT extversion FROM pg_extension WHERE extname = 'billguard'"), $version,
		"the database starts at the released $version");
	my $key_file = $node->q1('SHOW billguard.api_key_file');
	$node->reload_with(api_key_file => '');
	return ($node, $emulator, $key_file);
}

my $development;

# ---- 0.1.0 -> 0.2.0, then -> the version under development ------------------------------

{
	my ($node, $emulator, $key_file) = upgrade_node('from_0_1_0_in_two', '0.1.0');
	$development = $node->q1("SELECT default_version FROM pg_available_extensions WHERE name = 'billguard'");
	isnt($development, '0.2.0', "the version under development, $development, follows the release 0.2.0");
	history_of_0_1_0($node);
	dispatcher_waits($node, $emulator, '0.1.0', $development);
	my $before = table_rows($node, 'postgres', %settled_leave_the_queue);
	$node->q1("ALTER EXTENSION billguard UPDATE TO '0.2.0'");
	rows_intact($node, 'postgres', $before, '0.1.0 -> 0.2.0');
	same_as_fresh($node, '0.2.0');
	dispatcher_waits($node, $emulator, '0.2.0', $development);

	ledger_of_0_2_0($node);
	$before = table_rows($node, 'postgres');
	$node->q1('ALTER EXTENSION billguard UPDATE');
	rows_intact($node, 'postgres', $before, "0.2.0 -> $development");
	same_as_fresh($node, $development);
	scheduler_state_upcast($node);
	sends_what_was_claimed($node, $emulator, $key_file, [ '2026-07', '2026-08' ],
		'2026-06 completed=29, 2026-06 failed=1, 2026-06 needs_review=1, 2026-07 cancelled=1, '
		  . '2026-07 completed=30, 2026-08 completed=1, 2026-09 completed=31');
	$node->stop;
	$emulator->stop;
}

# ---- a database created at 0.2.0 -> the version under development -------------------------

{
	my ($node, $emulator, $key_file) = upgrade_node('from_0_2_0', '0.2.0');
	$node->add_accounts(30);
	$node->q1(q{
		INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method, active)
		VALUES ('cust_eur', 'cus_eur', 2500, 'eur', 'pm_card_visa', true)});
	is($node->q1("SELECT initiated FROM billguard.bill_period('2026-06')"), '31', '0.2.0: 2026-06 claimed');
	settle_by_hand($node, '2026-06', 'NULL');
	$node->q1("SELECT billguard.save_snapshot('billing-cust_000003-2026-06')");
	is($node->q1("SELECT initiated FROM billguard.bill_period('2026-07')"), '31', '0.2.0: 2026-07 claimed, not yet sent');
	$node->q1("SELECT billguard.save_snapshot('billing-scheduler')");
	ledger_of_0_2_0($node);
	dispatcher_waits($node, $emulator, '0.2.0', $development);
	my $before = table_rows($node, 'postgres');
	$node->q1('ALTER EXTENSION billguard UPDATE');
	rows_intact($node, 'postgres', $before, "0.2.0 -> $development");
	same_as_fresh($node, $development);
	sends_what_was_claimed($node, $emulator, $key_file, ['2026-07'],
		'2026-06 completed=29, 2026-06 failed=1, 2026-06 needs_review=1, 2026-07 cancelled=1, '
		  . '2026-07 completed=30, 2026-09 completed=31');
	$node->stop;
	$emulator->stop;
}

# ---- 0.1.0 -> the version under development, in one update --------------------------------

{
	my ($node, $emulator, $key_file) = upgrade_node('from_0_1_0_in_one', '0.1.0');
	history_of_0_1_0($node);
	dispatcher_waits($node, $emulator, '0.1.0', $development);
	my $before = table_rows($node, 'postgres', %settled_leave_the_queue);
	$node->q1('ALTER EXTENSION billguard UPDATE');
	rows_intact($node, 'postgres', $before, "0.1.0 -> $development");
	same_as_fresh($node, $development);
	scheduler_state_upcast($node);
	sends_what_was_claimed($node, $emulator, $key_file, [ '2026-07', '2026-08' ],
		'2026-06 completed=29, 2026-06 failed=1, 2026-06 needs_review=1, 2026-07 completed=31, '
		  . '2026-08 completed=1, 2026-09 completed=31');
	is($node->q1(q{SELECT billguard.entity_state('billing-scheduler') -> 'issued_periods'}), '["2026-06", "2026-07", "2026-09"]',
		'the periods issued before and after the update, folded from the 0.1.0 snapshot and the events after it');
	$node->stop;
	$emulator->stop;
}

done_testing();
