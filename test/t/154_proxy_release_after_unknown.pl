# A reservation is released only when no attempt of its key can have
# charged. Attempt 1 of a key charges, but its answer is lost (Stripe
# answers after the proxy's timeout); Stripe then forgets the key
# (--idempotency-ttl 3). Attempt 2 of the same key:
#   - with another Stripe-Version, under which Stripe would refuse it (400
#     on return_url): the ledger's digest covers Stripe-Version, so it is
#     Stripe's idempotency_error at the proxy, never forwarded, and the
#     reservation stays;
#   - with the same request, refused by Stripe (a 402): attempt 1 is still
#     in doubt, so the refusal does not release it.
# Either way a second charge of the period finds the cap (1 USD) still held
# (429), and the emulator never holds more than the cap.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $node = BillguardNode->preloaded('release_after_unknown');
my $emulator = start_emulator(idempotency_ttl => 3);
# The proxy's own window (23 h) and quiet time are left long: only the
# ledger's rule for releases is at work.
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	args => [ '--upstream-timeout', '2' ]);
sub charged_cents { my $c = 0; $c += $_->{amount} for @{ succeeded_charges($emulator) }; return $c }
sub status_of_key {
	my ($idem) = @_;
	my ($rc, $out) = $node->psql('postgres',
		"SELECT status || ' ' || attempts_in_doubt::text FROM billguard.vault_reservations WHERE idempotency_key = '$idem'");
	return $out;
}
sub charge {
	my ($key, $idem, $version) = @_;
	return $proxy->request('POST', '/v1/payment_intents',
		ProxyHarness::charge_body(amount => 100, 'metadata[billguard_key]' => $idem),
		vault_key => $key->{vault_key}, idempotency_key => $idem,
		headers => { 'Stripe-Version' => $version // '2020-08-27' });
}
# Attempt 1: charged at Stripe after the proxy gave up waiting; then Stripe
# forgets the key.
sub lost_charge {
	my ($key, $idem) = @_;
	$emulator->configure(latency_ms => 3000);
	my $first = charge($key, $idem);
	$emulator->configure(latency_ms => 0);
	sleep 4;
	return $first;
}

for my $case ([ 'another Stripe-Version', '2026-08' ], [ 'a refusal by Stripe', '2026-09' ]) {
	my ($what, $period) = @$case;
	$emulator->reset;
	my $key = $proxy->issue_key(billing_period => $period, period_usd_cap => 1);
	my $idem = "first-$period";
	is(lost_charge($key, $idem)->{status}, 502, "$what: attempt 1's answer is lost");
	is(charged_cents(), 100, "$what: ... though Stripe charged 100 cents");
	my $second;
	if ($what eq 'another Stripe-Version') {
		my $requests = $emulator->stats->{requests};
		$second = charge($key, $idem, '2024-06-20');
		is("$second->{status} $second->{json}{error}{type}", '400 idempotency_error',
			"$what: attempt 2 is Stripe's idempotency_error at the proxy");
		is($emulator->stats->{requests}, $requests, "$what: ... never forwarded");
	} else {
		$emulator->add_fault(kind => 'status', status => 402, count => 1);
		$second = charge($key, $idem);
		is($second->{status}, 402, "$what: attempt 2 is refused by Stripe (402)");
		like($node->q1("SELECT reason FROM billguard.vault_audit WHERE idempotency_key = '$idem' ORDER BY occurred_at DESC LIMIT 1"),
			qr/^402 api_error to attempt 2, but attempt 1 of the key may have charged: kept reserved until reconciled$/,
			"$what: the audit trail says why it stays reserved");
	}
	is(status_of_key($idem), 'reserved {1}', "$what: the reservation stays, attempt 1 in doubt");
	my $other = charge($key, "other-$period");
	is($other->{status}, 429, "$what: another charge of the period finds the cap held: 429");
	is(charged_cents(), 100, "$what: the emulator holds 100 cents, the cap, not 200");
	my $s = $proxy->key_status($key->{key_id});
	is("$s->{settled_cents}/$s->{reserved_cents}", '0/100', "$what: the ledger counts the 100 cents");
}

$proxy->stop;
$emulator->stop;
$node->stop;
done_testing();
