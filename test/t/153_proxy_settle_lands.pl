# A settle lost to the database must still land: otherwise the charge
# stays "reserved", and its key, back after Stripe has forgotten it
# (--idempotency-ttl 3 here), charges again. Between Stripe's answer and
# the settle:
#   - the settle's statement is cancelled (another session holds the key's
#     lock past the proxy's statement_timeout): the client still gets its
#     200, the settle is kept and retried until the database takes it, and
#     the key is then replayed from the ledger, past Stripe's memory;
#   - the database stops: the same, once it is back;
#   - the database stops and the proxy is killed (kill -9) with the settle
#     in memory: restarted, its reconciler finds the charge at Stripe by
#     itself (no request needed) and settles it.
# Each ends with one charge at the emulator, counted once, settled.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $node = BillguardNode->preloaded('settle_lands');
my $emulator = start_emulator(idempotency_ttl => 3);
# A statement waiting on a lock is cancelled after a second.
my $conninfo = $node->connstr('postgres') . " options='-c statement_timeout=1000'";
my $proxy = ProxyHarness->start(conninfo => $conninfo, upstream => $emulator);
my $key = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => 100);
sub budget { my $s = $proxy->key_status($key->{key_id}); return "$s->{settled_cents}/$s->{reserved_cents}" }
sub budget_in_db {
	return $node->q1(q{SELECT settled_cents || '/' || reserved_cents FROM billguard.vault_spend WHERE billing_period = '2026-08'});
}
sub charges_for {
	my ($idem) = @_;
	return scalar(grep { ($_->{idempotency_key} // '') eq $idem } @{ succeeded_charges($emulator) });
}
sub status_of_key {
	my ($idem) = @_;
	return $node->q1("SELECT status FROM billguard.vault_reservations WHERE idempotency_key = '$idem'");
}
sub metric {
	my ($p, $name) = @_;
	my ($value) = ($p->request('GET', '/metrics', undef)->{content} // '') =~ /^\Q$name\E (\S+)$/m;
	return $value // 'none';
}
sub body_of { my ($idem) = @_; return ProxyHarness::charge_body(amount => 1000, customer => 'cus_lands', 'metadata[billguard_key]' => $idem) }
# Sends a charge and returns its socket at once; the answer is read later.
sub send_charge {
	my ($p, $idem) = @_;
	my $socket = $p->send_charge($key->{vault_key}, $idem, body_of($idem));
	ok(wait_until("the reservation of $idem", 10, sub { status_of_key($idem) eq 'reserved' }),
		"$idem is reserved and at Stripe");
	return $socket;
}
sub again {
	my ($p, $idem) = @_;
	return $p->request('POST', '/v1/payment_intents', body_of($idem), vault_key => $key->{vault_key},
		idempotency_key => $idem);
}

# ---- the settle's statement cancelled -----------------------------------------------------------

$emulator->configure(latency_ms => 1500);
my $socket = send_charge($proxy, 'blip-1');
my $lock = ProxyHarness::hold_key_lock($node, '2026-08', 'blip-1');
my $answer = StripeEmulatorHarness::read_response($socket, 30);
close $socket;
$emulator->configure(latency_ms => 0);
is($answer->{status}, 200, 'the client gets the charge though its settle was cancelled');
is(status_of_key('blip-1'), 'reserved', 'the reservation is still reserved while the key is locked');
is(metric($proxy, 'billguard_proxy_settles_pending'), 1, '/metrics: one settle waits for the database');
like($proxy->log_text, qr/could not settle blip-1 attempt 1 of vkey_\w+ now \(the spend-cap ledger failed \(SQLSTATE 57014\)\): kept, and retried until the database takes it/,
	'the log says it is kept');
sleep 2;
is(status_of_key('blip-1'), 'reserved', '... and retried while the lock is held');
ProxyHarness::end_key_lock($lock);
ok(wait_until('the settle to land', 15, sub { status_of_key('blip-1') eq 'settled' }),
	'once the lock is gone, the kept settle lands');
is(metric($proxy, 'billguard_proxy_settles_pending'), 0, '/metrics: nothing waits any more');
like($proxy->request('GET', '/metrics', undef)->{content}, qr/^billguard_proxy_settles_total\{result="landed"\} 1$/m,
	'/metrics: one settle landed late');
sleep 3.5;    # Stripe forgets the key
my $replay = again($proxy, 'blip-1');
is("$replay->{status} " . ($replay->{headers}{'idempotent-replayed'} // ''), '200 true',
	'the key, back after Stripe forgot it, is replayed from the ledger');
is(charges_for('blip-1'), 1, 'one charge at the emulator');
is(budget(), '1000/0', 'counted once, settled');

# ---- the database stops between the answer and the settle ----------------------------------------

$emulator->configure(latency_ms => 2000);
$socket = send_charge($proxy, 'down-1');
$node->stop('fast');
$answer = StripeEmulatorHarness::read_response($socket, 30);
close $socket;
$emulator->configure(latency_ms => 0);
is($answer->{status}, 200, 'with the database down at the settle, the client gets the charge');
is(metric($proxy, 'billguard_proxy_settles_pending'), 1, '/metrics: one settle waits for the database');
$node->start;
ok(wait_until('the settle to land', 20, sub { status_of_key('down-1') eq 'settled' }),
	'the database back, the kept settle lands without any request');
sleep 3.5;
$replay = again($proxy, 'down-1');
is("$replay->{status} " . ($replay->{headers}{'idempotent-replayed'} // ''), '200 true',
	'the key, back after Stripe forgot it, is replayed from the ledger');
is(charges_for('down-1'), 1, 'one charge at the emulator');
is(budget(), '2000/0', 'counted once, settled');
$proxy->stop;

# ---- the database stops, and the proxy is killed with the settle in memory -------------------

my $quick = ProxyHarness->start(conninfo => $conninfo, upstream => $emulator,
	args => [ '--reconcile-after', '3', '--upstream-timeout', '3' ]);
$emulator->configure(latency_ms => 2000);
$socket = send_charge($quick, 'killed-1');
$node->stop('fast');
$answer = StripeEmulatorHarness::read_response($socket, 30);
close $socket;
$emulator->configure(latency_ms => 0);
is($answer->{status}, 200, 'the client gets the charge');
ok(wait_until('the settle to be kept', 10, sub { metric($quick, 'billguard_proxy_settles_pending') eq '1' }),
	'the settle is kept in memory');
$quick->stop('KILL');
$node->start;
is(status_of_key('killed-1'), 'reserved', 'killed with it, the proxy left the reservation reserved, in doubt');
$quick->restart;
ok(wait_until('the reconciler to settle it', 30, sub { status_of_key('killed-1') eq 'settled' }),
	'restarted, the proxy settles it by itself from what Stripe holds');
like($node->q1(q{SELECT reason FROM billguard.vault_audit WHERE idempotency_key = 'killed-1' AND decision = 'settled'}),
	qr/^reconciled with Stripe: found pi_\w+ by Stripe's search/, '... found by Stripe\'s search');
like($quick->log_text, qr/reconciled killed-1 of vkey_\w+ with Stripe: settled/, '... and says so in its log');
sleep 1;
$replay = again($quick, 'killed-1');
is("$replay->{status} " . ($replay->{headers}{'idempotent-replayed'} // ''), '200 true',
	'the key, back after Stripe forgot it, is replayed from the ledger');
is($replay->{json}{id}, ledger_for_key($emulator, 'killed-1')->[0]{id},
	'... with the charge Stripe made');
is(charges_for('killed-1'), 1, 'one charge at the emulator');
is(budget_in_db(), '3000/0', 'counted once, settled');

$quick->stop;
$emulator->stop;
$node->stop;
done_testing();
