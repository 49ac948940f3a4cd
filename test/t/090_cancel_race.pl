# Cancelling while the dispatcher sends must never withdraw a record that
# may have reached Stripe: 900 accounts are
# billed for a period while the running dispatcher claims and sends them,
# paced, and at the same time one session cancels a third of the records one
# by one with cancel_record and another deactivates a third of the accounts
# one by one, each in its own transaction, from the end of the period while
# the dispatcher works from its start. Afterwards:
#   - the race met: some cancellations and deactivations came first, some
#     found the record already claimed and were refused (or left it alone);
#   - no cancelled record reached the emulator at all;
#   - every record that is not cancelled was charged exactly once, with the
#     record carrying that charge;
#   - every refusal was the 22023 "may already have charged" one, and every
#     cancellation journaled one BillingCancelled with its reason.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator(latency_ms => 20);
# Paced at 100/s, the period takes 9 s to send; few requests in flight keep
# the dispatcher from claiming far ahead of what it sends.
my $node = BillguardNode->dispatching('cancel_race', $emulator, 'billguard.max_requests_per_second = 100',
	'billguard.max_inflight = 4');
$node->add_accounts(900);
$node->q1(q{
	CREATE TABLE t090_targets AS
	SELECT customer_id, CASE substr(customer_id, 6)::int % 3 WHEN 0 THEN 'cancel' WHEN 1 THEN 'deactivate' END AS how
	  FROM billguard.accounts;
	CREATE TABLE t090_outcome (customer_id text PRIMARY KEY, outcome text NOT NULL)});

# Both sessions wait at the gate and work from the end of the period.
my $gate = $node->start_gate;
my $canceller = $node->race_psql(q{
	DO $$
	DECLARE
	  c text;
	  outcome text;
	BEGIN
	  FOR c IN SELECT customer_id FROM t090_targets WHERE how = 'cancel' ORDER BY customer_id DESC LOOP
	    BEGIN
	      outcome := billguard.cancel_record(c, '2026-08');
	    EXCEPTION WHEN invalid_parameter_value THEN
	      outcome := 'refused: ' || SQLERRM;
	    END;
	    INSERT INTO t090_outcome VALUES (c, outcome);
	    COMMIT;
	  END LOOP;
	END $$});
my $deactivator = $node->race_psql(q{
	DO $$
	DECLARE
	  c text;
	BEGIN
	  FOR c IN SELECT customer_id FROM t090_targets WHERE how = 'deactivate' ORDER BY customer_id DESC LOOP
	    UPDATE billguard.accounts SET active = false WHERE customer_id = c;
	    COMMIT;
	  END LOOP;
	END $$});

is($node->q1("SELECT initiated FROM billguard.bill_period('2026-08')"), '900', 'bill_period initiates 900 billings');
ok(wait_until('the dispatcher to claim records of both sets', 60, sub {
	$node->q1(q{
		SELECT count(DISTINCT t.how) FROM billguard.billing_records r JOIN t090_targets t USING (customer_id)
		 WHERE r.first_dispatched_at IS NOT NULL AND t.how IS NOT NULL}) eq '2' }),
	'the dispatcher is sending when the cancellations start');
$node->release_gate($gate, 2);
finish_race($canceller, $deactivator);
is($canceller->{exit}, 0, 'the cancelling session ran to its end') or diag($canceller->{err});
is($deactivator->{exit}, 0, 'the deactivating session ran to its end') or diag($deactivator->{err});
ok($node->wait_until_settled('2026-08'), 'every record of the period settles');

# The race met.
my %outcomes = %{ $node->outcome_counts('t090_outcome', 'outcome') };
note(sprintf('cancel_record: %d cancelled, %d refused', $outcomes{cancelled} // 0, $outcomes{refused} // 0));
cmp_ok($outcomes{cancelled} // 0, '>', 0, 'some cancel_record calls came before the dispatcher');
cmp_ok($outcomes{refused} // 0, '>', 0, 'some found their record already claimed and were refused');
is(($outcomes{cancelled} // 0) + ($outcomes{refused} // 0), 300, 'each of the 300 cancel_record calls answered');
is($node->q1(q{
	SELECT count(*) FROM t090_outcome
	 WHERE outcome LIKE 'refused:%' AND outcome !~ '^refused: billing record \S+ cannot be cancelled: it is \S+ .*so it may already have charged the customer$'}),
	'0', 'every refusal is the one that says the record may already have charged the customer');
my %deactivated = map { split /\|/ } split /\n/, $node->q1(q{
	SELECT r.status || '|' || count(*) FROM billguard.billing_records r JOIN t090_targets t USING (customer_id)
	 WHERE t.how = 'deactivate' GROUP BY r.status});
note(sprintf('deactivation: %d cancelled, %d completed', $deactivated{cancelled} // 0, $deactivated{completed} // 0));
cmp_ok($deactivated{cancelled} // 0, '>', 0, 'some deactivations came before the dispatcher and cancelled the record');
cmp_ok($deactivated{completed} // 0, '>', 0, 'some came after the claim, and those records went on');
is($node->q1(q{SELECT count(*) FROM t090_outcome o JOIN billguard.billing_records r USING (customer_id)
	WHERE (o.outcome = 'cancelled') <> (r.status = 'cancelled')}), '0',
	'cancel_record answered cancelled exactly for the records that are cancelled');

# What reached the emulator.
my %status_of_key = map { split /\|/ } split /\n/, $node->q1(q{
	SELECT idempotency_key || '|' || status FROM billguard.billing_records WHERE billing_period = '2026-08'});
my @cancelled = grep { $status_of_key{$_} eq 'cancelled' } keys %status_of_key;
my @others = grep { $status_of_key{$_} ne 'cancelled' } keys %status_of_key;
is(scalar(@cancelled) + scalar(@others), 900, '900 records');
my %ledger_keys;
for my $object (@{ $emulator->ledger }) {
	$ledger_keys{ $object->{metadata}{billguard_key} // '' }++;
	$ledger_keys{ $object->{idempotency_key} // '' }++;
}
is(scalar(grep { $ledger_keys{$_} } @cancelled), 0, 'no cancelled record reached the emulator');
is(scalar(grep { $status_of_key{$_} ne 'completed' } @others), 0, 'every record that is not cancelled is completed');
my $by_key = charges_by_key($emulator);
is(scalar(grep { @{ $by_key->{$_} // [] } != 1 } @others), 0, 'every record that is not cancelled was charged exactly once');
is(scalar(grep { !exists $status_of_key{$_} } keys %$by_key), 0, 'no charge carries a key without a record');
is($node->q1(q{
	SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2026-08' AND status = 'completed'
	   AND charge_id IS NULL}), '0', 'every completed record carries its charge');

# The journal.
is($node->q1(q{
	SELECT count(*) FROM billguard.billing_records r
	 WHERE r.status = 'cancelled'
	   AND (SELECT count(*) FROM billguard.journal j
	         WHERE j.persistence_id = 'billing-' || r.customer_id || '-2026-08' AND j.event_type = 'BillingCancelled') <> 1}),
	'0', 'every cancelled record has exactly one BillingCancelled event');
is($node->q1(q{
	SELECT string_agg(DISTINCT t.how || '=' || (j.event ->> 'reason'), ', ')
	  FROM billguard.journal j JOIN t090_targets t ON j.persistence_id = 'billing-' || t.customer_id || '-2026-08'
	 WHERE j.event_type = 'BillingCancelled'}),
	'cancel=cancel_record, deactivate=account deactivated', 'each event gives its reason');
is($node->q1(q{SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingCancelled'}),
	scalar(@cancelled), 'no event for a record that was not cancelled');
is($node->q1("SELECT already_completed + cancelled FROM billguard.bill_period('2026-08')"), '900',
	'bill_period counts the period as 900 completed or cancelled records');

$node->stop;
$emulator->stop;
done_testing();
