# A key still reserved after Stripe has forgotten it is never forwarded
# blind. The emulator forgets keys after 3 seconds (--idempotency-ttl 3);
# the proxy trusts Stripe's memory for 2 (--idempotency-window 2). A charge
# whose answer was lost stays reserved; sent again past the window:
#   - the charge was made (Stripe answered after the proxy's timeout, and
#     had made the PaymentIntent): the proxy finds it by Stripe's
#     search, settles the reservation from it and replays it: 1 charge, 1
#     counted (forwarded, it would have been a second PaymentIntent);
#   - the same while Stripe's search lags a minute: the customer's list,
#     which is immediately consistent, finds it;
#   - the request carries no metadata[billguard_key]: nothing can be looked
#     up, so the proxy answers 409 reservation_reconciling (Stripe-Should-
#     Retry: true) and forwards nothing, for as long as that holds;
#   - nothing was made (Stripe hung before executing): first 409 while the
#     last attempt is recent, then, once quiet for --reconcile-after, the
#     list proves the absence, the reservation is released and the request
#     goes on as a new charge: 1 charge, 1 counted.
# The extension's dispatcher treats the 409 as a throttle (unit tests in
# test/unit/stripe_response_test.cpp).
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $node = BillguardNode->preloaded('reserved_past_window');
my $emulator = start_emulator(idempotency_ttl => 3);
# A quiet time far longer than the test: Stripe's silence never counts here,
# and the background reconciler never looks at these reservations.
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	args => [ '--idempotency-window', '2', '--reconcile-after', '600', '--upstream-timeout', '2' ]);
my $key = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => 100);
sub budget { my $s = $proxy->key_status($key->{key_id}); return "$s->{settled_cents}/$s->{reserved_cents}" }
sub charges_for {
	my ($idem) = @_;
	return scalar(grep { ($_->{idempotency_key} // '') eq $idem } @{ succeeded_charges($emulator) });
}
sub charge {
	my ($idem, %params) = @_;
	return $proxy->charge($key->{vault_key}, $idem, amount => 1000, customer => "cus_" . ($idem =~ s/\W//gr),
		'metadata[billguard_key]' => $idem, %params);
}
sub forwarded { return $emulator->stats->{requests} }
sub audit_of {
	my ($idem, $decision) = @_;
	return $node->q1(qq{SELECT string_agg(reason, ' | ' ORDER BY occurred_at) FROM billguard.vault_audit
	                     WHERE idempotency_key = '$idem' AND decision = '$decision'});
}
# The charge is made after the proxy gave up waiting: its answer is lost.
sub charge_answered_late {
	my ($idem, $charge) = @_;
	$emulator->configure(latency_ms => 3000);
	my $answer = $charge->();
	$emulator->configure(latency_ms => 0);
	sleep 4;    # the charge is made at 3 s; the emulator forgets the key at 3 s
	return $answer;
}

# ---- the charge was made, its answer lost -------------------------------------------------------

my $lost = charge_answered_late('made-1', sub { charge('made-1') });
is("$lost->{status} " . ($lost->{json}{error}{code} // ''), '502 upstream_unavailable', 'the answer is lost: 502');
is(budget(), '0/1000', 'the amount stays reserved');
is(charges_for('made-1'), 1, 'Stripe made the charge');
my $again = charge('made-1');
is($again->{status}, 200, 'sent again past the window, the key is answered 200');
is($again->{headers}{'idempotent-replayed'} // '', 'true', '... replayed from the ledger');
is($again->{json}{id}, ledger_for_key($emulator, 'made-1')->[0]{id},
	'... with the PaymentIntent the first attempt made');
is(charges_for('made-1'), 1, 'one charge at the emulator');
is(budget(), '1000/0', 'counted once, settled');
like(audit_of('made-1', 'settled'), qr/^reconciled with Stripe: found pi_\w+ by Stripe's search/,
	'the audit trail says it was reconciled, found by the search');
my $third = charge('made-1');
is("$third->{status} $third->{json}{id}", "200 $again->{json}{id}", 'a third try is replayed too');
is(charges_for('made-1'), 1, '... still one charge');

# ---- the same while Stripe's search lags ------------------------------------------------------

$emulator->configure(search_delay_ms => 60000);
is(charge_answered_late('made-2', sub { charge('made-2') })->{status}, 502, 'another charge whose answer is lost');
$again = charge('made-2');
is("$again->{status} " . ($again->{headers}{'idempotent-replayed'} // ''), '200 true',
	'sent again past the window while search lags, it is replayed');
is(charges_for('made-2'), 1, 'one charge at the emulator');
like(audit_of('made-2', 'settled'), qr/^reconciled with Stripe: found pi_\w+ in the list of cus_made2's objects/,
	'... found in the customer\'s list, which is immediately consistent');
is(budget(), '2000/0', 'counted once');
$emulator->configure(search_delay_ms => 0);

# ---- nothing to look it up by ------------------------------------------------------------------

my $bare = sub { $proxy->charge($key->{vault_key}, 'bare-1', amount => 1000) };
is(charge_answered_late('bare-1', $bare)->{status}, 502, 'a charge without metadata[billguard_key] whose answer is lost');
my $before = forwarded();
my $refused = $bare->();
is("$refused->{status} $refused->{json}{error}{type} $refused->{json}{error}{code}", '409 api_error reservation_reconciling',
	'sent again past the window, it is 409 reservation_reconciling');
is($refused->{headers}{'stripe-should-retry'} // '', 'true', '... with Stripe-Should-Retry: true');
like($refused->{json}{error}{message},
	qr/^Idempotency-Key bare-1 is still reserved past the proxy's idempotency window, and what its attempts did is not known yet: the request carried no metadata\[billguard_key\] to look its charge up by\. Nothing was sent to Stripe; retry later with the same Idempotency-Key\.$/,
	'... saying why');
is($bare->()->{status}, 409, '... and again');
is(forwarded(), $before, 'nothing was forwarded');
is(charges_for('bare-1'), 1, 'one charge at the emulator');
is(budget(), '2000/1000', 'the amount stays reserved: the cap still counts it');

# ---- nothing was made -------------------------------------------------------------------------

my $quick = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	args => [ '--idempotency-window', '2', '--reconcile-after', '6', '--upstream-timeout', '2' ]);
$emulator->add_fault(kind => 'hang', count => 1);
my $started = time;
my $hung = $quick->charge($key->{vault_key}, 'hung-1', amount => 1000, customer => 'cus_hung',
	'metadata[billguard_key]' => 'hung-1');
is($hung->{status}, 502, 'Stripe hangs before executing: 502 after the timeout');
sleep 2.5 - (time - $started) if time - $started < 2.5;
$before = forwarded();
my $early = $quick->charge($key->{vault_key}, 'hung-1', amount => 1000, customer => 'cus_hung',
	'metadata[billguard_key]' => 'hung-1');
is("$early->{status} " . ($early->{json}{error}{code} // ''), '409 reservation_reconciling',
	'sent again past the window but within the quiet time: 409');
like($early->{json}{error}{message}, qr/its last attempt was forwarded \d s ago/, '... because the last attempt is recent');
my $answer;
ok(wait_until('the key to go through', 20, sub {
	$answer = $quick->charge($key->{vault_key}, 'hung-1', amount => 1000, customer => 'cus_hung',
		'metadata[billguard_key]' => 'hung-1');
	$answer->{status} != 409 }), 'once quiet for --reconcile-after, the key goes through');
is($answer->{status}, 200, '... charged');
is(charges_for('hung-1'), 1, 'one charge at the emulator');
like($node->q1(q{SELECT reason FROM billguard.vault_audit WHERE idempotency_key = 'hung-1' AND decision = 'released'}),
	qr/^reconciled with Stripe: no charge carries metadata\[billguard_key\] hung-1: not in Stripe's search, nor among the 0 objects of cus_hung since /,
	'the absence was proved by the list before the reservation was released');
is(budget(), '3000/1000', 'counted once');

$quick->stop;
$proxy->stop;
$emulator->stop;
$node->stop;
done_testing();
