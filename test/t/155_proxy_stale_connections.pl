# After a database restart the proxy's pooled connections are all dead,
# though the database is up again. Each is found closed before it is used
# and replaced, so that no request pays for it: neither a charge (503
# before), nor /healthz, nor the settle of a charge that was at Stripe
# while the database restarted (lost before: "could not settle"). And a
# ledger call whose connection is killed under it is run once more on a
# new one where a repeat is harmless (an authorization: its reservation is
# counted once).
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $node = BillguardNode->preloaded('stale_connections');
my $emulator = start_emulator();
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	args => [ '--database-pool', '4' ]);
my $key = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => 1000);
my $n = 0;
sub charge_request {
	my ($idem) = @_;
	return { method => 'POST', path => '/v1/payment_intents', vault_key => $key->{vault_key},
		idempotency_key => $idem, body => ProxyHarness::charge_body(amount => 100) };
}
sub pooled {
	return $node->q1(q{SELECT count(*) FROM pg_stat_activity
	                    WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND state = 'idle'});
}
sub status_of_key {
	my ($idem) = @_;
	return $node->q1("SELECT status FROM billguard.vault_reservations WHERE idempotency_key = '$idem'");
}

# Fill the pool: requests at once, while Stripe takes its time.
$emulator->configure(latency_ms => 300);
my @warm = $proxy->concurrently(map { charge_request("warm-$_") } 1 .. 12);
is(scalar(grep { ($_->{status} // 0) == 200 } @warm), 12, 'twelve charges at once pass');
$emulator->configure(latency_ms => 0);
my $pooled = pooled();
cmp_ok($pooled, '>=', 2, "the proxy keeps $pooled connections in its pool");

# ---- a restart: every pooled connection dies --------------------------------------------------

$node->restart;
is($proxy->request('GET', '/healthz', undef)->{status}, 200, 'at once after the restart, /healthz is 200');
my @after = map { $proxy->charge($key->{vault_key}, "after-$_", amount => 100) } 1 .. $pooled + 1;
is(join(' ', map { $_->{status} } @after), join(' ', (200) x ($pooled + 1)),
	'every charge after the restart passes: none pays for a dead pooled connection');
like($proxy->request('GET', '/metrics', undef)->{content},
	qr/^billguard_proxy_database_connections_replaced_total [1-9]\d*$/m, '/metrics counts the connections replaced');

# ---- a charge at Stripe while the database restarts ------------------------------------------

$emulator->configure(latency_ms => 2500);
my $body = ProxyHarness::charge_body(amount => 100);
my $socket = $proxy->send_charge($key->{vault_key}, 'across-1', $body);
ok(wait_until('the reservation of across-1', 10, sub { status_of_key('across-1') eq 'reserved' }), 'a charge is at Stripe');
$node->restart;
my $answer = StripeEmulatorHarness::read_response($socket, 30);
close $socket;
$emulator->configure(latency_ms => 0);
is($answer->{status}, 200, 'it is answered 200');
is(status_of_key('across-1'), 'settled', '... and settled at once, on a new connection');
unlike($proxy->log_text, qr/could not settle/, 'no settle had to wait');
my $s = $proxy->key_status($key->{key_id});
is("$s->{settled_cents}/$s->{reserved_cents}", (12 + $pooled + 1 + 1) * 100 . '/0', 'every charge settled, nothing reserved');


# ---- a connection killed while its call waits ------------------------------------------------

my $lock = ProxyHarness::hold_key_lock($node, '2026-08', 'killed-1');
$socket = $proxy->send_charge($key->{vault_key}, 'killed-1', $body);
my $waiting = q{SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%vault_authorize%'};
ok(wait_until('the authorization to wait for the key', 10, sub { $node->q1($waiting) ne '' }),
	'an authorization waits for the key\'s lock');
my $killed = $node->q1($waiting);
$node->q1("SELECT pg_terminate_backend($killed)");
ok(wait_until('the authorization to be run again', 10, sub { my $pid = $node->q1($waiting); $pid ne '' && $pid ne $killed }),
	'its connection killed, the proxy runs it again on a new one');
ProxyHarness::end_key_lock($lock);
$answer = StripeEmulatorHarness::read_response($socket, 30);
close $socket;
is($answer->{status}, 200, 'the charge passes');
is($node->q1(q{SELECT string_agg(decision, ' ' ORDER BY occurred_at) FROM billguard.vault_audit WHERE idempotency_key = 'killed-1'}),
	'reserved settled', 'reserved once, settled once');
like($proxy->request('GET', '/metrics', undef)->{content}, qr/^billguard_proxy_database_calls_retried_total 1$/m,
	'/metrics counts the call run again');

$proxy->stop;
$emulator->stop;
$node->stop;
done_testing();
