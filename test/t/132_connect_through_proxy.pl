# Stripe Connect through billguard-proxy: the dispatcher bills two
# connected accounts and the platform, each customer cus_same on its own
# account, with the period's vault key, whose budget names the connected
# accounts the period's records charge on:
#   - three charges at the emulator, each on its own account, none twice,
#     acct_132A's with its application fee; the budget names acct_132A and
#     acct_132B, and the proxy's audit names the account of each charge;
#   - kill -9 of the dispatcher with the three charges in flight through
#     the proxy: each re-sent with its key on its own account only (one
#     object per key, on the record's account), and the budget's committed
#     total is what the emulator charged.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use SecretFile qw(write_secret_file);
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $emulator = start_emulator();
my $node = BillguardNode->preloaded('connect_proxy', BillguardNode::dispatcher_conf(), 'restart_after_crash = on');
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	issuer_max_period_usd => '1000');
my $token_file = write_secret_file($node->basedir . '/issuer.token', $proxy->issuer_token);
my %account_of = (cust_platform => undef, cust_conn_a => 'acct_132A', cust_conn_b => 'acct_132B');
my %fee_of = (cust_platform => undef, cust_conn_a => 150, cust_conn_b => undef);
my @customers = sort keys %account_of;
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method, stripe_account,
	                                application_fee_cents)
	VALUES ('cust_platform', 'cus_same', 2000, 'usd', 'pm_card_visa', NULL, NULL),
	       ('cust_conn_a', 'cus_same', 2000, 'usd', 'pm_card_visa', 'acct_132A', 150),
	       ('cust_conn_b', 'cus_same', 2000, 'usd', 'pm_card_visa', 'acct_132B', NULL)});
$node->reload_with(api_base => $proxy->url(''), vault_issuer_token_file => $token_file);

sub shown { my ($account) = @_; return $account // 'the platform' }

sub charged_once_on_own_account {
	my ($label, $period) = @_;
	for my $customer (@customers) {
		my @objects = @{ ledger_for_key($emulator, $node->key_of($customer, $period)) };
		is(scalar(@objects), 1, "$label: $customer: one object for its key at the emulator") or next;
		is(shown($objects[0]{account}), shown($account_of{$customer}), "$label: $customer: ... on its own account");
		is($objects[0]{status}, 'succeeded', "$label: $customer: ... succeeded");
		is($objects[0]{application_fee_amount}, $fee_of{$customer},
			"$label: $customer: ... application_fee_amount " . ($fee_of{$customer} // 'none'));
		is($node->record_of($customer, $period) =~ s/\|\d+$//r, "completed|$objects[0]{id}",
			"$label: $customer: the record is completed with that charge");
	}
	is($node->q1(qq{SELECT committed_cents FROM billguard.vault_budgets WHERE billing_period = '$period'}), '6000',
		"$label: the budget's committed total is the three charges");
}

is($node->q1("SELECT initiated FROM billguard.bill_period('2031-01')"), '3', '2031-01: three records claimed');
ok($node->wait_until_settled('2031-01', 60), '2031-01 settles through the proxy');
charged_once_on_own_account('2031-01', '2031-01');
is($node->q1(q{SELECT array_to_string(stripe_accounts, ',') FROM billguard.vault_budgets WHERE billing_period = '2031-01'}),
	'acct_132A,acct_132B', 'the budget names the two connected accounts');
is($node->q1(q{SELECT string_agg(coalesce(stripe_account, 'platform'), ',' ORDER BY coalesce(stripe_account, 'platform'))
               FROM billguard.vault_audit WHERE billing_period = '2031-01' AND decision = 'settled'}),
	'acct_132A,acct_132B,platform', 'the proxy\'s audit: each charge settled on its account');

$emulator->configure(latency_ms => 2500);
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-02')"), '3', '2031-02: three records claimed');
ok(wait_until('three charges in flight at the emulator', 30, sub { $emulator->stats->{in_progress} >= 3 }),
	'the three charges are in flight through the proxy');
my $old = $node->dispatcher_pid;
kill('KILL', $old) or die "kill -9 $old: $!";
ok($node->wait_for_new_dispatcher($old, 60), 'kill -9 of the dispatcher mid-send: another one runs');
$emulator->configure(latency_ms => 0);
ok($node->wait_until_settled('2031-02', 90), '2031-02 settles after the crash');
charged_once_on_own_account('after kill -9', '2031-02');

$node->stop;
done_testing();
