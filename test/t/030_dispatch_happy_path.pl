# The dispatcher end to end: 1,000 accounts, bill_period('2026-08'), every
# record completed with the emulator's id and exactly one successful charge
# per (customer, period) at the emulator; a second bill_period sends nothing.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator(latency_ms => 5);
my $node = BillguardNode->dispatching('happy', $emulator);
$node->add_accounts(1000);

is($node->safe_psql('postgres', "SELECT initiated FROM billguard.bill_period('2026-08')"), '1000',
	'bill_period initiates 1,000 billings');
ok($node->wait_until_settled('2026-08'), 'every record settles');

is($node->safe_psql('postgres',
	"SELECT string_agg(status || '=' || n, ',') FROM (SELECT status, count(*) n FROM billguard.billing_records GROUP BY 1) s"),
	'completed=1000', 'all 1,000 records completed');

my $by_key = charges_by_key($emulator);
is(scalar(keys %$by_key), 1000, 'the emulator holds charges for 1,000 distinct keys');
is(scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), 0, 'exactly one successful charge per key');

my %record_charge = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
	'SELECT idempotency_key || \'|\' || charge_id FROM billguard.billing_records');
is(scalar(grep { ($record_charge{$_} // '') ne $by_key->{$_}[0] } keys %$by_key), 0,
	"every record carries the emulator's charge id for its key");

# Claims come in batches (ahead of the free slots, at least a quarter of
# max_inflight = 32 at a time) and answers are recorded in batches: records
# of one transaction share its now().
cmp_ok($node->safe_psql('postgres', q{SELECT count(DISTINCT first_dispatched_at) FROM billguard.billing_records}),
	'<=', 125, 'the 1,000 records were claimed in at most 125 transactions');
cmp_ok($node->safe_psql('postgres', q{SELECT count(DISTINCT completed_at) FROM billguard.billing_records}),
	'<', 1000, 'their answers were recorded in fewer transactions than answers');

# What was sent: the stored key as Idempotency-Key, amounts and metadata.
my ($one) = grep { $_->{metadata}{customer_id} eq 'cust_000007' } @{ succeeded_charges($emulator) };
is($one->{idempotency_key}, $node->safe_psql('postgres', "SELECT billguard.idempotency_key('cust_000007', '2026-08')"),
	'the Idempotency-Key header is the content-hash key');
is($one->{amount}, 1007, 'amount in cents from the record');
is($one->{currency}, 'usd', 'currency');
is($one->{customer}, 'cus_000007', 'Stripe customer');
is($one->{metadata}{billing_period}, '2026-08', 'metadata[billing_period]');
is($one->{metadata}{billguard_key}, $one->{idempotency_key}, 'metadata[billguard_key]');

is($node->safe_psql('postgres', q{
	SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingCompleted'}), '1000',
	'one BillingCompleted per record');
is($node->safe_psql('postgres', q{
	SELECT count(DISTINCT event ->> 'request_id') FROM billguard.journal
	 WHERE event_type = 'BillingCompleted' AND event ->> 'request_id' ~ '^req_\w+$'}), '1000',
	"every BillingCompleted carries its answer's own Request-Id");
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM billguard.journal WHERE event_type = 'ChargeAttempted'}), '1000',
	'one attempt per record');
is($node->safe_psql('postgres', "SELECT billguard.entity_state('billing-cust_000007-2026-08') ->> 'status'"),
	'completed', 'entity state folds to completed');

# Billing the period again sends nothing.
my $sent = $emulator->stats->{requests};
is($node->safe_psql('postgres', "SELECT initiated || '/' || already_completed FROM billguard.bill_period('2026-08')"),
	'0/1000', 'the second bill_period initiates nothing');
sleep 1.5;
is($emulator->stats->{requests}, $sent, 'and no request reaches Stripe');
is(scalar(@{ succeeded_charges($emulator) }), 1000, 'still 1,000 charges');

my $status = $node->safe_psql('postgres',
	'SELECT worker_running, paused, in_flight, due, outstanding FROM billguard.dispatch_status');
is($status, 't|f|0|0|0', 'dispatch_status: running, not paused, nothing in flight or due');

$node->stop;
$emulator->stop;
done_testing();
