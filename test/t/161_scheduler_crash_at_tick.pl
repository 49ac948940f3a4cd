# The dispatcher killed (kill -9) at the instant of the scheduler's tick, and
# started again by the crash restart: the period is billed once.
#
#   in the tick   the tick has claimed every account and waits, before its
#                 commit, to append its BillingTickIssued (a test session
#                 holds billing-scheduler's next event, not committed);
#                 kill -9: nothing of the tick was committed, and
#                 the next dispatcher bills the period at its start
#   after it      kill -9 as soon as the tick has committed: the next
#                 dispatcher finds the period issued and sends the records
#                 with their keys
#
# Each time: one BillingTickIssued, one record per account, one succeeded
# charge per key at the emulator, every record completed with it.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

my $accounts = 30;
my $emulator = start_emulator();
my $node = BillguardNode->dispatching('scheduler_crash', $emulator, "restart_after_crash = on");
$node->add_accounts($accounts);

# ---- in the tick ----------------------------------------------------------------------

my $holder = hold_scheduler_event($node);
my $dispatcher = $node->dispatcher_pid;
my $offset = set_scheduler($node, auto_bill => 'monthly', scheduler_now => '2031-03-01 00:00:00+00');
ok(waits_for_scheduler_event($node, $dispatcher),
	'in the tick: the dispatcher has claimed 2031-02 and waits to append its tick before committing');
is($node->records_of('2031-02'), '0', 'in the tick: its claims are not committed');
kill('KILL', $dispatcher) or die "kill -9 $dispatcher: $!";
release_scheduler_event(undef, $holder);    # the crash restart ended its session
ok($node->wait_for_new_dispatcher($dispatcher, 60), 'in the tick: a new dispatcher runs after the crash restart');
like(wait_for_tick($node, $offset), qr/billed 2031-02 \(due 2031-03-01 00:00 UTC\): $accounts records claimed, 0 existed already/,
	'in the tick: the new dispatcher bills 2031-02 at its start');
billed_once($node, $emulator, 'in the tick', '2031-02', $accounts);

# ---- right after it --------------------------------------------------------------------

$dispatcher = $node->dispatcher_pid;
$offset = set_scheduler($node, scheduler_now => '2031-04-01 00:00:00+00');
like(wait_for_tick($node, $offset), qr/billed 2031-03 /, 'after the tick: 2031-03 billed');
kill('KILL', $dispatcher) or die "kill -9 $dispatcher: $!";
$offset = -s $node->logfile;
ok($node->wait_for_new_dispatcher($dispatcher, 60), 'after the tick: a new dispatcher runs after the crash restart');
like(wait_for_tick($node, $offset), qr/2031-03 \(due 2031-04-01 00:00 UTC\) was issued already/,
	'after the tick: the new dispatcher finds 2031-03 issued');
billed_once($node, $emulator, 'after the tick', '2031-03', $accounts);

$node->stop;
$emulator->stop;
done_testing();
