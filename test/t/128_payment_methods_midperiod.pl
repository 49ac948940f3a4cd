# A PaymentIntent says how it may be paid (automatic_payment_methods
# enabled, allow_redirects never), so an account's API version from
# 2023-08-16 on does not ask it for a return_url. The change comes in the
# middle of a period: records whose first attempt went out with the old
# body keep it and are re-sent with it, so Stripe replays their first
# answer instead of refusing a different request under the same key
# (idempotency_error). The emulator is the opponent: billguard sends
# Stripe-Version 2024-06-20, under which a new PaymentIntent with the old
# body is refused (400 return_url), and a key re-used with other parameters
# gets idempotency_error.
#
#   upgrade   records 0.1.0 had sent (by hand here, with 0.1.0's body, byte
#             for byte, under an API version that took it) are in flight
#             across ALTER EXTENSION billguard UPDATE: one whose answer was
#             lost (the charge was made), one whose answer was a 500 cached
#             with the charge made. The update stores 0.1.0's body for
#             both; both are re-sent with it and completed with their one
#             charge
#   0.2.0     a record whose stored body is the old form gets a 500 (charge
#             made) under the old API version; the API version is then
#             raised to 2024-06-20: the search misses it, the old body is
#             re-sent, the cached 500 replayed, a later search finds it:
#             completed, one charge
#   new       a record billed now carries the new parameters (the
#             emulator's ledger shows them) and is charged under 2024-06-20
# Every key: exactly one charge, no idempotency_error at the emulator.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use JSON::PP;
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('midperiod', $emulator, { extension_version => '0.1.0' },
	"billguard.search_settle_delay = '0'",
	"billguard.max_unknown_cycles = 1000");
$node->add_accounts(5);
my $period = '2031-05';
my $old_version = '2022-11-15';    # an API version under which 0.1.0's body charged

# What 0.1.0 sent for a record of add_accounts, encoded here independently
# of billguard's encoder: every byte but A-Z a-z 0-9 - _ . ~ percent-encoded,
# spaces as '+'.
sub body_010 {
	my ($customer) = @_;
	my ($n) = $customer =~ /(\d+)$/;
	my @fields = (
		amount => 1000 + $n % 500, currency => 'usd', customer => "cus_$n", payment_method => 'pm_card_visa',
		confirm => 'true', off_session => 'true', description => "billguard $customer $period",
		'metadata[billguard_key]' => $node->key_of($customer, $period),
		'metadata[billing_period]' => $period, 'metadata[customer_id]' => $customer);
	my @pairs;
	while (my ($name, $value) = splice(@fields, 0, 2)) {
		push @pairs, join('=', map { s/([^A-Za-z0-9\-_.~ ])/sprintf('%%%02X', ord $1)/ger =~ tr/ /+/r } $name, $value);
	}
	return join('&', @pairs);
}

sub stored_body {
	my ($customer) = @_;
	return $node->q1("SELECT request_body FROM billguard.billing_records WHERE customer_id = '$customer' AND billing_period = '$period'");
}

# ---- upgrade: records 0.1.0 had sent, in flight across the update ---------------
my ($lost, $cached) = ('cust_000001', 'cust_000002');
is($node->bill($_, $period), 'initiated', "0.1.0: $_ billed") for $lost, $cached;
is($emulator->add_fault(kind => 'commit_then_drop', count => 1)->{json}{queued}, 1, 'upgrade: the first answer will be lost');
$emulator->request('POST', '/v1/payment_intents', body_010($lost), idempotency_key => $node->key_of($lost, $period),
	headers => { 'Stripe-Version' => $old_version });
is($emulator->add_fault(kind => 'status', status => 500, count => 1)->{json}{queued}, 1,
	'upgrade: the second answer will be a 500, cached, with the charge made');
is($emulator->request('POST', '/v1/payment_intents', body_010($cached), idempotency_key => $node->key_of($cached, $period),
	headers => { 'Stripe-Version' => $old_version })->{status}, 500, 'upgrade: 0.1.0 got a 500 for the second');
is(scalar(@{ succeeded_charges($emulator) }), 2, 'upgrade: both were charged at the emulator');
# As 0.1.0's dispatcher left them: claimed, sent, no answer recorded.
$node->q1(qq{UPDATE billguard.billing_records SET status = 'dispatching', attempts = 1, first_dispatched_at = now(),
	next_attempt_at = now() WHERE customer_id IN ('$lost', '$cached')});

$node->q1('ALTER EXTENSION billguard UPDATE');
is(stored_body($lost), body_010($lost), 'upgrade: the record whose answer was lost keeps 0.1.0\'s body, byte for byte');
is(stored_body($cached), body_010($cached), 'upgrade: the record with a cached 500 keeps 0.1.0\'s body, byte for byte');
ok($node->wait_until_settled($period, 60), 'upgrade: both settle');
for my $c ($lost, $cached) {
	my $charges = succeeded_for_key($emulator, $node->key_of($c, $period));
	is(scalar(@$charges), 1, "upgrade: $c has exactly one charge");
	is($node->record_of($c, $period) =~ s/\|\d+$//r, 'completed|' . ($charges->[0]{id} // ''),
		"upgrade: $c completed with that charge");
}
like($node->event_types($lost, $period), qr/,BillingCompleted$/, 'upgrade: the lost answer was replayed');
is($node->events_of($lost, $period, 'BillingCompleted')->[0]{replayed}, JSON::PP::true,
	'upgrade: ... as a replay of the first request');
like($node->event_types($cached, $period), qr/ChargeUnknown,ChargeAttempted,ChargeReconciled$/,
	'upgrade: the cached 500 was replayed to the re-send, then the search found the charge');
is($emulator->stats->{idempotency_conflicts}, 0, 'upgrade: no idempotency_error');

# ---- 0.2.0: a stored old body re-sent after the API version changed ---------------
my $resent = 'cust_000003';
$node->reload_with(api_key_file => '');    # paused: the test stores the old body before the first claim
ok(wait_until('the dispatcher to pause', 20, sub { $node->q1('SELECT paused FROM billguard.dispatch_status') eq 't' }),
	'0.2.0: the dispatcher is paused');
is($node->bill($resent, $period), 'initiated', '0.2.0: billed');
$node->q1(qq{UPDATE billguard.billing_records SET stripe_endpoint = '/v1/payment_intents', request_body = '@{[ body_010($resent) ]}'
	WHERE customer_id = '$resent' AND billing_period = '$period'});
$emulator->configure(search_delay_ms => 600000);    # the searches miss the charge until told otherwise
$emulator->add_fault(kind => 'status', status => 500, count => 1);
$node->reload_with(api_key_file => $node->basedir . '/stripe.key', stripe_version => $old_version,
	search_settle_delay => '1h');
ok(wait_until('the 500', 30, sub { $node->status_of($resent, $period) eq 'unknown' }),
	'0.2.0: the first attempt got a 500 (charge made, cached) under the old API version');
is(scalar(@{ succeeded_for_key($emulator, $node->key_of($resent, $period)) }), 1, '0.2.0: the charge exists');
$node->reload_with(stripe_version => '2024-06-20', search_settle_delay => '0');
ok(wait_until('the reload', 20, sub { $node->q1('SHOW billguard.stripe_version') eq '2024-06-20' }), '0.2.0: the API version is raised');
sleep 1;    # the dispatcher's loop takes the reload
my $replayed = $emulator->stats->{replayed};
$node->q1("UPDATE billguard.billing_records SET next_attempt_at = now() WHERE customer_id = '$resent' AND billing_period = '$period'");
ok(wait_until('a re-send replayed', 30, sub { $emulator->stats->{replayed} > $replayed }),
	'0.2.0: the search missed, the old body was re-sent and the cached 500 replayed');
$emulator->configure(search_delay_ms => 0);
ok(wait_until('completed', 60, sub { $node->status_of($resent, $period) eq 'completed' }), '0.2.0: completed');
my $charges = succeeded_for_key($emulator, $node->key_of($resent, $period));
is(scalar(@$charges), 1, '0.2.0: exactly one charge');
is($node->record_of($resent, $period) =~ s/^(\w+\|[^|]*)\|\d+$/$1/r, 'completed|' . ($charges->[0]{id} // ''),
	'0.2.0: completed with it');
is(stored_body($resent), body_010($resent), '0.2.0: the stored body is still the old one');
is($emulator->stats->{idempotency_conflicts}, 0, '0.2.0: no idempotency_error');

# ---- new: a record billed now carries the new parameters ---------------------------
my $new = 'cust_000004';
is($node->bill($new, $period), 'initiated', 'new: billed');
ok(wait_until('completed', 30, sub { $node->status_of($new, $period) !~ /^(pending|dispatching|unknown)$/ }), 'new: settles');
is($node->status_of($new, $period), 'completed', 'new: charged under API version 2024-06-20');
is(stored_body($new), body_010($new) =~ s/&off_session=true&/&off_session=true&automatic_payment_methods%5Benabled%5D=true&automatic_payment_methods%5Ballow_redirects%5D=never&/r,
	'new: its body says how it may be paid');
my ($object) = @{ succeeded_for_key($emulator, $node->key_of($new, $period)) };
is_deeply([ $object->{automatic_payment_methods}, $object->{payment_method_types} ],
	[ { enabled => JSON::PP::true, allow_redirects => 'never' }, [] ],
	'new: the emulator received automatic payment methods without redirects');
for my $c ($lost, $cached, $resent) {
	my ($old) = @{ succeeded_for_key($emulator, $node->key_of($c, $period)) };
	is_deeply([ $old->{automatic_payment_methods}, $old->{payment_method_types} ], [ undef, ['card'] ],
		"the charge of $c was made with the old body (cards, as the old API version had it)");
}
my $by_key = charges_by_key($emulator);
is(scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key) . '/' . scalar(keys %$by_key), '0/4', 'four keys, one charge each');
is($emulator->stats->{idempotency_conflicts}, 0, 'no idempotency_error in all');

$node->stop;
$emulator->stop;
done_testing();
