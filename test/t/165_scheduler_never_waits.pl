# A session that billed a period in a transaction it leaves open (an
# operator's BEGIN; SELECT bill_period('2031-03'); ...) holds
# billing-scheduler's lock until it ends. The scheduler's tick of another
# period, 2031-05, must not wait for it: the dispatcher that ticks is the one
# that sends every record of the database. The tick says so and tries again;
# the dispatcher goes on sending (a record claimed meanwhile completes);
# once the session ends, the tick bills 2031-05 once.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

my $accounts = 15;
my $emulator = start_emulator();
my $node = BillguardNode->dispatching('scheduler_never_waits', $emulator);
$node->add_accounts($accounts);
my $offset = set_scheduler($node, auto_bill => 'monthly', scheduler_now => '2031-05-15 00:00:00+00');
like(wait_for_tick($node, $offset), qr/billed 2031-04 /, 'the scheduler starts by billing 2031-04');
billed_once($node, $emulator, 'start', '2031-04', $accounts);

my %session;
$session{handle} = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres'), '-c', "SET application_name = 'open_bill_period'",
	  '-c', q{BEGIN; SELECT initiated FROM billguard.bill_period('2031-03'); SELECT pg_sleep(600)} ],
	'>', \$session{out}, '2>', \$session{err});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
	 WHERE a.application_name = 'open_bill_period' AND l.locktype = 'advisory' AND l.granted
	   AND l.classid = billguard.scheduler_lock_class() AND l.objid = 0}),
	'a session has billed 2031-03 and keeps its transaction open');

my $dispatcher = $node->dispatcher_pid;
$offset = set_scheduler($node, scheduler_now => '2031-06-01 00:00:00+00');
ok(wait_until('the tick to find a session billing', 30, sub {
	substr(slurp_file($node->logfile), $offset) =~
	  /billguard scheduler: a session is billing 2031-05 \(due 2031-06-01 00:00 UTC\) now, or billed a period in a transaction still open; trying again every second/ }),
	'the tick of 2031-05 says a session holds a billing lock, and tries again');
is($node->q1("SELECT status FROM billguard.bill_customer('cust_000001', '2031-12')"), 'initiated',
	'a record of another period is claimed meanwhile');
ok(wait_until('the record to complete', 60, sub { $node->status_of('cust_000001', '2031-12') eq 'completed' }),
	'the dispatcher sends it while the session is open');
is($node->q1("SELECT count(*) FROM pg_locks WHERE pid = $dispatcher AND NOT granted"), '0',
	'the dispatcher waits for no lock');
is($node->records_of('2031-05'), '0', '2031-05 is not billed while the session is open');

$offset = -s $node->logfile;
$node->safe_psql('postgres', q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	WHERE application_name = 'open_bill_period'});
$session{handle}->finish;
like(wait_for_tick($node, $offset), qr/billed 2031-05 \(due 2031-06-01 00:00 UTC\): $accounts records claimed, 0 existed already/,
	'once the session has ended, the tick bills 2031-05');
billed_once($node, $emulator, 'after the session', '2031-05', $accounts);
is($node->records_of('2031-03'), '0', "2031-03 has no records: the session's transaction was rolled back");

$node->stop;
$emulator->stop;
done_testing();
