# Three currencies through the proxy, and the dispatcher killed (kill -9)
# mid-period: the dispatcher bills USD, EUR and JPY records of one period
# through billguard-proxy, one vault key per currency, each budget capped at
# that currency's claimed total x vault_cap_headroom. Killed while charges
# of every currency are in flight, it is restarted by the postmaster and
# re-sends what was in flight with the same keys. Afterwards:
#   - every record completed, one charge per record at the emulator;
#   - three budgets, one per currency, each capped at its own total x 1.10
#     in its own smallest unit (yen have none);
#   - each budget's committed total equals the charges the emulator made in
#     that currency, all of them settled, none reserved: no charge is
#     counted twice or in another currency's budget, none escaped its cap.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use SecretFile qw(write_secret_file);
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $emulator = start_emulator(latency_ms => 40);
my $node = BillguardNode->preloaded('three_currencies_kill', BillguardNode::dispatcher_conf(),
	'billguard.max_inflight = 8', 'billguard.max_requests_per_second = 60', 'restart_after_crash = on');
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	issuer_max_period => ['100000.00:eur', '10000000:jpy']);
my $token_file = write_secret_file($node->basedir . '/issuer.token', $proxy->issuer_token);

# 60 accounts per currency, amounts that differ per account.
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT c.code || '_' || lpad(g::text, 4, '0'), 'cus_' || c.code || g,
	       CASE c.code WHEN 'jpy' THEN 500 + 7 * g ELSE 1000 + 13 * g END, c.code, 'pm_card_visa'
	  FROM generate_series(1, 60) g, (VALUES ('usd'), ('eur'), ('jpy')) c (code)});
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-08')"), '180', '180 records claimed in three currencies');
$node->reload_with(api_base => $proxy->url(''), vault_issuer_token_file => $token_file);

# Killed once charges of every currency have reached the emulator.
ok(wait_until('charges of every currency at the emulator', 60, sub {
	my %seen = map { ($_->{currency} // '') => 1 } @{ succeeded_charges($emulator) };
	return $seen{usd} && $seen{eur} && $seen{jpy};
}, interval => 0.02), 'charges of the three currencies are being made');
my $old = $node->dispatcher_pid;
my $in_flight = $node->q1(q{SELECT count(*) FROM billguard.billing_records WHERE status = 'dispatching'});
ok(kill('KILL', $old), "kill -9 of the dispatcher (pid $old) with $in_flight records dispatching");
my $charged_at_kill = scalar @{ succeeded_charges($emulator) };
cmp_ok($charged_at_kill, '<', 180, "... mid-period ($charged_at_kill of 180 charged)");
ok($node->wait_for_new_dispatcher($old, 60), 'the postmaster starts a new dispatcher');
ok($node->wait_until_settled('2026-08', 180), 'the period settles');

is($node->q1(q{SELECT string_agg(currency || '=' || status || '=' || n, ',' ORDER BY currency) FROM (
                 SELECT currency, status, count(*) n FROM billguard.billing_records GROUP BY 1, 2) s}),
	'eur=completed=60,jpy=completed=60,usd=completed=60', 'every record completed');
my $by_key = charges_by_key($emulator);
my @keys = split /\n/, $node->q1('SELECT idempotency_key FROM billguard.billing_records ORDER BY 1');
is(scalar(grep { @{ $by_key->{$_} // [] } == 1 } @keys), 180, 'one charge per record at the emulator');
is(scalar @{ succeeded_charges($emulator) }, 180, '... and no other');
cmp_ok($node->q1('SELECT count(*) FROM billguard.billing_records WHERE attempts > 1'), '>=', $in_flight ? 1 : 0,
	'what was in flight at the kill was sent again (with its key)');

my %charged;
$charged{ $_->{currency} } += $_->{amount} for @{ succeeded_charges($emulator) };
for my $currency (qw(usd eur jpy)) {
	my $total = $node->q1("SELECT sum(amount_cents) FROM billguard.billing_records WHERE currency = '$currency'");
	is($node->q1(qq{SELECT cap_cents FROM billguard.vault_budgets WHERE billing_period = '2026-08' AND currency = '$currency'}),
		$node->q1("SELECT ceil($total * 1.10)"), "the $currency budget is its own total ($total) x 1.10");
	is($node->q1(qq{SELECT committed_cents || ' ' || settled_cents || ' ' || reserved_cents FROM billguard.vault_spend
	                 WHERE billing_period = '2026-08' AND currency = '$currency'}),
		"$charged{$currency} $charged{$currency} 0",
		"the $currency budget's committed total is the $currency charged at the emulator ($charged{$currency}), all settled");
}
is($node->q1(q{SELECT count(*) FROM billguard.vault_budgets}), '3', 'three budgets, one per currency');
is($node->q1(q{SELECT count(*) FROM billguard.vault_reservations r JOIN billguard.billing_records b
                 ON b.idempotency_key = r.idempotency_key AND b.currency = r.currency}), '180',
	"each record's reservation is in its own currency's budget");
is($node->q1(q{SELECT count(*) FROM billguard.vault_audit WHERE decision = 'refused'}), '0', 'the proxy refused nothing');

$proxy->stop;
$node->stop;
$emulator->stop;
done_testing();
