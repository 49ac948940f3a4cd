# A dispatcher that exits withdraws its wake-up latch, so no committer sets
# the latch of a process that is gone.
# It used to withdraw it from on_proc_exit, after ProcKill had switched
# MyLatch back to the process-local latch, so the comparison failed and the
# shared state kept pointing at the latch of a PGPROC that the next process
# to take the slot would own: later billing commits would set its latch.
# dispatcher_state() reports whether a wake-up latch is registered; after a
# dispatcher exited and before the next one starts (the launcher is held
# with SIGSTOP meanwhile) it must say none.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('wakeup_latch', $emulator);

my $pid = $node->wait_for_new_dispatcher(0);
ok($pid, 'a dispatcher runs');
ok(wait_until('its latch to be registered', 20,
	sub { $node->q1('SELECT wakeup_registered FROM billguard.dispatcher_state()') eq 't' }),
	'while it runs, its wake-up latch is registered');

my $launcher = $node->q1("SELECT pid FROM pg_stat_activity WHERE backend_type = 'billguard launcher'");
ok($launcher, 'the launcher runs');
kill('STOP', $launcher) or die "kill -STOP $launcher: $!";
kill('TERM', $pid) or die "kill $pid: $!";
my $gone = wait_until('the dispatcher to exit', 20, sub {
	$node->q1("SELECT count(*) FROM pg_stat_activity WHERE pid = $pid") eq '0' });
my $state = $node->q1("SELECT coalesce(pid::text, 'none') || '|' || wakeup_registered FROM billguard.dispatcher_state()");
kill('CONT', $launcher) or die "kill -CONT $launcher: $!";
ok($gone, 'the dispatcher exited');
is($state, 'none|false', 'no dispatcher runs and no wake-up latch is registered');

ok($node->wait_for_new_dispatcher($pid), 'once the launcher goes on, a new dispatcher starts');
ok(wait_until('the new latch', 20,
	sub { $node->q1('SELECT wakeup_registered FROM billguard.dispatcher_state()') eq 't' }),
	'and registers its own latch');

$node->stop;
$emulator->stop;
done_testing();
