# Every currency through the proxy, and the connected accounts a budget
# may spend on, over raw HTTP against a real proxy and database:
#   - POST /keys in JPY (no decimals) and KWD (three): the cap is exact in
#     the currency's smallest unit, a cap finer than it is 400; charges pass
#     up to the cap to the unit, the next unit is 429 spend_cap_exceeded
#     naming the currency; another currency is 403; the audit rows and
#     /metrics name the currency; the admin raises a cap in its currency;
#   - the issuer token's ceiling per currency (--issuer-max-period
#     AMOUNT:CURRENCY beside --issuer-max-period-usd): up to it a new budget
#     is made, past it and in a currency without one 403
#     issuer_not_allowed, naming the flag; bad flags refuse to start;
#   - Stripe-Account: an account the budget names is forwarded upstream
#     (the raw upstream sees the header), another is 403
#     stripe_account_not_allowed before anything reaches Stripe, audited
#     with the account; a bad shape is 400; Stripe-Context is 400; the same
#     Idempotency-Key on the platform and on a connected account is two
#     requests, each replayed from its own account's answer; a second key
#     naming more accounts widens the budget's list, never its cap; a
#     connected account's reservation in doubt is looked up on its account;
#   - the dispatcher's request for a period's budget in a currency
#     (billguard.vault_key_request) names the currency, a cap of that
#     currency's claimed total x headroom in its own unit, and the connected
#     accounts of its records; the proxy takes it as it is.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Temp ();
use JSON::PP qw(decode_json);
use BillguardTest;
use BillguardNode;
use ProxyHarness;
use RawHttpServer;

my $node = BillguardNode->preloaded('proxy_currencies');
my $emulator = start_emulator();
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	issuer_max_period => ['100.00:eur', '10000:jpy']);
sub error_of { my ($r) = @_; return ($r->{status} // '') . ' ' . ($r->{json}{error}{code} // $r->{json}{error}{type} // '') }

# ---- JPY: no minor unit --------------------------------------------------------------

my $jpy = $proxy->issue_key(as => 'admin', billing_period => '2026-08', currency => 'jpy',
	period_usd_cap => undef, period_cap => 5000);
is(join(' ', map { $jpy->{$_} // 'none' } qw(currency period_cap cap_cents cap_usd)), 'jpy 5000 5000 none',
	'a JPY budget: the cap is 5000 yen, 5000 in the smallest unit, no cap_usd');
is(error_of($proxy->request_key(as => 'admin', billing_period => '2026-09', currency => 'jpy',
	period_usd_cap => undef, period_cap => 50.5)), '400 invalid_request_error', 'half a yen is refused (400)');
like($proxy->request_key(as => 'admin', billing_period => '2026-09', currency => 'jpy',
	period_usd_cap => undef, period_cap => 50.5)->{json}{error}{message},
	qr/period_cap must be a positive amount of whole JPY \(0 decimals\)/, '... saying why');
is(error_of($proxy->request_key(as => 'admin', billing_period => '2026-09', currency => 'jpy')),
	'400 invalid_request_error', 'period_usd_cap for a JPY budget is refused');
is(error_of($proxy->request_key(as => 'admin', billing_period => '2026-09', currency => 'JPY',
	period_usd_cap => undef, period_cap => 5)), '400 invalid_request_error', 'an upper-case currency is refused');
is(error_of($proxy->request_key(as => 'admin', billing_period => '2026-09', currency => 'xyz',
	period_usd_cap => undef, period_cap => 5)), '400 invalid_request_error', 'an unknown currency is refused');
is($node->q1(q{SELECT count(*) FROM billguard.vault_budgets WHERE billing_period = '2026-09'}), '0',
	'... and none of them made a budget');

is($proxy->charge($jpy->{vault_key}, 'jpy-1', amount => 3000, currency => 'jpy')->{status}, 200, '3000 yen pass');
is($proxy->charge($jpy->{vault_key}, 'jpy-2', amount => 2000, currency => 'jpy')->{status}, 200,
	'2000 more pass: the cap, to the yen');
my $over = $proxy->charge($jpy->{vault_key}, 'jpy-3', amount => 50, currency => 'jpy');
is(error_of($over), '429 spend_cap_exceeded', 'one charge more is 429');
is($over->{json}{error}{message}, 'spend cap exceeded for billing_period 2026-08 in JPY', '... naming the currency');
is(error_of($proxy->charge($jpy->{vault_key}, 'jpy-4', amount => 50, currency => 'usd')), '403 currency_not_allowed',
	'USD on the JPY key is 403');
is($node->q1(q{SELECT settled_cents || '/' || cap_cents FROM billguard.vault_spend
                WHERE billing_period = '2026-08' AND currency = 'jpy'}), '5000/5000', 'the budget holds 5000 of 5000 yen');
is($node->q1(q{SELECT string_agg(decision || ':' || currency || ':' || coalesce(amount_cents::text, ''), ' ' ORDER BY occurred_at)
                FROM billguard.vault_audit WHERE key_id = '} . $jpy->{key_id} . q{' AND decision <> 'issued'}),
	'reserved:jpy:3000 settled:jpy:3000 reserved:jpy:2000 settled:jpy:2000 refused:jpy:50 refused:usd:50',
	'the audit rows name the currency of each decision');
is($node->q1(q{SELECT reason FROM billguard.vault_audit WHERE key_id = '} . $jpy->{key_id} . q{' AND decision = 'issued'}) =~ s/, endpoints.*//r,
	'cap 5000 JPY', "the key's issue is audited with its cap in yen");
like($proxy->request('GET', '/metrics', undef)->{content},
	qr/billguard_proxy_budget_settled_cents\{vendor="stripe",billing_period="2026-08",currency="jpy"\} 5000\n/,
	'/metrics names the budget by currency');
is($proxy->request('POST', "/keys/$jpy->{key_id}", '{"period_usd_cap": 60}', token => $proxy->admin_token,
	content_type => 'application/json')->{status}, 400, 'a cap in USD does not raise a JPY budget');
is($proxy->request('POST', "/keys/$jpy->{key_id}", '{"period_cap": 6000}', token => $proxy->admin_token,
	content_type => 'application/json')->{json}{cap_cents}, 6000, 'period_cap raises it, in yen');
is($proxy->charge($jpy->{vault_key}, 'jpy-3', amount => 50, currency => 'jpy')->{status}, 200,
	'... and the refused charge now passes');

# ---- KWD: three decimals ---------------------------------------------------------------

my $kwd = $proxy->issue_key(as => 'admin', billing_period => '2026-08', currency => 'kwd',
	period_usd_cap => undef, period_cap => 1.25);
is(join(' ', map { $kwd->{$_} } qw(currency period_cap cap_cents)), 'kwd 1.25 1250',
	'a KWD budget of 1.250 dinars is 1250 fils');
is(error_of($proxy->request_key(as => 'admin', billing_period => '2026-10', currency => 'kwd',
	period_usd_cap => undef, period_cap => 1.2505)), '400 invalid_request_error', 'half a fils is refused');
is($proxy->charge($kwd->{vault_key}, 'kwd-1', amount => 1000, currency => 'kwd')->{status}, 200, '1.000 KWD passes');
is($proxy->charge($kwd->{vault_key}, 'kwd-2', amount => 250, currency => 'kwd')->{status}, 200, '0.250 KWD more passes');
my $kwd_over = $proxy->charge($kwd->{vault_key}, 'kwd-3', amount => 1, currency => 'kwd');
is(error_of($kwd_over) . ' ' . $kwd_over->{json}{error}{message},
	'429 spend_cap_exceeded spend cap exceeded for billing_period 2026-08 in KWD', 'one fils more is 429, naming KWD');
my $conflict = $proxy->request_key(as => 'admin', billing_period => '2026-08', currency => 'kwd',
	period_usd_cap => undef, period_cap => 2);
is(error_of($conflict) . ' ' . ($conflict->{json}{error}{cap_cents} // ''), '409 budget_cap_differs 1250',
	"another cap for the KWD budget is 409, naming its cap in fils");
like($conflict->{json}{error}{message}, qr/already has a cap of 1\.250 KWD$/, '... and in dinars');

# ---- the issuer token's ceiling per currency --------------------------------------------

is($proxy->issue_key(billing_period => '2026-11', currency => 'eur', period_usd_cap => undef, period_cap => 100)->{cap_cents},
	10000, 'the issuer token makes a EUR budget up to --issuer-max-period 100.00:eur');
my $past = $proxy->request_key(billing_period => '2026-12', currency => 'eur', period_usd_cap => undef, period_cap => 100.01);
is(error_of($past), '403 issuer_not_allowed', 'past it: 403');
like($past->{json}{error}{message},
	qr/may create a budget of at most 100\.00 EUR \(--issuer-max-period\), not 100\.01 EUR for billing_period 2026-12/,
	'... naming the ceiling, the flag and the cap asked');
is($proxy->issue_key(billing_period => '2026-11', currency => 'jpy', period_usd_cap => undef, period_cap => 10000)->{cap_cents},
	10000, 'a JPY budget up to its own ceiling');
my $gbp = $proxy->request_key(billing_period => '2026-11', currency => 'gbp', period_usd_cap => undef, period_cap => 1);
is(error_of($gbp), '403 issuer_not_allowed', 'a currency without a ceiling: 403');
like($gbp->{json}{error}{message}, qr/may create no budget in GBP \(the proxy has no ceiling for it: --issuer-max-period AMOUNT:gbp\)/,
	'... saying which flag would allow it');
is($proxy->issue_key(billing_period => '2026-11', period_usd_cap => 999999)->{cap_usd}, 999999,
	'--issuer-max-period-usd keeps its meaning for USD');
is($node->q1(q{SELECT string_agg(currency, ' ' ORDER BY currency) FROM billguard.vault_budgets WHERE billing_period IN ('2026-11', '2026-12')}),
	'eur jpy usd', 'only the allowed budgets were made');

my $only_eur = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	issuer_max_period_usd => undef, issuer_max_period => ['5:eur']);
is(error_of($only_eur->request_key(billing_period => '2027-01', period_usd_cap => 1)), '403 issuer_not_allowed',
	'with --issuer-max-period alone the issuer token makes no USD budget');
is($only_eur->issue_key(billing_period => '2027-01', currency => 'eur', period_usd_cap => undef, period_cap => 5)->{currency},
	'eur', '... and a EUR one up to its ceiling');
$only_eur->stop;
my @base = ('--listen', '127.0.0.1:0', '--database', $node->connstr('postgres'), '--upstream', $emulator->url(''),
	'--upstream-key-file', $proxy->{files}{upstream}, '--admin-token-file', $proxy->{files}{admin},
	'--issuer-token-file', $proxy->{files}{issuer});
for my $case (
	[ [ '--issuer-max-period', '100:EUR' ], qr/--issuer-max-period must be AMOUNT:CURRENCY/ ],
	[ [ '--issuer-max-period', 'eur:100' ], qr/--issuer-max-period must be AMOUNT:CURRENCY/ ],
	[ [ '--issuer-max-period', '1.2345:kwd' ], qr/--issuer-max-period must be AMOUNT:CURRENCY/ ],
	[ [ '--issuer-max-period', '5:eur', '--issuer-max-period', '6:eur' ], qr/--issuer-max-period names eur twice/ ],
	[ [ '--issuer-max-period-usd', '5', '--issuer-max-period', '6:usd' ], qr/both name USD/ ],
	[ [], qr/--issuer-token-file needs --issuer-max-period-usd or --issuer-max-period/ ]) {
	my ($status, $stderr) = ProxyHarness->refused_start(@base, @{ $case->[0] });
	ok($status == 2 && $stderr =~ $case->[1], "refused to start: @{ $case->[0] }") or diag $stderr;
}

# ---- Stripe-Account ------------------------------------------------------------------------

# A raw upstream that answers a succeeded PaymentIntent whose id names the
# account it was asked on, and writes each request's headers down.
my $heads = File::Temp->new(TEMPLATE => 'proxy-heads-XXXXXX', TMPDIR => 1);
my $upstream = RawHttpServer->start(sub {
	my ($head) = @_;
	open(my $log, '>>', $heads->filename) or die;
	print $log "$head\n\n";
	close $log;
	my ($account) = $head =~ /^Stripe-Account: (\S+)\r?$/mi;
	my ($idem) = $head =~ /^Idempotency-Key: (\S+)\r?$/mi;
	# A charge whose outcome is unknown (a 500), that Stripe holds on acct_A1
	# only: found by its search and fetched, on that account.
	my $doubt = qq({"id":"pi_doubt","object":"payment_intent","status":"succeeded","amount":50,"currency":"usd",)
	  . qq("customer":"cus_proxy","metadata":{"billguard_key":"bk_doubt"}});
	return (500, '{"error":{"type":"api_error","message":"boom"}}', 'req_500') if ($idem // '') eq 'doubt-1';
	if ($head =~ m{^GET /v1/payment_intents/search}) {
		return (200, '{"object":"search_result","data":[' . (($account // '') eq 'acct_A1' ? $doubt : '')
		  . '],"has_more":false}', 'req_search');
	}
	return (200, $doubt, 'req_fetch') if $head =~ m{^GET /v1/payment_intents/pi_doubt} && ($account // '') eq 'acct_A1';
	my $id = 'pi_' . ($account // 'platform') . '_' . ($idem // 'none') =~ s/\W/_/gr;
	return (200, qq({"id":"$id","object":"payment_intent","status":"succeeded","amount":50,"currency":"usd"}),
		"req_$id");
});
my $connect = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $upstream->url(''),
	args => [ '--upstream-timeout', '1', '--reconcile-after', '2' ]);
my $k = $connect->issue_key(billing_period => '2027-02', period_usd_cap => 10, stripe_accounts => ['acct_A1']);
is(join(',', @{ $k->{stripe_accounts} }), 'acct_A1', 'POST /keys names the accounts the budget may spend on');
my $on_a1 = $connect->charge_on('acct_A1', $k->{vault_key}, 'connect-1');
is($on_a1->{status} . ' ' . $on_a1->{json}{id}, '200 pi_acct_A1_connect_1', 'a charge on acct_A1 is forwarded');
like(slurp_file($heads->filename), qr/^Stripe-Account: acct_A1\r?$/mi, '... with Stripe-Account: acct_A1 upstream');
my $sent = $upstream->requests;
my $other = $connect->charge_on('acct_B2', $k->{vault_key}, 'connect-2');
is(error_of($other), '403 stripe_account_not_allowed', 'an account the budget does not name is 403');
like($other->{json}{error}{message}, qr/may act on the platform's account and acct_A1 only, not on acct_B2/, '... naming the allowed ones');
is($upstream->requests, $sent, '... and nothing reached Stripe');
is($node->q1(q{SELECT decision || ' ' || http_status || ' ' || stripe_account FROM billguard.vault_audit
                WHERE idempotency_key = 'connect-2'}), 'refused 403 acct_B2', '... audited with the account');
is(error_of($connect->charge_on('acct_bad-1', $k->{vault_key}, 'connect-3')), '400 stripe_account_invalid',
	'a Stripe-Account of a bad shape is 400');
is(error_of($connect->request('POST', '/v1/payment_intents', ProxyHarness::charge_body(), vault_key => $k->{vault_key},
	idempotency_key => 'connect-4', headers => { 'Stripe-Context' => 'ctx_1' })), '400 header_not_allowed',
	'Stripe-Context is 400');
is($upstream->requests, $sent, '... neither reached Stripe');

# One Idempotency-Key on the platform and on acct_A1: two requests, as at Stripe.
my $platform = $connect->charge($k->{vault_key}, 'connect-1');
is($platform->{status} . ' ' . $platform->{json}{id}, '200 pi_platform_connect_1',
	"the key of acct_A1's charge on the platform is the platform's own request");
is($upstream->requests, $sent + 1, '... forwarded');
is($node->q1(q{SELECT string_agg(coalesce(nullif(stripe_account, ''), 'platform') || '=' || status || ':' || charge_id, ' '
                                 ORDER BY stripe_account)
                FROM billguard.vault_reservations WHERE idempotency_key = 'connect-1'}),
	'platform=settled:pi_platform_connect_1 acct_A1=settled:pi_acct_A1_connect_1', 'one reservation per account');
my $again = $connect->charge_on('acct_A1', $k->{vault_key}, 'connect-1');
is(join(' ', $again->{status}, $again->{headers}{'idempotent-replayed'} // '', $again->{json}{id}),
	'200 true pi_acct_A1_connect_1', "a retry on acct_A1 is replayed from acct_A1's answer");
is($upstream->requests, $sent + 1, '... from the ledger');
is($node->q1(q{SELECT committed_cents FROM billguard.vault_budgets WHERE billing_period = '2027-02'}), '100',
	'the budget counted the two charges once each');

my $wider = $connect->issue_key(billing_period => '2027-02', period_usd_cap => 10, stripe_accounts => ['acct_C3']);
is(join(',', @{ $wider->{stripe_accounts} }), 'acct_A1,acct_C3', "a second key's accounts join the budget's");
is($connect->charge_on('acct_C3', $k->{vault_key}, 'connect-5')->{status}, 200, '... for every key of the budget');
is(error_of($connect->request_key(billing_period => '2027-03', stripe_accounts => ['acct_x-y'])),
	'400 invalid_request_error', 'an account id of a bad shape at POST /keys is 400');

# A 500 on acct_A1: the reservation stays in doubt, and the reconciler looks
# it up at Stripe on acct_A1, where the charge is.
is($connect->charge_on('acct_A1', $k->{vault_key}, 'doubt-1', 'metadata[billguard_key]' => 'bk_doubt')->{status}, 500,
	'a charge on acct_A1 answered 500: its outcome is unknown');
ok(wait_until('the reconciler to settle doubt-1', 30, sub {
	$node->q1(q{SELECT status || ' ' || charge_id FROM billguard.vault_reservations WHERE idempotency_key = 'doubt-1'})
	  eq 'settled pi_doubt' }), "the reconciler settles it with the charge it found on acct_A1");
my @lookups = grep { m{^GET /v1/payment_intents/(search|pi_doubt)} } split /\n\n/, slurp_file($heads->filename);
ok(@lookups >= 2 && !grep({ !/^Stripe-Account: acct_A1\r?$/mi } @lookups),
	'... having searched and fetched with Stripe-Account: acct_A1') or diag explain \@lookups;

# ---- what the dispatcher asks for (billguard.vault_key_request) ---------------------------

# A period billed in EUR on the platform and on two connected accounts, and
# in JPY on the platform: one key request per currency, each capped at that
# currency's claimed total x 1.10 in its own unit, naming its records' accounts.
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method, stripe_account)
	VALUES ('eur_platform', 'cus_e0', 1000, 'eur', 'pm_card_visa', NULL),
	       ('eur_on_b', 'cus_e1', 2001, 'eur', 'pm_card_visa', 'acct_B2'),
	       ('eur_on_a', 'cus_e2', 3000, 'eur', 'pm_card_visa', 'acct_A1'),
	       ('jpy_platform', 'cus_j0', 777, 'jpy', 'pm_card_visa', NULL)});
is($node->q1("SELECT initiated FROM billguard.bill_period('2027-04')"), '4', '2027-04 claimed in EUR and JPY');
my $eur_body = decode_json($node->q1(
	"SELECT body FROM billguard.vault_key_request('2027-04', '/v1/payment_intents', 1.10, NULL, 'eur')"));
is(join(' ', $eur_body->{currency}, $eur_body->{period_cap}, exists $eur_body->{period_usd_cap} ? 'usd-cap' : 'no-usd-cap',
	join(',', @{ $eur_body->{stripe_accounts} })),
	'eur 66.02 no-usd-cap acct_A1,acct_B2',
	"the EUR key asks 60.01 EUR x 1.10, rounded up to the cent, on its records' connected accounts");
my $jpy_body = decode_json($node->q1(
	"SELECT body FROM billguard.vault_key_request('2027-04', '/v1/payment_intents', 1.10, NULL, 'jpy')"));
is(join(' ', $jpy_body->{currency}, $jpy_body->{period_cap}, scalar @{ $jpy_body->{stripe_accounts} }), 'jpy 855 0',
	'the JPY key asks 777 yen x 1.10, rounded up to the yen, on the platform only');
my $usd_body = decode_json($node->q1(
	"SELECT body FROM billguard.vault_key_request('2027-04', '/v1/payment_intents', 1.10)"));
is(join(' ', $usd_body->{currency}, $usd_body->{period_usd_cap}), 'usd 0.55',
	'a USD key asks period_usd_cap, as every proxy takes it (at least 50 cents x 1.10)');
my $asked = $proxy->request_key(%$eur_body, billing_period => '2027-04', period_usd_cap => undef, as => 'admin');
is($asked->{status} . ' ' . $asked->{json}{cap_cents} . ' ' . join(',', @{ $asked->{json}{stripe_accounts} }),
	'200 6602 acct_A1,acct_B2', 'the proxy takes that request as it is');

$upstream->stop;
done_testing();
