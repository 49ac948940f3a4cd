# Schema evolution: billing-scheduler's latest snapshot is of an older
# state version and lacks the issued periods (the seed's snapshot written
# before issuedPeriods existed), for a period already billed and charged.
# The scheduler's guard, the folded state, then says the period was never
# issued; the tick runs bill_period, and billing_records decides: nothing
# is claimed or charged, and the dispatcher logs the inconsistency.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

my $accounts = 25;
my $emulator = start_emulator();
my $node = BillguardNode->dispatching('scheduler_stale_snapshot', $emulator);
$node->add_accounts($accounts);

my $offset = set_scheduler($node, auto_bill => 'monthly', scheduler_now => '2031-05-01 00:00:05+00');
like(wait_for_tick($node, $offset), qr/billed 2031-04 /, 'the scheduler bills 2031-04');
billed_once($node, $emulator, 'billed', '2031-04', $accounts);
my $charges_before = $node->q1(q{SELECT string_agg(customer_id || '=' || charge_id, ',' ORDER BY customer_id)
	FROM billguard.billing_records WHERE billing_period = '2031-04'});
my $created = $emulator->stats->{created};

# The older snapshot at the head of billing-scheduler, covering its tick.
$node->q1(q{
	INSERT INTO billguard.snapshots (persistence_id, seq_nr, state, state_version)
	VALUES ('billing-scheduler', billguard.highest_seq_nr('billing-scheduler'),
	        '{"entity": "billing-scheduler", "last_event_type": "BillingTickIssued"}', 1)});
is($node->q1(q{SELECT (billguard.entity_state('billing-scheduler') -> 'issued_periods') ? '2031-04'}), 'f',
	'the folded state, from the upcast version 1 snapshot, does not list 2031-04 as issued');

$offset = set_scheduler($node, scheduler_now => '2031-05-01 00:10:00+00');
like(wait_for_tick($node, $offset),
	qr/billing-scheduler's state does not list 2031-04 \(due 2031-05-01 00:00 UTC\) as issued, yet billing_records held all $accounts of its records: nothing was claimed \(billing_records decides/,
	'the tick logs the inconsistency');
like(slurp_file($node->logfile), qr/WARNING:  billguard scheduler: billing-scheduler's state does not list 2031-04/,
	'as a WARNING');
is($node->records_of('2031-04'), $accounts, 'still one record per account for 2031-04');
is($node->q1(q{SELECT string_agg(customer_id || '=' || charge_id, ',' ORDER BY customer_id)
	FROM billguard.billing_records WHERE billing_period = '2031-04'}), $charges_before,
	'every record is completed with its original charge');
is($node->q1(q{SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2031-04' AND status <> 'completed'}),
	'0', 'no record is queued again');
is($emulator->stats->{created}, $created, 'nothing was charged: the emulator created nothing');
my ($wrong) = charged_once_each($node, $emulator, '2031-04');
is($wrong, '', 'one succeeded charge per key at the emulator');

is($node->ticks_issued('2031-04'), '2', 'the tick re-issued 2031-04 in the journal, after the snapshot');
$offset = -s $node->logfile;
$node->restart;
like(wait_for_tick($node, $offset), qr/2031-04 \(due 2031-05-01 00:00 UTC\) was issued already/,
	'after a restart the folded state lists 2031-04 again');

$node->stop;
$emulator->stop;
done_testing();
