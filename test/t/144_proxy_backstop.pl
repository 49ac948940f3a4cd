# The backstop when the guards in front of it fail (a restored backup, and
# the guards bypassed, at the HTTP level; the dispatcher-driven versions come
# with the dispatcher's integration). 100 accounts of 2026-08 are charged
# through the proxy, each with its billguard key, under a cap of the
# period's total x 1.10. Then:
#   - a restored backup: past the emulator's idempotency TTL (it has
#     forgotten every key), the same 100 requests come again, through a key
#     issued again for the period: each is answered from the ledger
#     (Idempotent-Replayed, the original charge), 0 new charges;
#   - guards bypassed: the period is billed again under another key
#     namespace (every key new): charges pass only while the cap has room,
#     every other one is 429 and audited with customer, amount and key id,
#     and the emulator's total for the period never passes the cap;
#   - pg_dump and pg_restore carry the ledger: a proxy on the restored
#     database still answers a repeat from it, and refuses past the cap.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $node = BillguardNode->preloaded('proxy_backstop');
my $emulator = start_emulator();
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator);
$node->add_accounts(100);
my @accounts = map { [ split /\|/ ] } split /\n/, $node->q1(q{
	SELECT customer_id || '|' || stripe_customer || '|' || amount_cents FROM billguard.accounts ORDER BY 1});
my $total = 0;
$total += $_->[2] for @accounts;
my $cap_cents = $total * 110 / 100;
my $cap_usd = sprintf('%.2f', $cap_cents / 100);
is($cap_cents, int($cap_cents), "the cap is the period's total x 1.10 in whole cents: $cap_usd USD");

# Every account's charge for the period, keyed as billguard keys it.
sub bill_through {
	my ($vault_key, $namespace) = @_;
	return map {
		my ($customer, $stripe_customer, $amount) = @$_;
		my $idem = $node->q1("SELECT billguard.idempotency_key('$customer', '2026-08', '$namespace')");
		[ $customer, $amount, $proxy->charge($vault_key, $idem, amount => $amount, customer => $stripe_customer,
			'metadata[billguard_key]' => $idem) ]
	} @accounts;
}

my $first = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => $cap_usd + 0);
my @billed = bill_through($first->{vault_key}, 'akka-billing');
is(scalar(grep { $_->[2]{status} == 200 } @billed), 100, 'the period is billed: 100 charges');
is(scalar(@{ succeeded_charges($emulator) }), 100, 'the emulator holds 100 charges');

# ---- a restored backup bills the period again, past Stripe's memory ---------------------------

$emulator->configure(idempotency_ttl => 1);
sleep 1.5;
my $reissued = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => $cap_usd + 0);
my @again = bill_through($reissued->{vault_key}, 'akka-billing');
is(scalar(grep { $_->[2]{status} == 200 && ($_->[2]{headers}{'idempotent-replayed'} // '') eq 'true' } @again), 100,
	'every request of the restored database is answered from the ledger, Idempotent-Replayed');
is(scalar(grep { $again[$_][2]{json}{id} eq $billed[$_][2]{json}{id} } 0 .. 99), 100, '... with the original charge');
is(scalar(@{ succeeded_charges($emulator) }), 100, '0 new charges at the emulator');

# ---- guards bypassed: every key new -----------------------------------------------------------

my @bypass = bill_through($reissued->{vault_key}, 'other-ns');
my ($room, $expected_passes) = ($cap_cents - $total, 0);
for (@accounts) { if ($_->[2] <= $room) { $room -= $_->[2]; $expected_passes++ } }
my @passed = grep { $_->[2]{status} == 200 } @bypass;
my @refused = grep { $_->[2]{status} == 429 } @bypass;
is(scalar(@passed), $expected_passes, "with every key new, only $expected_passes charges pass: those the cap has room for");
is(scalar(@refused), 100 - $expected_passes, 'every other one is refused with 429');
cmp_ok($expected_passes, '<=', 10, 'at most 10 more charges pass (the 10% headroom)');
my $audited = $node->q1(qq{
	SELECT count(*) FROM billguard.vault_audit
	 WHERE decision = 'refused' AND http_status = 429 AND billing_period = '2026-08'
	   AND key_id = '$reissued->{key_id}' AND customer LIKE 'cus\\_%' AND amount_cents > 0});
is($audited, 100 - $expected_passes, 'each refusal is in vault_audit with customer, amount and key id');
my $charged = 0;
$charged += $_->{amount} for @{ succeeded_charges($emulator) };
cmp_ok($charged, '<=', $cap_cents, "the emulator's total ($charged cents) never passes the cap ($cap_cents)");
my $status = $proxy->key_status($first->{key_id});
is($status->{settled_cents}, $charged, 'the budget\'s settled sum is the emulator\'s total');

# ---- pg_dump and pg_restore carry the ledger ----------------------------------------------------

my $dump = $node->basedir . '/ledger.dump';
my ($out, $err) = run_command([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ]);
is($err, '', 'pg_dump -Fc reports nothing');
$node->q1('CREATE DATABASE restored');
($out, $err) = run_command([ 'pg_restore', '-d', $node->connstr('restored'), $dump ]);
is($err, '', 'pg_restore reports nothing');
for my $table (qw(vault_budgets vault_keys vault_reservations vault_audit)) {
	my $rows = "SELECT count(*) || ' ' || md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM billguard.$table t";
	is($node->safe_psql('restored', $rows), $node->q1($rows), "every row of billguard.$table arrived");
}
my $restored = ProxyHarness->start(conninfo => $node->connstr('restored'), upstream => $emulator);
my ($customer, $stripe_customer, $amount) = @{ $accounts[0] };
my $idem = $node->q1("SELECT billguard.idempotency_key('$customer', '2026-08', 'akka-billing')");
my $repeat = $restored->charge($reissued->{vault_key}, $idem, amount => $amount, customer => $stripe_customer,
	'metadata[billguard_key]' => $idem);
is("$repeat->{status} $repeat->{json}{id}", "200 $billed[0][2]{json}{id}",
	'a proxy on the restored database answers a repeat from its ledger');
is($restored->charge($reissued->{vault_key}, 'after-restore', amount => 1000)->{status}, 429,
	'... and refuses past the restored cap');
is(scalar(@{ succeeded_charges($emulator) }), 100 + $expected_passes, 'no charge was added by either');

$restored->stop;
$proxy->stop;
$emulator->stop;
$node->stop;
done_testing();
