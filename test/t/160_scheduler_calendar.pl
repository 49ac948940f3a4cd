# The scheduler in the dispatcher bills each period once, from the calendar
# alone. Its clock is held by billguard.scheduler_now; every period is
# checked the same way: one BillingTickIssued, one record per account, one
# succeeded charge per key at the emulator, every record completed with it.
#
#   start      auto_bill turned on on 2031-08-31 23:59:59: the most recent
#              due period, 2031-07, is billed at once, each record searched
#              for first (a month past billguard.idempotency_window)
#   crossing   the clock crosses 2031-09-01 00:00 UTC: 2031-08 is billed
#              once; ticks later in that hour find it issued
#   restarts   three restarts within the same hour (fast, immediate, kill -9
#              of the dispatcher) bill nothing more
#   downtime   down from 2031-09-15 until 2031-11-01 06:00: at start 2031-10
#              is billed once and 2031-09 not at all; due_periods() lists
#              2031-09, and bill_period bills it deliberately, once
#   settings   bill_day and bill_hour_utc changed in the middle of a period
#              bill no period twice
#   clock      without scheduler_now, the calendar follows the clock: its
#              previous month is the due period, which the scheduler does
#              not bill, as the periods the test clock issued years ahead of
#              it, once their months had ended by that clock, are later (to
#              the scheduler, the clock went back)
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

my $accounts = 20;
my $emulator = start_emulator();
my $node = BillguardNode->dispatching('scheduler_calendar', $emulator, "restart_after_crash = on");
$node->add_accounts($accounts);

# ---- start -------------------------------------------------------------------------

my $offset = set_scheduler($node, auto_bill => 'monthly', scheduler_now => '2031-08-31 23:59:59+00');
like(wait_for_tick($node, $offset), qr/billed 2031-07 \(due 2031-08-01 00:00 UTC\): $accounts records claimed, 0 existed already; each is searched for at Stripe before any charge is sent: the scheduler claimed 2031-07 30 days 23:59:59 after it became due \(2031-08-01 00:00 UTC\), past billguard.idempotency_window \(23h\).*; next bill at 2031-09-01 00:00 UTC/,
	'start: turned on, the scheduler bills the most recent due period, 2031-07, a month late: searching first');
billed_once($node, $emulator, 'start', '2031-07', $accounts);
is($node->q1(q{SELECT string_agg(DISTINCT event_type || coalesce('(' || (event ->> 'action') || ')', ''), ',')
	FROM billguard.journal WHERE persistence_id LIKE 'billing-%-2031-07'}),
	'BillingCompleted,BillingInitiated,ChargeAttempted(search)',
	'start: each record was searched for, not found, and charged');
is($node->records_of('2031-08'), '0', 'start: 2031-08 is not billed a second before its instant');

# ---- crossing ----------------------------------------------------------------------

$offset = set_scheduler($node, scheduler_now => '2031-09-01 00:00:00+00');
like(wait_for_tick($node, $offset), qr/billed 2031-08 \(due 2031-09-01 00:00 UTC\): $accounts records claimed/,
	'crossing: at 2031-09-01 00:00 UTC the scheduler bills 2031-08');
for my $later ('2031-09-01 00:00:01+00', '2031-09-01 00:30:00+00') {
	$offset = set_scheduler($node, scheduler_now => $later);
	like(wait_for_tick($node, $offset), qr/2031-08 \(due 2031-09-01 00:00 UTC\) was issued already/,
		"crossing: at $later the tick finds 2031-08 issued");
}
billed_once($node, $emulator, 'crossing', '2031-08', $accounts);

# ---- restarts within the hour -------------------------------------------------------

my $created = $emulator->stats->{created};
my @restarts = (
	[ '00:40', 'fast', sub { $node->restart } ],
	[ '00:50', 'immediate', sub { $node->stop('immediate'); $node->start } ],
	[ '00:59:59', 'kill -9 of the dispatcher', sub {
		my $pid = $node->dispatcher_pid;
		kill('KILL', $pid) or die "kill -9 $pid: $!";
		$node->wait_for_new_dispatcher($pid, 60) or die 'no dispatcher after kill -9';
	} ],
);
for my $restart (@restarts) {
	my ($at, $how, $do) = @$restart;
	$offset = set_scheduler($node, scheduler_now => "2031-09-01 $at+00");
	wait_for_tick($node, $offset);
	$offset = -s $node->logfile;
	$do->();
	like(wait_for_tick($node, $offset), qr/2031-08 \(due 2031-09-01 00:00 UTC\) was issued already/,
		"restarts: after a $how restart at $at the tick finds 2031-08 issued");
}
is($node->ticks_issued('2031-08'), '1', 'restarts: still one BillingTickIssued for 2031-08');
is($node->records_of('2031-08'), $accounts, 'restarts: still one record per account');
is($emulator->stats->{created}, $created, 'restarts: the emulator created nothing after the three restarts');

# ---- downtime across two bill instants -----------------------------------------------

$offset = set_scheduler($node, scheduler_now => '2031-09-15 12:00:00+00');
wait_for_tick($node, $offset);
$node->stop;
$node->append_conf('postgresql.conf', scheduler_conf(scheduler_now => '2031-11-01 06:00:00+00'));
$offset = -s $node->logfile;
$node->start;
like(wait_for_tick($node, $offset), qr/billed 2031-10 \(due 2031-11-01 00:00 UTC\): $accounts records claimed/,
	'downtime: at start the most recent due period, 2031-10, is billed');
billed_once($node, $emulator, 'downtime', '2031-10', $accounts);
is($node->records_of('2031-09'), '0', 'downtime: 2031-09, missed while down, is not billed automatically');
is($node->ticks_issued('2031-09'), '0', 'downtime: nor issued');
is($node->q1(q{SELECT string_agg(billing_period || '/' || due_at || '/' || records || '/' || scheduled, ',')
	FROM billguard.due_periods()}), '2031-09/2031-10-01 00:00:00+00/0/false',
	'downtime: due_periods() lists 2031-09, not scheduled');
is($node->q1('SELECT missed_periods FROM billguard.scheduler_status'), '1', 'downtime: scheduler_status counts one missed period');
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-09')"), $accounts,
	'downtime: bill_period bills 2031-09 deliberately');
billed_once($node, $emulator, 'deliberately', '2031-09', $accounts);
is($node->q1('SELECT count(*) FROM billguard.due_periods()'), '0', 'downtime: due_periods() is empty afterwards');

# ---- settings changed mid-period ----------------------------------------------------

$created = $emulator->stats->{created};
for my $change ([ { bill_day => 15 }, '2031-11-10 00:00:00+00', '2031-09', '2031-10-15 00:00' ],
                [ { bill_day => 15, bill_hour_utc => 23 }, '2031-11-15 22:00:00+00', '2031-09', '2031-10-15 23:00' ],
                [ { bill_day => 15, bill_hour_utc => 6 }, '2031-11-15 22:00:00+00', '2031-10', '2031-11-15 06:00' ],
                [ { bill_day => 1, bill_hour_utc => 0 }, '2031-11-20 00:00:00+00', '2031-10', '2031-11-01 00:00' ]) {
	my ($settings, $now, $period, $due) = @$change;
	$offset = set_scheduler($node, %$settings, scheduler_now => $now);
	my $what = join(', ', map { "$_ $settings->{$_}" } sort keys %$settings);
	like(wait_for_tick($node, $offset), qr/\Q$period (due $due UTC) was issued already\E/,
		"settings: $what at $now: the due period $period was issued already");
}
is(join(',', map { $node->ticks_issued($_) } qw(2031-07 2031-08 2031-09 2031-10)), '1,1,1,1',
	'settings: still one BillingTickIssued per period');
is($emulator->stats->{created}, $created, 'settings: the emulator created nothing');

# ---- the clock ----------------------------------------------------------------------

# With bill_day 1 at 00:00 the most recent due period is always last month.
my $last_month = q{SELECT to_char(date_trunc('month', now() AT TIME ZONE 'UTC') - interval '1 month', 'YYYY-MM')};
my $before = $node->q1($last_month);
$offset = set_scheduler($node, scheduler_now => '');
my ($due) = wait_for_tick($node, $offset)
  =~ /(\d{4}-\d\d) \(due \d{4}-\d\d-01 00:00 UTC\) is not billed: a later period was issued already/;
my $after = $node->q1($last_month);
ok(defined $due && ($due eq $before || $due eq $after),
	"clock: without scheduler_now the scheduler's due period is last month by the clock ($before), "
	  . 'not billed behind the periods the test clock issued');
is($node->records_of($before), '0', 'clock: nothing was claimed for it');

$node->stop;
$emulator->stop;
done_testing();
