# A dispatcher that exits withdraws its wake-up latch (issue 6, item 17).
# It used to withdraw it from on_proc_exit, after ProcKill had switched
# MyLatch back to the process-local latch, so the comparison failed and the
# shared state kept pointing at the latch of a PGPROC that the next process
# to take the slot would own: later billing commits would set its latch.
# dispatcher_state() reports whether a wake-up latch is registered; in the
# moment after a dispatcher exited and before the next one starts, it must
# say none.
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

kill('TERM', $pid) or die "kill $pid: $!";
# One call reads pid and latch together: a row appears once no dispatcher runs.
my $registered;
ok(wait_for('a moment without a dispatcher', 20, sub {
	$registered = q1($node, 'SELECT wakeup_registered FROM billguard.dispatcher_state() WHERE pid IS NULL');
	$registered ne '' }), 'the dispatcher exited');
is($registered, 'f', 'no wake-up latch is registered once the dispatcher has exited');

ok(wait_for_new_dispatcher($node, $pid), 'a new dispatcher starts');
ok(wait_for('the new latch', 20,
	sub { q1($node, 'SELECT wakeup_registered FROM billguard.dispatcher_state()') eq 't' }),
	'and registers its own latch');

$node->stop;
$emulator->stop;
done_testing();
