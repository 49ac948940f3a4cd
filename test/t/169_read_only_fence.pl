# A read-only fence (default_transaction_read_only = on), which
# pg_auto_failover raises on a primary it demotes and on a node it promotes
# until that node is ready: the dispatcher waits for it to be lifted,
# claiming and sending nothing, instead of failing at its first write and
# being started again every two seconds; once it is lifted, the same
# dispatcher sends what is due, one charge per key.
#
#   at start   the server starts fenced (as a promoted node does): the
#              dispatcher waits from its start, no error at all
#   mid-run    the fence is raised under a running dispatcher: at most the
#              one running dispatcher fails at its next write; the next one
#              waits
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

my $accounts = 5;
my $emulator = start_emulator();
my $node = BillguardNode->dispatching('read_only_fence', $emulator);
$node->add_accounts($accounts);

# Raises or lifts the fence; a session of its own may still write.
sub fence {
	my ($on) = @_;
	$node->q1('SET default_transaction_read_only = off; '
		. ($on ? 'ALTER SYSTEM SET default_transaction_read_only = on' : 'ALTER SYSTEM RESET default_transaction_read_only')
		. '; SELECT pg_reload_conf()');
}

sub waits_for_fence {
	return wait_until('the dispatcher to wait for the fence', 60, sub {
		$node->q1('SELECT paused AND pause_reason LIKE $$the server is read-only%$$ FROM billguard.dispatch_status') eq 't' });
}

sub read_only_errors {
	my ($offset) = @_;
	my @errors = substr(slurp_file($node->logfile), $offset) =~ /ERROR:  cannot execute \w+ in a read-only transaction/g;
	return scalar @errors;
}

sub sent_once {
	my ($label, $period) = @_;
	ok($node->wait_until_settled($period), "$label: the records of $period settle");
	my ($wrong, $checked) = charged_once_each($node, $emulator, $period);
	is($wrong, '', "$label: every record is completed with the one charge the emulator holds for its key");
	is($checked, $accounts, "$label: $accounts records");
}

# ---- at start ------------------------------------------------------------------------

is($node->q1("SELECT initiated FROM billguard.bill_period('2031-01')"), $accounts, 'at start: 2031-01 claimed');
ok($node->wait_until_settled('2031-01'), 'at start: and sent before the fence');
$node->reload_with(api_key_file => '');
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-02')"), $accounts, 'at start: 2031-02 claimed, not sent (no key)');
# Fenced while paused (nothing to write), the key back for the next start.
fence(1);
$node->q1("SET default_transaction_read_only = off; ALTER SYSTEM SET billguard.api_key_file = '"
	. $node->basedir . "/stripe.key'");
$node->stop('immediate');
my $offset = -s $node->logfile;
$node->start;
ok(waits_for_fence(), 'at start: the dispatcher of the fenced server waits, and says why in dispatch_status');
my $waiting = $node->q1('SELECT worker_pid FROM billguard.dispatch_status');
is($node->q1(q{SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2031-02' AND status <> 'pending'}),
	'0', 'at start: nothing of 2031-02 is claimed while fenced');
is(read_only_errors($offset), 0, 'at start: no write was tried, no error');
fence(0);
sent_once('at start', '2031-02');
is($node->q1('SELECT worker_pid FROM billguard.dispatch_status'), $waiting,
	'at start: the dispatcher that waited sent them, without a restart');
like(substr(slurp_file($node->logfile), $offset), qr/billguard dispatcher: the server is writable again/,
	'at start: it logs that the fence is lifted');

# ---- mid-run ---------------------------------------------------------------------------

$node->reload_with(api_key_file => '');
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-03')"), $accounts, 'mid-run: 2031-03 claimed, not sent (no key)');
$offset = -s $node->logfile;
fence(1);
$node->reload_with(api_key_file => $node->basedir . '/stripe.key');
ok(waits_for_fence(), 'mid-run: a dispatcher waits for the fence');
cmp_ok(read_only_errors($offset), '<=', 1, 'mid-run: at most the running dispatcher failed at a write');
$waiting = $node->q1('SELECT worker_pid FROM billguard.dispatch_status');
fence(0);
sent_once('mid-run', '2031-03');
is($node->q1('SELECT worker_pid FROM billguard.dispatch_status'), $waiting,
	'mid-run: the dispatcher that waited sent them');

$node->stop;
$emulator->stop;
done_testing();
