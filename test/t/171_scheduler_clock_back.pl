# A clock stepped back. An earlier system billed 2031-07 (with the same
# content-hash keys, long pruned by Stripe, and no billguard metadata a
# search could find). auto_bill is turned on: at 2031-09-01 00:30 the
# scheduler bills 2031-08. Then the clock steps back an hour, to 2031-08-31
# 23:30, where the calendar says 2031-07 is the most recent due period,
# never issued in this database. The scheduler never bills a period older
# than one it issued once its month had ended, whatever the clock says now:
# 2031-07 is not billed (a WARNING says why), nothing is claimed or sent,
# and due_periods() lists nothing. Before, it billed 2031-07 again: 20
# charges for 10 customers. When the clock comes back, 2031-08 is issued
# already, and 2031-09 is billed on time.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

my $accounts = 10;
my $emulator = start_emulator(idempotency_ttl => 1);
my $node = BillguardNode->dispatching('scheduler_clock_back', $emulator);
$node->add_accounts($accounts);

# ---- the earlier system's charges for 2031-07 --------------------------------------------

my @customers = map { sprintf('cust_%06d', $_) } 1 .. $accounts;
my %july_key = map { ($_ => $node->key_of($_, '2031-07')) } @customers;
for my $n (1 .. $accounts) {
	my $customer = $customers[ $n - 1 ];
	my $charged = $emulator->post_form('/v1/payment_intents',
		StripeEmulatorHarness::payment_intent_params(customer => sprintf('cus_%06d', $n), amount => 1000 + $n % 500),
		idempotency_key => $july_key{$customer});
	die "the earlier system's charge failed: $charged->{status}" unless $charged->{status} == 200;
}
sleep 1.5;    # Stripe has forgotten those keys
sub july_charges {
	my %keys = map { ($_ => 1) } values %july_key;
	return scalar(grep { $keys{ $_->{idempotency_key} // '' } } @{ succeeded_charges($emulator) });
}
is(july_charges(), $accounts, "the earlier system charged each of the $accounts customers once for 2031-07");

# ---- the scheduler bills 2031-08 ----------------------------------------------------------

my $offset = set_scheduler($node, auto_bill => 'monthly', bill_day => 1, scheduler_now => '2031-09-01 00:30:00+00');
like(wait_for_tick($node, $offset), qr/billed 2031-08 \(due 2031-09-01 00:00 UTC\): $accounts records claimed/,
	'at 2031-09-01 00:30 the scheduler bills 2031-08');
billed_once($node, $emulator, 'on time', '2031-08', $accounts);
my $created = $emulator->stats->{created};

# ---- the clock steps back an hour ----------------------------------------------------------

$offset = set_scheduler($node, scheduler_now => '2031-08-31 23:30:00+00');
like(wait_for_tick($node, $offset),
	qr/2031-07 \(due 2031-08-01 00:00 UTC\) is not billed: a later period was issued already, and the scheduler never goes back to a period it passed \(bill_day or bill_hour_utc moved later, or the clock went back/,
	'at 2031-08-31 23:30 the calendar says 2031-07, which the scheduler does not bill');
like(substr(slurp_file($node->logfile), $offset), qr/WARNING:  billguard scheduler: 2031-07 \(due 2031-08-01 00:00 UTC\) is not billed/,
	'it says so as a WARNING');
is($node->records_of('2031-07'), '0', 'no record was claimed for 2031-07');
is($node->ticks_issued('2031-07'), '0', 'nor was 2031-07 issued');
sleep 1;
is($emulator->stats->{created}, $created, 'the emulator created nothing');
is(july_charges(), $accounts, "still $accounts charges for 2031-07, not " . 2 * $accounts);
is($node->q1(q{SELECT string_agg(billing_period || ':' || scheduled || ':' || issued_early, ',')
	FROM billguard.due_periods()}), '2031-08:false:true',
	'due_periods() lists only 2031-08, issued before its month ended by the clock now, and nothing to bill');
is($node->q1('SELECT missed_periods || \',\' || next_bill_at FROM billguard.scheduler_status'),
	'0,2031-09-01 00:00:00+00', 'scheduler_status: nothing missed, the next instant is 2031-08\'s');

# ---- the clock comes back ------------------------------------------------------------------

$offset = set_scheduler($node, scheduler_now => '2031-09-01 01:00:00+00');
like(wait_for_tick($node, $offset), qr/2031-08 \(due 2031-09-01 00:00 UTC\) was issued already/,
	'back at 2031-09-01 01:00: 2031-08 was issued already');
$offset = set_scheduler($node, scheduler_now => '2031-10-01 00:00:05+00');
like(wait_for_tick($node, $offset), qr/billed 2031-09 \(due 2031-10-01 00:00 UTC\): $accounts records claimed/,
	'and 2031-09 is billed on time');
billed_once($node, $emulator, 'next period', '2031-09', $accounts);
my %per_customer;
$per_customer{ $_->{customer} }++ for @{ succeeded_charges($emulator) };
is(join(',', map { $per_customer{ sprintf('cus_%06d', $_) } // 0 } 1 .. $accounts), join(',', (3) x $accounts),
	'each customer was charged three times in all: 2031-07 by the earlier system, 2031-08 and 2031-09 by billguard');

$node->stop;
$emulator->stop;
done_testing();
