# Connected accounts billed through the proxy: the dispatcher bills EUR
# records on the platform and on two connected accounts, and USD ones on
# one of them, through billguard-proxy:
#   - one key per currency, each naming the connected accounts of its
#     records (the budget's stripe_accounts), and every record completed
#     with one charge on its own account at the emulator;
#   - a record of a third account claimed after the EUR key was obtained
#     is refused by the proxy (403 stripe_account_not_allowed, audited,
#     nothing reaches Stripe), and the dispatcher obtains a key naming it,
#     which joins the same budget at its cap: the record completes on its
#     account, the attempt not counted, no second budget.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use SecretFile qw(write_secret_file);
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $emulator = start_emulator();
my $node = BillguardNode->preloaded('proxy_connect_billing', BillguardNode::dispatcher_conf());
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	issuer_max_period => ['1000.00:eur']);
my $token_file = write_secret_file($node->basedir . '/issuer.token', $proxy->issuer_token);

my %account_of = (eur_platform => undef, eur_on_a => 'acct_151A', eur_on_b => 'acct_151B', usd_on_a => 'acct_151A');
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method, stripe_account)
	VALUES ('eur_platform', 'cus_same', 1000, 'eur', 'pm_card_visa', NULL),
	       ('eur_on_a', 'cus_same', 1100, 'eur', 'pm_card_visa', 'acct_151A'),
	       ('eur_on_b', 'cus_same', 1200, 'eur', 'pm_card_visa', 'acct_151B'),
	       ('usd_on_a', 'cus_same', 1300, 'usd', 'pm_card_visa', 'acct_151A')});
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-08')"), '4', '2026-08 claimed');
$node->reload_with(api_base => $proxy->url(''), vault_issuer_token_file => $token_file);
ok($node->wait_until_settled('2026-08'), 'the period settles');

sub shown { my ($account) = @_; return $account // 'the platform' }
sub charged_on_own_account {
	my ($customer) = @_;
	my @objects = @{ ledger_for_key($emulator, $node->key_of($customer, '2026-08')) };
	return @objects == 1 && ($objects[0]{status} // '') eq 'succeeded'
	  && shown($objects[0]{account}) eq shown($account_of{$customer});
}
for my $customer (sort keys %account_of) {
	is($node->status_of($customer, '2026-08'), 'completed', "$customer completed");
	ok(charged_on_own_account($customer), "... one charge, on " . shown($account_of{$customer}));
}
is($node->q1(q{SELECT string_agg(currency || '=' || array_to_string(stripe_accounts, ','), ' ' ORDER BY currency)
                FROM billguard.vault_budgets}), 'eur=acct_151A,acct_151B usd=acct_151A',
	"each currency's budget names the connected accounts of its records");

# A record of a third connected account, claimed once the EUR key is kept
# (within the EUR cap's headroom: 33.00 + 3.00 of 36.30 EUR).
$account_of{eur_on_c} = 'acct_151C';
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method, stripe_account)
	VALUES ('eur_on_c', 'cus_same', 300, 'eur', 'pm_card_visa', 'acct_151C')});
is($node->bill('eur_on_c', '2026-08'), 'initiated', 'a record of acct_151C claimed after the EUR key was obtained');
ok($node->wait_until_settled('2026-08'), '... settles');
is($node->record_of('eur_on_c', '2026-08') =~ s/\|[^|]*\|/|/r, 'completed|1',
	'... completed, the attempt the proxy refused not counted');
ok(charged_on_own_account('eur_on_c'), '... with one charge on acct_151C');
is($node->q1(q{SELECT count(*) || ' ' || min(http_status) FROM billguard.vault_audit
                WHERE decision = 'refused' AND reason LIKE '%not on acct_151C%' AND stripe_account = 'acct_151C'}), '1 403',
	'the first attempt was refused by the proxy, audited');
is($node->q1(q{SELECT string_agg(currency || '=' || array_to_string(stripe_accounts, ','), ' ' ORDER BY currency)
                FROM billguard.vault_budgets}), 'eur=acct_151A,acct_151B,acct_151C usd=acct_151A',
	"the EUR budget names acct_151C now, and there is no second EUR budget");
like(slurp_file($node->logfile), qr/refused a connected account to the vault key vkey_\w+ of 2026-08 in eur/,
	'the log says why a new key was obtained');
is($node->q1(q{SELECT count(*) FROM billguard.dispatch_status WHERE pause_reason IS NOT NULL}), '0', 'nothing paused');

$proxy->stop;
$node->stop;
$emulator->stop;
done_testing();
