# A manual bill_period racing the scheduler's tick for the same period:
# billed once, whichever gets there first.
#
#   tick first     the tick has claimed 2031-05 and waits, before its commit,
#                  to append its BillingTickIssued (a test session holds
#                  billing-scheduler's next event, not committed); four
#                  sessions call bill_period('2031-05') and wait for the
#                  period's lock; the event is rolled back: the tick commits
#                  its claims, the four claim nothing
#   manual first   a session's bill_period('2031-06') has claimed and waits
#                  the same way; the tick of 2031-07-01 finds the period's
#                  lock taken and, rather than wait, tries again; the event
#                  is rolled back: the session commits, and the tick finds
#                  2031-06 issued
#
# Each time: one BillingTickIssued, one record per account, as many records
# initiated in all as accounts, one succeeded charge per key at the
# emulator, every record completed with it.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

my $accounts = 40;
my $emulator = start_emulator();
my $node = BillguardNode->dispatching('scheduler_race', $emulator);
$node->add_accounts($accounts);

my $offset = set_scheduler($node, auto_bill => 'monthly', scheduler_now => '2031-05-15 00:00:00+00');
like(wait_for_tick($node, $offset), qr/billed 2031-04 /, 'the scheduler starts by billing 2031-04');

# Sessions waiting for the period lock of $period.
sub waiting_for_period_lock {
	my ($period, $count) = @_;
	return $node->poll_query_until('postgres', qq{
		SELECT count(*) = $count FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		   AND classid = billguard.period_lock_class() AND objid = hashtext('$period')::oid});
}

# ---- tick first -----------------------------------------------------------------------

my $holder = hold_scheduler_event($node);
my $dispatcher = $node->dispatcher_pid;
$offset = set_scheduler($node, scheduler_now => '2031-06-01 00:00:00+00');
ok(waits_for_scheduler_event($node, $dispatcher), 'tick first: the tick has claimed 2031-05 and waits to commit');
my @racers = map { $node->race_psql("SELECT initiated FROM billguard.bill_period('2031-05')") } 1 .. 4;
ok(waiting_for_period_lock('2031-05', 4), 'tick first: four bill_period sessions wait for the period');
release_scheduler_event($node, $holder);
finish_race(@racers);
is(join(',', map { $_->{exit} } @racers), '0,0,0,0', 'tick first: every bill_period succeeds');
is(join(',', map { $_->{out} =~ s/\s+//gr } @racers), '0,0,0,0', 'tick first: and claims nothing');
like(wait_for_tick($node, $offset), qr/billed 2031-05 \(due 2031-06-01 00:00 UTC\): $accounts records claimed, 0 existed already/,
	'tick first: the tick claimed every account');
billed_once($node, $emulator, 'tick first', '2031-05', $accounts);

# ---- manual first -------------------------------------------------------------------------

$holder = hold_scheduler_event($node);
my ($manual) = $node->race_psql("SELECT initiated FROM billguard.bill_period('2031-06')");
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
	 WHERE a.query LIKE '%bill_period(''2031-06'')%' AND l.locktype = 'transactionid' AND NOT l.granted}),
	'manual first: bill_period has claimed 2031-06 and waits to commit');
$offset = set_scheduler($node, scheduler_now => '2031-07-01 00:00:00+00');
ok(wait_until('the tick to find the period busy', 30, sub {
	substr(slurp_file($node->logfile), $offset) =~ /billguard scheduler: a session is billing 2031-06/ }),
	'manual first: the tick finds a session billing 2031-06, and does not wait for it');
is($node->q1("SELECT count(*) FROM pg_locks WHERE pid = $dispatcher AND NOT granted"), '0',
	'manual first: the dispatcher waits for no lock');
release_scheduler_event($node, $holder);
finish_race($manual);
is($manual->{exit}, 0, 'manual first: bill_period succeeds');
is($manual->{out} =~ s/\s+//gr, $accounts, 'manual first: and claims every account');
like(wait_for_tick($node, $offset), qr/2031-06 \(due 2031-07-01 00:00 UTC\) was issued already/,
	'manual first: the tick, tried again, finds 2031-06 issued');
billed_once($node, $emulator, 'manual first', '2031-06', $accounts);

$node->stop;
$emulator->stop;
done_testing();
