# A dispatcher that exits withdraws its wake-up latch (issue 6, item 17).
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
use DispatchScenario;

my $emulator = start_emulator();
my $node = dispatch_node('wakeup_latch', $emulator);

my $pid = wait_for_new_dispatcher($node, 0);
ok($pid, 'a dispatcher runs');
ok(wait_for('its latch to be registered', 20,
	sub { q1($node, 'SELECT wakeup_registered FROM billguard.dispatcher_state()') eq 't' }),
	'while it runs, its wake-up latch is registered');

my $launcher = q1($node, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'billguard launcher'");
ok($launcher, 'the launcher runs');
kill('STOP', $launcher) or die "kill -STOP $launcher: $!";
kill('TERM', $pid) or die "kill $pid: $!";
my $gone = wait_for('the dispatcher to exit', 20, sub {
	q1($node, "SELECT count(*) FROM pg_stat_activity WHERE pid = $pid") eq '0' });
my $state = q1($node, "SELECT coalesce(pid::text, 'none') || '|' || wakeup_registered FROM billguard.dispatcher_state()");
kill('CONT', $launcher) or die "kill -CONT $launcher: $!";
ok($gone, 'the dispatcher exited');
is($state, 'none|false', 'no dispatcher runs and no wake-up latch is registered');

ok(wait_for_new_dispatcher($node, $pid), 'once the launcher goes on, a new dispatcher starts');
ok(wait_for('the new latch', 20,
	sub { q1($node, 'SELECT wakeup_registered FROM billguard.dispatcher_state()') eq 't' }),
	'and registers its own latch');

$node->stop;
$emulator->stop;
done_testing();
