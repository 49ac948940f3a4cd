# pg_dump and pg_restore keep every row, so a restore loses no billing
# history. A database with a
# currency a user added, accounts in it, a built-in currency a user changed
# (its minor units, or Stripe's minimum), usage-only and connected
# accounts with period amounts (claimed, frozen, below the minimum, not
# claimed yet), completed, failed, cancelled and pending records, journal
# events and snapshots is dumped with pg_dump -Fc and restored with pg_restore into a
# new database, where CREATE EXTENSION comes from the dump. Then:
#   - pg_restore reports no error;
#   - every row of every table of the extension arrived, unchanged, and the
#     built-in currencies are there once; billguard.installation, which
#     names the database that installed billguard, is the restored
#     database's own (it is never dumped), and billguard.billing_installations
#     holds the original's installation besides it;
#   - bill_period of the period already billed initiates nothing there, and
#     bill_customer answers from the restored records.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardNode;

my $node = BillguardNode->preloaded('dump_restore');
$node->q1(q{
	INSERT INTO billguard.currencies (code, minor_units) VALUES ('xts', 2), ('xag', 0);
	UPDATE billguard.currencies SET minor_units = 2 WHERE code = 'isk';
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method, active) VALUES
	  ('cust_x1', 'cus_x1', 1000, 'xts', 'pm_card_visa', true),
	  ('cust_x2', 'cus_x2', 2000, 'xts', 'pm_card_visa', true),
	  ('cust_x3', 'cus_x3', 3000, 'xts', NULL, true),
	  ('cust_ag', 'cus_ag', 40, 'xag', NULL, true),
	  ('cust_isk', 'cus_isk', 50000, 'isk', NULL, true),
	  ('cust_usd', 'cus_usd', 4900, 'usd', 'pm_card_visa', true),
	  ('cust_gone', 'cus_gone', 990, 'usd', NULL, false)});
$node->q1(q{
	UPDATE billguard.currencies SET min_charge_units = 100 WHERE code = 'chf';
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, stripe_account, application_fee_cents)
	VALUES ('cust_use', 'cus_use', NULL, 'usd', 'acct_1Dump', 30), ('cust_tiny', 'cus_tiny', NULL, 'chf', NULL, NULL);
	INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, description, metadata) VALUES
	  ('cust_use', '2026-08', 12345, 'eur', 'August usage', '{"plan": "usage"}'),
	  ('cust_tiny', '2026-08', 99, 'chf', NULL, '{}'),
	  ('cust_use', '2026-10', 777, 'usd', 'October, metered early', '{}')});
is($node->q1("SELECT initiated || '/' || below_minimum FROM billguard.bill_period('2026-08')"), '7/1',
	'2026-08: seven records claimed, one below the minimum');
$node->q1(q{
	UPDATE billguard.billing_records
	   SET status = CASE WHEN customer_id = 'cust_ag' THEN 'failed' ELSE 'completed' END,
	       charge_id = CASE WHEN customer_id <> 'cust_ag' THEN 'pi_' || customer_id END,
	       attempts = 1, first_dispatched_at = now(), completed_at = now(),
	       last_error = CASE WHEN customer_id = 'cust_ag' THEN '402 card_error/card_declined: declined' END
	 WHERE billing_period = '2026-08' AND customer_id NOT IN ('cust_usd', 'cust_tiny')});
$node->q1(q{
	SELECT billguard.append_billing_event(customer_id, billing_period,
	         CASE status WHEN 'completed' THEN 'BillingCompleted' ELSE 'BillingFailed' END,
	         jsonb_build_object('charge_id', charge_id, 'attempt', 1))
	  FROM billguard.billing_records WHERE billing_period = '2026-08' AND customer_id NOT IN ('cust_usd', 'cust_tiny')});
is($node->q1("SELECT billguard.cancel_record('cust_usd', '2026-08')"), 'cancelled', 'one record cancelled');
is($node->q1("SELECT status FROM billguard.bill_customer('cust_x1', '2026-09', 'req-dump')"), 'initiated',
	'one record pending for 2026-09');
$node->q1(q{
	SELECT billguard.save_snapshot('billing-scheduler');
	SELECT billguard.save_snapshot('billing-cust_x1-2026-08');
	SELECT billguard.apply_retention('billing-cust_x1-2026-08', 1)});

# Every row of every table of the extension, as text in a stable order.
my @tables = split /\n/, $node->q1(q{
	SELECT c.relname FROM pg_class c JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid
	 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'billguard') AND d.deptype = 'e'
	   AND c.relkind = 'r' AND c.relname NOT IN ('installation', 'billing_installations') ORDER BY 1});
ok((grep { $_ eq 'currencies' } @tables) && (grep { $_ eq 'billing_records' } @tables),
	'the tables of the extension: ' . join(', ', @tables));
sub rows_of {
	my ($database, $table) = @_;
	return $node->safe_psql($database,
		"SELECT count(*) || E'\\n' || coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '') FROM billguard.$table t");
}
my %before = map { ($_ => rows_of('postgres', $_)) } @tables;

my $dump = $node->basedir . '/billing.dump';
my ($out, $err) = run_command([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ]);
is($err, '', 'pg_dump -Fc reports nothing');
$node->q1('CREATE DATABASE restored');
($out, $err) = run_command([ 'pg_restore', '-d', $node->connstr('restored'), $dump ]);
is($err, '', 'pg_restore into a new database reports no error');

for my $table (@tables) {
	is(rows_of('restored', $table), $before{$table}, "every row of billguard.$table arrived");
}
is($node->safe_psql('restored', 'SELECT database_name FROM billguard.installation'), 'restored',
	'billguard.installation names the restored database, not the original');
is($node->safe_psql('restored', q{SELECT string_agg(database_name || ' ' || how, ', ' ORDER BY began_at)
	FROM billguard.billing_installations}), 'postgres installed, restored installed',
	'billguard.billing_installations holds the original installation, and the restored one');
is($node->safe_psql('restored', q{SELECT i.installation_id FROM billguard.billing_installations i
	WHERE i.database_name = 'postgres'}), $node->q1('SELECT installation_id FROM billguard.installation'),
	'the original installation, by its id');
is($node->safe_psql('restored', q{SELECT string_agg(code || '=' || minor_units, ' ' ORDER BY code)
	FROM billguard.currencies WHERE NOT builtin}), 'chf=2 isk=2 xag=0 xts=2',
	'the currencies users added, and the built-in one they changed, are theirs there too');
is($node->safe_psql('restored', 'SELECT count(*) - count(DISTINCT code) FROM billguard.currencies'), '0',
	'no currency is there twice');
is($node->safe_psql('restored', q{SELECT count(*) FROM billguard.accounts WHERE currency = 'xts'}), '3',
	'the three accounts in the added currency are there');

is($node->safe_psql('restored', q{
	SELECT initiated || ' ' || already_completed || ' ' || failed || ' ' || cancelled
	  FROM billguard.bill_period('2026-08')}), '0 5 1 1',
	'bill_period of the billed period initiates nothing in the restored database');
is($node->safe_psql('restored', q{SELECT status || ' ' || charge_id FROM billguard.bill_customer('cust_x2', '2026-08')}),
	'already_completed pi_cust_x2', 'bill_customer answers from the restored record');
is($node->safe_psql('restored', q{SELECT status FROM billguard.bill_customer('cust_x1', '2026-09')}),
	'in_progress', 'the pending record of 2026-09 is not claimed again');
is($node->safe_psql('restored', q{SELECT count(*) FROM billguard.billing_records}),
	$node->q1(q{SELECT count(*) FROM billguard.billing_records}), 'and no record was added');
is($node->safe_psql('restored', q{SELECT min_charge_units FROM billguard.currencies WHERE code = 'chf'}), '100',
	'the changed minimum is there');
is($node->safe_psql('restored', q{SELECT amount_cents || ' ' || currency || ' ' || description || ' ' || stripe_account
	FROM billguard.billing_records WHERE customer_id = 'cust_use' AND billing_period = '2026-08'}),
	'12345 eur August usage acct_1Dump', 'the record keeps the period amount and the connected account it froze');
$node->psql('restored', q{UPDATE billguard.period_amounts SET amount_cents = 1
	WHERE customer_id = 'cust_use' AND billing_period = '2026-08'}, stderr => \my $frozen_err);
like($frozen_err, qr/is frozen: billing record [0-9a-f]{32} claimed it and is completed/,
	'the restored period amount is frozen by its restored record');
is($node->safe_psql('restored', q{SELECT status || ' ' || idempotency_key FROM billguard.bill_customer('cust_use', '2026-10')}),
	'initiated ' . $node->key_of('cust_use', '2026-10'), 'the period amount not claimed before the dump is billed there');

$node->stop;
done_testing();
