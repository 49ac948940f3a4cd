# Faults around the proxy must neither lose a reservation nor charge twice:
# real crashes, a real database
# restart, a real hang.
#   - kill -9 of the proxy while a charge is at Stripe: its reservation
#     survives the crash; restarted, a retry with the same Idempotency-Key
#     settles it once (one charge at the emulator, counted once);
#   - the database restarts while the proxy runs: 503s that forward
#     nothing, then the same process reconnects by itself;
#   - Stripe hangs: the proxy's timeout answers 502, nothing is settled as
#     a success and the amount stays reserved until a retry settles it.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $node = BillguardNode->preloaded('proxy_faults');
my $emulator = start_emulator();
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	args => [ '--upstream-timeout', '2' ]);
my $key = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => 100);
sub budget { my $s = $proxy->key_status($key->{key_id}); return "$s->{settled_cents}/$s->{reserved_cents}" }
sub charges_for { my ($idem) = @_; return scalar(grep { ($_->{idempotency_key} // '') eq $idem } @{ succeeded_charges($emulator) }) }

# ---- kill -9 mid-request ---------------------------------------------------------------

$emulator->configure(latency_ms => 1500);
my $socket = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $proxy->port, Proto => 'tcp') or die $!;
my $body = ProxyHarness::charge_body(amount => 2500);
syswrite($socket, "POST /v1/payment_intents HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer $key->{vault_key}\r\n"
	. "Idempotency-Key: crash-1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: "
	. length($body) . "\r\n\r\n$body");
ok(wait_until('the reservation of crash-1', 10, sub {
	$node->q1(q{SELECT count(*) FROM billguard.vault_reservations WHERE idempotency_key = 'crash-1'}) eq '1' }),
	'the charge is reserved and at Stripe');
$proxy->stop('KILL');
close $socket;
$proxy->restart;
is(budget(), '0/2500', 'after kill -9 and a restart, the reservation is still there, counted once');
sleep 1.6;    # the emulator finishes the charge the proxy forwarded
$emulator->configure(latency_ms => 0);
my $retry = $proxy->charge($key->{vault_key}, 'crash-1', amount => 2500);
is($retry->{status}, 200, 'a retry with the same Idempotency-Key gets the charge');
is(charges_for('crash-1'), 1, 'the emulator holds one charge for it');
is(budget(), '2500/0', 'settled once: 2,500 cents, nothing reserved');

# ---- database restart -------------------------------------------------------------------

my $pid = $proxy->pid;
my $requests = $emulator->stats->{requests};
$node->stop('fast');
my @down = map { $proxy->charge($key->{vault_key}, "db-down-$_", amount => 100) } 1 .. 3;
is(join(' ', map { "$_->{status} " . ($_->{json}{error}{code} // '') } @down),
	join(' ', ('503 ledger_unavailable') x 3), 'with the database down, charges get 503');
is($proxy->request('GET', '/healthz', undef)->{status}, 503, '... and /healthz says 503');
is($emulator->stats->{requests}, $requests, '... and nothing is forwarded (fail closed)');
$node->start;
ok(wait_until('a charge to pass after the restart', 30, sub {
	$proxy->charge($key->{vault_key}, 'db-back', amount => 100)->{status} == 200 }),
	'once the database is back, charges pass');
is($proxy->pid, $pid, '... served by the same proxy process, which reconnected by itself');
is(charges_for('db-back'), 1, '... with one charge at the emulator');
is(budget(), '2600/0', 'settled 2,600 cents: the refused charges counted nothing');

# ---- Stripe hangs ---------------------------------------------------------------------

$emulator->add_fault(kind => 'hang', count => 1);
my $hung = $proxy->charge($key->{vault_key}, 'hang-1', amount => 400);
is("$hung->{status} $hung->{json}{error}{type} " . ($hung->{headers}{'stripe-should-retry'} // ''), '502 api_error true',
	'a hanging Stripe gets the proxy\'s timeout: 502, retry');
is(budget(), '2600/400', 'nothing is settled as a success; the amount stays reserved');
is($node->q1(q{SELECT decision || ' ' || http_status FROM billguard.vault_audit WHERE idempotency_key = 'hang-1' ORDER BY occurred_at DESC LIMIT 1}),
	'unknown 0', 'the audit trail says the outcome is unknown, no answer');
is($proxy->charge($key->{vault_key}, 'hang-1', amount => 400)->{status}, 200, 'a retry with the same key is charged');
is(budget(), '3000/0', '... and settles the reservation once');
is(charges_for('hang-1'), 1, 'one charge at the emulator');

$proxy->stop;
$emulator->stop;
$node->stop;
done_testing();
