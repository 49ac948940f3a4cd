# One row lock must not halt billing, and no wait may keep the dispatcher
# from SIGTERM.
#
#   row lock  another session holds one in-flight record's row lock (an open
#             transaction): every other record of the period completes while
#             it is held; the locked record's answer waits, and once the
#             lock is released the record completes, charged once
#   SIGTERM   another session holds billing_records locked (LOCK TABLE), so
#             the dispatcher's claim waits for it; a SIGTERM stops the worker
#             all the same, while the lock is still held, and the new
#             dispatcher bills once the lock is gone
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use DispatchScenario;

my $emulator = start_emulator(latency_ms => 300);
my $node = BillguardNode->dispatching('row_lock', $emulator);
$node->add_accounts(30);
my $period = '2031-03';

# ---- row lock ----
my $lock = start_row_lock($node, 'cust_000001', $period);
is($node->q1("SELECT initiated FROM billguard.bill_period('$period')"), '30', 'row lock: 30 billings initiated');
is(row_lock_taken($lock), 'dispatching:1', 'row lock: another session holds cust_000001 while its request is in flight');
my $others = sub {
	$node->q1("SELECT count(*) FROM billguard.billing_records WHERE billing_period = '$period' AND status = 'completed'");
};
ok(wait_until('the other 29 records completed', 60, sub { $others->() eq '29' }),
	'row lock: the other 29 records complete while the lock is held') or diag('completed: ' . $others->());
ok(wait_until('the answer waiting', 20, sub { $node->answer_waits_for_row_lock('cust_000001', $period) }),
	'row lock: the locked record\'s answer waits for the lock (logged)');
is($node->status_of('cust_000001', $period), 'dispatching', 'row lock: the locked record is still dispatching');
end_row_lock($lock);
ok(wait_until('the locked record completed', 60, sub { $node->status_of('cust_000001', $period) eq 'completed' }),
	'row lock: once released, the locked record completes');
my $key = $node->key_of('cust_000001', $period);
my $charges = succeeded_for_key($emulator, $key);
is(scalar(@$charges), 1, 'row lock: exactly one charge for its key');
is($node->q1("SELECT charge_id FROM billguard.billing_records WHERE idempotency_key = '$key'"), $charges->[0]{id} // '(none)',
	'row lock: completed with that charge id');
my $by_key = charges_by_key($emulator);
is(scalar(keys %$by_key) . '/' . scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), '30/0',
	'row lock: 30 keys charged, each exactly once');

# ---- SIGTERM while the dispatcher waits for a lock ----
my $pid = $node->dispatcher_pid;
my %s = (in => "BEGIN;\nLOCK TABLE billguard.billing_records IN ACCESS EXCLUSIVE MODE;\nSELECT 'LOCKED';\n", out => '', err => '');
$s{handle} = IPC::Run::start([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres') ],
	'<', \$s{in}, '>', \$s{out}, '2>', \$s{err});
ok(wait_until('the table lock', 20, sub { $s{handle}->pump_nb; $s{out} =~ /LOCKED/ }), 'SIGTERM: another session locks billing_records');
my $waiting = sub {
	$node->q1("SELECT count(*) FROM pg_stat_activity WHERE pid = $pid AND wait_event_type = 'Lock'");
};
ok(wait_until('the dispatcher waiting for the lock', 20, sub { $waiting->() eq '1' }),
	'SIGTERM: the dispatcher waits for the lock (its poll claims)');
ok(kill('TERM', $pid), 'SIGTERM sent to the waiting dispatcher');
ok(wait_until('the dispatcher gone', 20, sub {
		$node->q1("SELECT count(*) FROM pg_stat_activity WHERE pid = $pid") eq '0' }),
	'SIGTERM: the dispatcher stops while the lock is still held');
$s{handle}->pump_nb;
is($s{err}, '', 'SIGTERM: (the lock was held all along)');
like(slurp_file($node->logfile), qr/billguard dispatcher: stopping with 0 requests in flight/,
	'SIGTERM: the dispatcher stopped cleanly (its stop line is logged)');
$s{in} .= "ROLLBACK;\n";
$s{handle}->finish;
ok($node->wait_for_new_dispatcher($pid, 30), 'SIGTERM: a new dispatcher runs once the lock is gone');
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-04')"), '30', 'SIGTERM: a new period initiated');
ok($node->wait_until_settled('2031-04', 60), 'SIGTERM: and it settles');
is($node->q1("SELECT count(*) FROM billguard.billing_records WHERE status = 'completed'"), '60', 'every record completed');

$node->stop;
$emulator->stop;
done_testing();
