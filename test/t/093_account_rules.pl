# The accounts rules of 0.2.0 meet data written under 0.1.0, and databases
# that are not UTF8:
#   - ALTER EXTENSION billguard UPDATE refuses, naming them, accounts above
#     Stripe's largest charge, then accounts whose ids are look-alikes, and
#     each refusal changes nothing; once they are corrected the update runs;
#   - a record claimed under 0.1.0 for 9,223,372,036,854,775,000 cents is
#     history: kept, and period_status sums its period in numeric;
#   - EXECUTE grants users gave on bill_period and period_status, which the
#     update replaces, still work after it and survive pg_dump and
#     pg_restore (they are the users' grants, not the extension's own);
#   - in a LATIN1 database a customer id is printable ASCII.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardNode;

my $node = BillguardNode->preloaded('account_rules', { extension_version => '0.1.0' });
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES
	  ('cust_1', 'cus_1', 1000), (E'cust_1\u00A0', 'cus_1', 1000), (E'cust_1\u2003', 'cus_1', 1000),
	  (E'\u3000cust_1', 'cus_1', 1000), ('cust_big', 'cus_big', 9223372036854775000), ('cust_2', 'cus_2', 2000);
	CREATE ROLE billing_app NOLOGIN;
	GRANT USAGE ON SCHEMA billguard TO billing_app;
	GRANT EXECUTE ON FUNCTION billguard.bill_period(text), billguard.bill_customer(text, text, text),
	  billguard.period_status(text) TO billing_app});
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-08')"), '6',
	'0.1.0 bills the look-alikes and the huge amount: 6 records');
is($node->q1("SELECT count(*) FROM billguard.billing_records WHERE stripe_customer = 'cus_1'"), '4',
	'0.1.0: one Stripe customer has four records in one period');

# Every row of the extension's tables, to show a refused update changed nothing.
sub state_of {
	return $node->q1(q{
		SELECT (SELECT extversion FROM pg_extension WHERE extname = 'billguard') || E'\n'
		    || (SELECT string_agg(t::text, E'\n' ORDER BY t::text) FROM billguard.accounts t) || E'\n'
		    || (SELECT string_agg(t::text, E'\n' ORDER BY t::text) FROM billguard.billing_records t) || E'\n'
		    || (SELECT string_agg(t::text, E'\n' ORDER BY t::text) FROM billguard.currencies t) || E'\n'
		    || (SELECT count(*) FROM billguard.journal)});
}
my $before = state_of();

my ($rc, $out, $err) = $node->psql('postgres', 'ALTER EXTENSION billguard UPDATE');
like($err, qr/ERROR:  billguard 0\.2\.0 caps accounts\.amount_cents at 99999999, Stripe's largest charge; these accounts exceed it: 'cust_big' \(9223372036854775000\)/,
	'the update refuses an account above the cap, naming it and its amount');
like($err, qr/HINT:  Correct their amount_cents/, 'and says what to do');
is(state_of(), $before, 'the refused update changed nothing');

$node->q1("UPDATE billguard.accounts SET amount_cents = 5000 WHERE customer_id = 'cust_big'");
$before = state_of();
($rc, $out, $err) = $node->psql('postgres', 'ALTER EXTENSION billguard UPDATE');
my ($listed) = $err =~ /ERROR:  billguard 0\.2\.0 refuses customer ids that are not NFC or begin or end with white space or an invisible character; these accounts have one: (.*)$/m;
is(join(' ', sort split /, /, $listed // ''), q{'<U+3000>cust_1' 'cust_1<U+00A0>' 'cust_1<U+2003>'},
	'then it refuses the look-alike ids, naming each with its invisible characters spelled out');
like($err, qr/HINT:  Give them the id they show/, 'and says what to do');
is(state_of(), $before, 'that refused update changed nothing either');

$node->q1("DELETE FROM billguard.accounts WHERE customer_id <> btrim(customer_id, E' \\u00A0\\u2003\\u3000')");
($rc, $out, $err) = $node->psql('postgres', 'ALTER EXTENSION billguard UPDATE');
is($rc, 0, 'with the accounts corrected, the update runs') or diag($err);
is($node->q1("SELECT extversion FROM pg_extension WHERE extname = 'billguard'"),
	$node->q1("SELECT default_version FROM pg_available_extensions WHERE name = 'billguard'"),
	'the database is at the version under development');

is($node->q1(q{SELECT amount_cents FROM billguard.billing_records WHERE customer_id = 'cust_big'}),
	'9223372036854775000', 'the record claimed for 9,223,372,036,854,775,000 cents is kept as it was');
is($node->q1(q{SELECT sum(count) || ' ' || sum(amount_cents) FROM billguard.period_status('2026-08')}),
	'6 9223372036854781000', 'period_status sums its period in numeric, above the largest bigint');

# Grants on the replaced functions.
is($node->q1(q{SET ROLE billing_app; SELECT initiated || ' ' || in_progress || ' ' || cancelled
	FROM billguard.bill_period('2026-08')}), '0 6 0', 'billing_app still calls bill_period after the update');
is($node->q1(q{SET ROLE billing_app; SELECT amount_cents FROM billguard.period_status('2026-08') WHERE status = 'pending'}),
	'9223372036854781000', 'and period_status');
is($node->q1(q{
	SELECT count(*) FROM pg_init_privs i, aclexplode(i.initprivs) a
	 WHERE i.objoid IN ('billguard.bill_period(text)'::regprocedure, 'billguard.period_status(text)'::regprocedure)
	   AND a.grantee = 'billing_app'::regrole}), '0',
	'the grants are billing_app\'s own, not the extension\'s initial privileges');
my $dump = $node->basedir . '/updated.dump';
run_command([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ]);
$node->q1('CREATE DATABASE restored');
($out, $err) = run_command([ 'pg_restore', '-d', $node->connstr('restored'), $dump ]);
is($err, '', 'the updated database restores without error');
is($node->safe_psql('restored', q{SET ROLE billing_app; SELECT count(*) FROM billguard.period_status('2026-08')}), '9',
	'billing_app calls period_status in the restored database: its grant was dumped');

# A database that is not UTF8.
$node->q1(q{CREATE DATABASE latin TEMPLATE template0 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C'});
$node->safe_psql('latin', 'CREATE EXTENSION billguard');
($rc, $out, $err) = $node->psql('latin', q{SET client_encoding = 'UTF8';
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES (E'cust_\u00E9', 'cus_e', 1000)});
like($err, qr/violates check constraint "accounts_customer_id_valid"/, 'LATIN1: an id with a letter outside ASCII is refused');
($rc, $out, $err) = $node->psql('latin', q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('cust_1 ', 'cus_1', 1000)});
like($err, qr/violates check constraint "accounts_customer_id_valid"/, 'LATIN1: a trailing blank is refused');
($rc, $out, $err) = $node->psql('latin', q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('cust_1', 'cus_1', 1000)});
is($rc, 0, 'LATIN1: a printable ASCII id is accepted') or diag($err);

$node->stop;
done_testing();
