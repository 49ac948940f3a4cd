# A cap refusal while other reservations of the budget are still open (in
# flight, declined but not yet settled, of unknown outcome) is a throttle:
# 429 spend_cap_pending with Stripe-Should-Retry: true, which the
# dispatcher retries with the same key. Only when what has settled leaves
# no room is it 429 spend_cap_exceeded, final, and the record blocked.
#   - over HTTP: three charges fill a 3 USD cap while Stripe takes its
#     time, two of them declined; a fourth meanwhile is spend_cap_pending;
#     once the declines are settled it passes; with the cap full of settled
#     charges the next is spend_cap_exceeded;
#   - with the dispatcher: ten records race for a budget of five charges,
#     half of them declined: every good one is charged, none is blocked
#     (before, a good charge refused while a decline held its room ended
#     blocked); a declined one sent after the good ones had settled and
#     filled the cap is blocked, as it should be. Their records were claimed past billguard.idempotency_window,
#     so the dispatcher searched for each through the proxy first.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use SecretFile qw(write_secret_file);
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $emulator = start_emulator();
my $node = BillguardNode->preloaded('cap_throttle_race', BillguardNode::dispatcher_conf(),
	"billguard.max_inflight = 16",
	"billguard.idempotency_window = '1s'");
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator);
sub error_of { my ($a) = @_; return ($a->{status} // 0) . ' ' . ($a->{json}{error}{code} // '') . ' ' . ($a->{headers}{'stripe-should-retry'} // '') }

# ---- over HTTP ---------------------------------------------------------------------------------

my $key = $proxy->issue_key(billing_period => '2026-07', period_usd_cap => 3);
sub charge { my ($idem, $method) = @_; return $proxy->charge($key->{vault_key}, $idem, amount => 100, payment_method => $method // 'pm_card_visa') }
$emulator->configure(latency_ms => 1500);
my @sockets = map {
	my ($idem, $method) = @$_;
	$proxy->send_charge($key->{vault_key}, $idem, ProxyHarness::charge_body(amount => 100, payment_method => $method))
} ([ 'declined-1', 'pm_card_chargeDeclined' ], [ 'declined-2', 'pm_card_chargeDeclined' ], [ 'good-1', 'pm_card_visa' ]);
ok(wait_until('three reservations', 10, sub {
	$node->q1(q{SELECT count(*) FROM billguard.vault_reservations WHERE billing_period = '2026-07' AND status = 'reserved'}) eq '3' }),
	'three charges in flight hold the whole cap');
$emulator->configure(latency_ms => 0);
is(error_of(charge('good-2')), '429 spend_cap_pending true',
	'a fourth meanwhile: 429 spend_cap_pending, Stripe-Should-Retry: true');
my @answers = map { my $a = StripeEmulatorHarness::read_response($_, 30); close $_; $a } @sockets;
is(join(' ', map { $_->{status} } @answers), '402 402 200', 'the two declines are refused, the third charged');
is(charge('good-2')->{status}, 200, 'the fourth, sent again with the same key, passes');
is(charge('good-3')->{status}, 200, 'a fifth fills the cap');
is(error_of(charge('good-4')), '429 spend_cap_exceeded false',
	'with the cap full of settled charges: 429 spend_cap_exceeded, Stripe-Should-Retry: false');

# ---- with the dispatcher ----------------------------------------------------------------------

# The budget of five charges, made by the admin; the dispatcher joins it at
# its cap (the proxy's 409 budget_cap_differs).
$proxy->issue_key(as => 'admin', billing_period => '2026-08', period_usd_cap => 5);
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT 'cust_' || lpad(g::text, 6, '0'), 'cus_' || lpad(g::text, 6, '0'), 100, 'usd',
	       CASE WHEN g % 2 = 0 THEN 'pm_card_chargeDeclined' ELSE 'pm_card_visa' END
	  FROM generate_series(1, 10) g});
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-08')"), '10', 'ten records claimed');
sleep 1.5;    # past billguard.idempotency_window: each is searched for first
$emulator->configure(latency_ms => 300);
my $token_file = write_secret_file($node->basedir . '/issuer.token', $proxy->issuer_token);
$node->reload_with(api_base => $proxy->url(''), vault_issuer_token_file => $token_file);
ok($node->wait_until_settled('2026-08', 60), 'every record settles');
my $by_card = q{SELECT string_agg(status || '=' || n, ' ' ORDER BY status) FROM (
	SELECT r.status, count(*) n FROM billguard.billing_records r JOIN billguard.accounts a USING (customer_id)
	 WHERE r.billing_period = '2026-08' AND a.payment_method = '%s' GROUP BY 1) s};
is($node->q1(sprintf($by_card, 'pm_card_visa')), 'completed=5', 'the five good cards are all charged, none blocked');
like($node->q1(sprintf($by_card, 'pm_card_chargeDeclined')), qr/^(blocked=\d )?failed=\d$/,
	'the five declined fail, or, sent once the good ones had settled and filled the cap, are blocked');
my $charged = 0;
$charged += $_->{amount} for grep { ($_->{metadata}{billing_period} // '') eq '2026-08' } @{ succeeded_charges($emulator) };
is($charged, 500, 'the emulator holds 500 cents for the period: the cap');
cmp_ok($node->q1(q{SELECT count(*) FROM billguard.vault_audit WHERE billing_period = '2026-08'
	AND decision = 'refused' AND http_status = 429}), '>', 0, 'the race was real: some charges were refused while others held the cap');
is($node->q1(q{SELECT count(*) FROM billguard.billing_records r JOIN billguard.accounts a USING (customer_id)
	WHERE r.status = 'blocked' AND (a.payment_method <> 'pm_card_chargeDeclined'
	   OR r.last_error NOT LIKE '429 invalid_request_error/spend_cap_exceeded: %')}), '0',
	'a record is blocked only by spend_cap_exceeded, never while the cap was held by open reservations');
cmp_ok($node->q1(q{SELECT count(*) FROM billguard.vault_audit WHERE billing_period = '2026-08'
	AND decision = 'forwarded' AND endpoint = '/v1/payment_intents/search'}), '>=', 10,
	'each record was searched for first, through the proxy');
$emulator->configure(latency_ms => 0);

$proxy->stop;
$emulator->stop;
$node->stop;
done_testing();
