# billguard.accounts kept in sync by a subscription: a CRM publishes its
# customers (a plain table billguard.accounts on a second server, no
# billguard there), the billing server subscribes. The apply worker runs
# with session_replication_role = replica, in which ordinary triggers do not
# fire; billguard's account triggers fire always.
#   - 10 accounts replicated, 2026-08 billed: 10 charges;
#   - the CRM renames a billed account: the apply worker is refused (the
#     same 23001 as a session), the subscription retries and stalls, the
#     account keeps its id, and bill_period('2026-08') again charges no one
#     (before: the renamed account was a new customer, charged a second
#     time); a later change of the CRM waits behind the refused one;
#   - the way out docs/operations.md gives: rename it back at the CRM and skip the
#     refused transaction (ALTER SUBSCRIPTION ... SKIP, its LSN from the
#     log): the later change arrives;
#   - the CRM deletes a billed account and adds it again under a new id, in
#     one transaction: refused as well, 2026-08 charges no one;
#   - the CRM deactivates an account with a billing never sent: its record
#     is cancelled (accounts_deactivated fires for the apply worker too);
#   - the CRM truncates its table: refused.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;

my $accounts = 10;
my $emulator = start_emulator();

my $crm = BillguardNode->new('crm');
$crm->init(allows_streaming => 'logical');
$crm->start;
$crm->safe_psql('postgres', 'CREATE DATABASE crm');
$crm->safe_psql('crm', qq{
	CREATE SCHEMA billguard;
	CREATE TABLE billguard.accounts (
	  customer_id text PRIMARY KEY, stripe_customer text NOT NULL, amount_cents bigint NOT NULL,
	  currency text NOT NULL DEFAULT 'usd', payment_method text, active boolean NOT NULL DEFAULT true);
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, payment_method)
	SELECT 'cust_' || lpad(g::text, 6, '0'), 'cus_' || lpad(g::text, 6, '0'), 1000 + g, 'pm_card_visa'
	  FROM generate_series(1, $accounts) g;
	CREATE PUBLICATION crm_accounts FOR TABLE billguard.accounts});
sub at_crm { my ($sql) = @_; return $crm->safe_psql('crm', $sql) }

my $node = BillguardNode->dispatching('replicated_accounts', $emulator);
my $crm_connstr = $crm->connstr('crm') =~ s/'/''/gr;
$node->q1("CREATE SUBSCRIPTION crm CONNECTION '$crm_connstr' PUBLICATION crm_accounts");
ok(wait_until('the accounts to be copied', 60, sub { $node->q1('SELECT count(*) FROM billguard.accounts') eq $accounts }),
	"the subscription copied the CRM's $accounts accounts");

is($node->q1("SELECT initiated FROM billguard.bill_period('2026-08')"), $accounts, '2026-08 claimed for every account');
ok($node->wait_until_settled('2026-08'), '2026-08 settles');
is(scalar(@{ succeeded_charges($emulator) }), $accounts, "$accounts charges");

# The apply worker's refusals since byte $offset of the log, and the LSN at
# which the last refused transaction finishes.
sub refusals {
	my ($offset) = @_;
	my $log = substr(slurp_file($node->logfile), $offset);
	my @lsn = $log =~ /finished at ([0-9A-F]+\/[0-9A-F]+)/g;
	return ($log, $lsn[-1]);
}
# ALTER SUBSCRIPTION ... SKIP the refused transaction, again whenever the
# apply worker cleared it, until it says it skipped it: a worker that,
# restarted, first receives another transaction clears the skip-LSN with a
# WARNING (17 resends one that changed nothing here), and the operator's
# way out is to set it again.
sub skip_refused {
	my ($lsn, $offset) = @_;
	return wait_until("the apply worker to skip $lsn", 60, sub {
		return 1 if substr(slurp_file($node->logfile), $offset) =~ /completed skipping transaction at LSN \Q$lsn\E/;
		$node->q1("ALTER SUBSCRIPTION crm SKIP (lsn = '$lsn')")
		  if $node->q1(q{SELECT subskiplsn = '0/0' FROM pg_subscription WHERE subname = 'crm'}) eq 't';
		return 0;
	});
}
sub apply_errors {
	return $node->q1(q{SELECT apply_error_count FROM pg_stat_subscription_stats WHERE subname = 'crm'});
}

# ---- a rename ------------------------------------------------------------------------------

my $offset = -s $node->logfile;
my $errors = apply_errors();
at_crm(q{UPDATE billguard.accounts SET customer_id = 'cust_000001_renamed' WHERE customer_id = 'cust_000001'});
ok(wait_until('the apply worker to be refused', 60, sub {
	(refusals($offset))[0] =~ /ERROR:  account 'cust_000001' has billing records: its customer_id never changes/ }),
	'the apply worker is refused the rename, with the reason');
ok(wait_until('the refusal counted', 30, sub { apply_errors() > $errors }),
	'pg_stat_subscription_stats counts the apply error');
is($node->q1(q{SELECT string_agg(customer_id, ',') FROM billguard.accounts WHERE customer_id LIKE 'cust_000001%'}),
	'cust_000001', 'the account keeps its id');
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-08')"), '0', 'bill_period(2026-08) again claims nothing');
at_crm(q{UPDATE billguard.accounts SET amount_cents = 4242 WHERE customer_id = 'cust_000003'});
sleep 2;
isnt($node->q1(q{SELECT amount_cents FROM billguard.accounts WHERE customer_id = 'cust_000003'}), '4242',
	"the CRM's later change waits behind the refused transaction: replication stalls");

# ---- the way out: undo at the source, skip the refused transaction ---------------------------

at_crm(q{UPDATE billguard.accounts SET customer_id = 'cust_000001' WHERE customer_id = 'cust_000001_renamed'});
my (undef, $lsn) = refusals($offset);
ok(defined $lsn, "the log names the refused transaction's LSN") or diag((refusals($offset))[0]);
ok(skip_refused($lsn, $offset), 'ALTER SUBSCRIPTION ... SKIP skips the refused transaction') if defined $lsn;
ok(wait_until('the later change', 60, sub {
	$node->q1(q{SELECT amount_cents FROM billguard.accounts WHERE customer_id = 'cust_000003'}) eq '4242' }),
	'after ALTER SUBSCRIPTION ... SKIP the later change arrives');
is($node->q1(q{SELECT count(*) FROM billguard.accounts WHERE customer_id = 'cust_000001'}), '1',
	'and cust_000001 is still there, under its id');

# ---- a delete and a new id for the same customer ---------------------------------------------

$offset = -s $node->logfile;
at_crm(q{BEGIN;
	DELETE FROM billguard.accounts WHERE customer_id = 'cust_000002';
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, payment_method)
	VALUES ('cust_000002_again', 'cus_000002', 1002, 'pm_card_visa');
	COMMIT});
ok(wait_until('the apply worker to be refused', 60, sub {
	(refusals($offset))[0] =~ /ERROR:  account 'cust_000002' has billing records: it is never deleted/ }),
	'the apply worker is refused the delete');
is($node->q1(q{SELECT string_agg(customer_id, ',' ORDER BY customer_id) FROM billguard.accounts WHERE stripe_customer = 'cus_000002'}),
	'cust_000002', 'the account is still there, and no second one for its Stripe customer');
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-08')"), '0', 'bill_period(2026-08) again claims nothing');
(undef, $lsn) = refusals($offset);
at_crm(q{UPDATE billguard.accounts SET customer_id = 'cust_000002' WHERE customer_id = 'cust_000002_again'});
ok(skip_refused($lsn, $offset), 'ALTER SUBSCRIPTION ... SKIP skips the refused delete') if defined $lsn;

# ---- a deactivation cancels the billing never sent -----------------------------------------------

$node->reload_with(api_key_file => $node->basedir . '/missing.key');
ok(wait_until('the dispatcher to pause', 20, sub { $node->q1('SELECT paused FROM billguard.dispatch_status') eq 't' }),
	'the dispatcher is paused: nothing is sent');
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-09')"), $accounts, '2026-09 claimed, not sent');
at_crm(q{UPDATE billguard.accounts SET active = false WHERE customer_id = 'cust_000004'});
ok(wait_until('the deactivation', 60, sub {
	$node->q1(q{SELECT active FROM billguard.accounts WHERE customer_id = 'cust_000004'}) eq 'f' }),
	'the deactivation is replicated (the stalled transactions were skipped)');
is($node->status_of('cust_000004', '2026-09'), 'cancelled', "the deactivated account's unsent record is cancelled");
is($node->event_types('cust_000004', '2026-09'), 'BillingInitiated,BillingCancelled', 'with a BillingCancelled event');
$node->reload_with(api_key_file => $node->basedir . '/stripe.key');
ok($node->wait_until_settled('2026-09'), '2026-09 settles');

# ---- a truncate ----------------------------------------------------------------------------------------

$offset = -s $node->logfile;
at_crm('TRUNCATE billguard.accounts');
ok(wait_until('the apply worker to be refused', 60, sub {
	(refusals($offset))[0] =~ /ERROR:  billguard.accounts cannot be truncated: \d+ accounts have billing records/ }),
	'the apply worker is refused the truncate');
is($node->q1('SELECT count(*) FROM billguard.accounts'), $accounts, 'every account is still there');

# ---- what was charged -----------------------------------------------------------------------------------

my %by_customer;
$by_customer{ "$_->{customer}" . '/' . ($_->{metadata}{billing_period} // '') }++ for @{ succeeded_charges($emulator) };
is(join(',', grep { $by_customer{$_} > 1 } sort keys %by_customer), '',
	'no Stripe customer was charged twice for a period');
is($by_customer{'cus_000001/2026-08'}, 1, 'cus_000001 once for 2026-08');
is(scalar(grep { m{/2026-08$} } keys %by_customer), $accounts, "$accounts customers charged for 2026-08");
is(scalar(grep { m{/2026-09$} } keys %by_customer), $accounts - 1, 'and 9 for 2026-09 (one deactivated)');

$node->stop;
$crm->stop;
$emulator->stop;
done_testing();
