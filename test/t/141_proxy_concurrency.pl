# The spend cap holds at any concurrency, and a retry is one charge.
# Against a real proxy, a real database and the emulator:
#   - 1,000 requests of 50 cents (Stripe's USD minimum), each with its own
#     Idempotency-Key, all in flight at once against a 50 USD cap: exactly
#     100 are charged at the emulator, 900 get 429: spend_cap_pending (retry)
#     while the cap was held by charges still in flight, else "spend cap
#     exceeded for billing_period 2026-08" (final); each pending one, sent
#     again once all have settled, is spend_cap_exceeded; settled = 5,000
#     cents, nothing left reserved, and every refusal is audited;
#   - one request sent 20 times with one Idempotency-Key, one after the
#     other, and another sent 20 times at once: one charge each at the
#     emulator, each counted once.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $node = BillguardNode->preloaded('proxy_concurrency');
my $emulator = start_emulator();
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator);

# ---- 1,000 at once against a cap of 100 charges ---------------------------------

my $key = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => 50);
my @answers = $proxy->concurrently(map { {
	method => 'POST', path => '/v1/payment_intents', vault_key => $key->{vault_key},
	idempotency_key => sprintf('race-%04d', $_),
	body => ProxyHarness::charge_body(amount => 50, customer => sprintf('cus_%04d', $_)) } } 1 .. 1000);

my %by_status;
$by_status{ $_->{status} // ($_->{timed_out} ? 'timeout' : 'closed') }++ for @answers;
is(join(' ', map { "$_=$by_status{$_}" } sort keys %by_status), '200=100 429=900',
	'of 1,000 concurrent 50-cent charges against 50 USD, 100 pass and 900 get 429');
my @exceeded = grep { ($_->{json}{error}{code} // '') eq 'spend_cap_exceeded'
	&& ($_->{json}{error}{message} // '') eq 'spend cap exceeded for billing_period 2026-08'
	&& ($_->{headers}{'stripe-should-retry'} // '') eq 'false' } @answers;
my @pending = grep { ($_->{json}{error}{code} // '') eq 'spend_cap_pending'
	&& ($_->{headers}{'stripe-should-retry'} // '') eq 'true' } @answers;
is(@exceeded + @pending, 900, 'every 429 is spend_cap_exceeded (Stripe-Should-Retry: false, "spend cap exceeded '
	. 'for billing_period 2026-08") or, while the cap was held by charges in flight, spend_cap_pending (true)');
diag(scalar(@exceeded) . ' exceeded, ' . scalar(@pending) . ' pending');
my @pending_keys = map { sprintf('race-%04d', $_ + 1) }
	grep { ($answers[$_]{json}{error}{code} // '') eq 'spend_cap_pending' } 0 .. $#answers;
my @again = map { $proxy->charge($key->{vault_key}, $_, amount => 50, customer => 'cus_' . substr($_, 5)) } @pending_keys;
is(scalar(grep { $_->{status} == 429 && ($_->{json}{error}{code} // '') eq 'spend_cap_exceeded' } @again),
	scalar(@pending_keys), '... and each pending one, sent again once all have settled, is spend_cap_exceeded');
is(scalar(@{ succeeded_charges($emulator) }), 100, 'the emulator holds exactly 100 charges');
my $status = $proxy->key_status($key->{key_id});
is("$status->{settled_cents}/$status->{reserved_cents}", '5000/0', 'settled = 5,000 cents, nothing reserved');
is($node->q1(q{SELECT count(*) FROM billguard.vault_audit WHERE billing_period = '2026-08'
	AND decision = 'refused' AND http_status = 429 AND amount_cents = 50 AND customer LIKE 'cus\_%'}),
	900 + @pending_keys, 'each refusal is audited with its customer and amount');

# ---- one Idempotency-Key, 20 times -----------------------------------------------

my $once = $proxy->issue_key(billing_period => '2026-09', period_usd_cap => 50);
my @ids = map { $proxy->charge($once->{vault_key}, 'same-key-sequential', amount => 50)->{json}{id} // 'none' } 1 .. 20;
is(scalar(keys %{ { map { ($_ => 1) } @ids } }), 1, 'the same request sent 20 times in a row gets one charge id');
my @at_once = $proxy->concurrently(map { {
	method => 'POST', path => '/v1/payment_intents', vault_key => $once->{vault_key},
	idempotency_key => 'same-key-concurrent', body => ProxyHarness::charge_body(amount => 50) } } 1 .. 20);
is(scalar(grep { ($_->{status} // 0) != 200 && ($_->{status} // 0) != 409 } @at_once), 0,
	'sent 20 times at once, each answer is the charge or Stripe\'s 409 key in use');
my $retry = $proxy->charge($once->{vault_key}, 'same-key-concurrent', amount => 50);
is($retry->{status}, 200, 'a retry after them gets the charge');
my %keys = map { (($_->{idempotency_key} // '') => 1) } @{ succeeded_charges($emulator) };
is(scalar(grep { /^same-key/ } keys %keys), 2, 'the emulator holds one charge per Idempotency-Key');
is(scalar(@{ succeeded_charges($emulator) }), 102, '... and 102 charges in all');
$status = $proxy->key_status($once->{key_id});
is("$status->{settled_cents}/$status->{reserved_cents}", '100/0', 'each key is counted once: settled 100 cents');

$proxy->stop;
$emulator->stop;
$node->stop;
done_testing();
