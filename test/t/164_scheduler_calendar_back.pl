# bill_day (or bill_hour_utc) moved later in the middle of a period takes
# the scheduler's calendar back a month: on 2031-09-03, with bill_day 5, the
# most recent due period is 2031-07, due since 2031-08-05. The scheduler
# had billed 2031-08 on 2031-09-02 (bill_day 1) and never 2031-07: it must
# not go back and bill 2031-07 by itself (a period older than one issued is
# a person's decision, and one billed before billguard, with the same
# content-hash keys long forgotten by Stripe, would be charged twice). It
# logs why, as a WARNING, and bills the next period at its new instant.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

my $accounts = 12;
my $emulator = start_emulator();
my $node = BillguardNode->dispatching('scheduler_calendar_back', $emulator);
$node->add_accounts($accounts);

my $offset = set_scheduler($node, auto_bill => 'monthly', bill_day => 1, scheduler_now => '2031-09-02 00:00:00+00');
like(wait_for_tick($node, $offset), qr/billed 2031-08 \(due 2031-09-01 00:00 UTC\): $accounts records claimed/,
	'turned on on 2031-09-02 with bill_day 1, the scheduler bills 2031-08');
billed_once($node, $emulator, 'bill_day 1', '2031-08', $accounts);
my $created = $emulator->stats->{created};

$offset = set_scheduler($node, bill_day => 5, scheduler_now => '2031-09-03 00:00:00+00');
like(wait_for_tick($node, $offset),
	qr/2031-07 \(due 2031-08-05 00:00 UTC\) is not billed: a later period was issued already, and the scheduler never goes back to a period it passed/,
	'bill_day 5 on 2031-09-03: the calendar went back to 2031-07, which the scheduler does not bill');
like(substr(slurp_file($node->logfile), $offset), qr/WARNING:  billguard scheduler: 2031-07 \(due 2031-08-05 00:00 UTC\) is not billed/,
	'it says so as a WARNING');
is($node->records_of('2031-07'), '0', 'no record was claimed for 2031-07');
is($node->ticks_issued('2031-07'), '0', 'nor was 2031-07 issued');
is($emulator->stats->{created}, $created, 'the emulator created nothing');
is($node->q1('SELECT count(*) FROM billguard.due_periods()'), '0',
	'due_periods() lists nothing: 2031-07 is older than the first period the scheduler issued');
is($node->q1("SELECT missed_periods || ',' || next_bill_at FROM billguard.scheduler_status"),
	'0,2031-09-05 00:00:00+00', 'scheduler_status: nothing missed, the next instant ahead');

$offset = set_scheduler($node, scheduler_now => '2031-10-05 00:00:00+00');
like(wait_for_tick($node, $offset), qr/billed 2031-09 \(due 2031-10-05 00:00 UTC\): $accounts records claimed/,
	'at its new instant, 2031-10-05, the scheduler bills 2031-09');
billed_once($node, $emulator, 'bill_day 5', '2031-09', $accounts);
is(join(',', map { $node->ticks_issued($_) } qw(2031-07 2031-08 2031-09)), '0,1,1',
	'one BillingTickIssued for 2031-08 and 2031-09, none for 2031-07');

$node->stop;
$emulator->stop;
done_testing();
