# What a vault key may do, and what bad input gets (the key's scope; the
# proxy's bad-input rules). Against a real proxy, database and emulator:
#   - a disallowed endpoint is 403 naming the allowed ones; a POST on an
#     object (confirm, capture) the key's budget did not create 403; an expired key
#     401; a revoked key 401 on the very next request; another currency 403;
#     an unknown key, the real Stripe key itself, or a vk_test_ key where the
#     proxy holds a live Stripe key, 401; none is forwarded;
#   - a key issued again for the period shares its budget; another cap for
#     it is 409; only the admin raises a cap or reads and revokes keys;
#   - the issuer token obtains the dispatcher's key only: another vendor
#     name, endpoints beyond /v1/payment_intents, /v1/charges and their
#     search, or a new budget past --issuer-max-period-usd are 403
#     issuer_not_allowed and create nothing; the dispatcher's own request
#     (vault_key_request) passes, and an admin's larger budget is joined at
#     its cap; the admin token can do all of it;
#   - reads of an allowed endpoint pass and are never counted;
#   - a malformed Authorization, a body that is not form encoding, an amount
#     that is not a positive integer (or has a leading zero), a parameter
#     name that is not name[key]... ([amount], amount], amount[], a NUL or a
#     space in it), a missing Idempotency-Key, an
#     oversized body, an unknown path: 4xx, Stripe-shaped, nothing forwarded
#     or counted;
#   - /metrics passes promtool check metrics, and neither it, nor any
#     answer, nor the proxy's log holds the real key or a token.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $node = BillguardNode->preloaded('proxy_scope');
my $emulator = start_emulator();
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	issuer_max_period_usd => '100');
my $key = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => 10,
	allowed_endpoints => ['/v1/payment_intents']);
my @answers;    # every answer, searched for secrets at the end
sub remember { push @answers, $_[0]; return $_[0] }
sub error_of { my ($r) = @_; return ($r->{status} // '') . ' ' . ($r->{json}{error}{code} // $r->{json}{error}{type} // '') }
my $forwarded = sub { $emulator->stats->{requests} // 0 };
my $before = $forwarded->();

# ---- scope -------------------------------------------------------------------------

my $r = remember($proxy->request('POST', '/v1/charges', ProxyHarness::charge_body(), vault_key => $key->{vault_key},
	idempotency_key => 'scope-1'));
is(error_of($r), '403 endpoint_not_allowed', 'a disallowed endpoint is 403');
like($r->{json}{error}{message}, qr{may call GET and POST on /v1/payment_intents only}, '... naming the allowed endpoints');
is(error_of(remember($proxy->charge($key->{vault_key}, 'scope-2', currency => 'eur'))), '403 currency_not_allowed',
	'another currency is 403');
is(error_of(remember($proxy->charge('vk_test_' . ('Z' x 32), 'scope-3'))), '401 vault_key_unknown', 'an unknown key is 401');
is(error_of(remember($proxy->charge($StripeEmulatorHarness::DEFAULT_API_KEY, 'scope-4'))), '401 vault_key_required',
	'the real Stripe key itself is 401');
my $expiring = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => 10);
$node->q1("UPDATE billguard.vault_keys SET expires_at = now() WHERE key_id = '$expiring->{key_id}'");
is(error_of(remember($proxy->charge($expiring->{vault_key}, 'scope-5'))), '401 vault_key_expired', 'an expired key is 401');
my $live_proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	upstream_key => 'sk_live_billguardProxyScope0001');
my $wrong_mode = remember($live_proxy->charge($key->{vault_key}, 'scope-live'));
is(error_of($wrong_mode), '401 vault_key_wrong_mode', 'a vk_test_ key through a proxy holding a live Stripe key is 401');
$live_proxy->stop;
is($forwarded->(), $before, 'none of them reached the emulator');

my $ok = remember($proxy->charge($key->{vault_key}, 'scope-ok', amount => 300));
is($ok->{status}, 200, 'the key charges within its scope');
my $at_stripe = $forwarded->();
is(error_of(remember($proxy->request('POST', '/v1/payment_intents/pi_createdElsewhere/confirm',
	'payment_method=pm_card_visa', vault_key => $key->{vault_key}, idempotency_key => 'scope-confirm'))),
	'403 object_not_in_budget',
	'a POST on an object the budget did not create (confirming a PaymentIntent made with the real key) is 403');
remember($proxy->request('POST', "/v1/payment_intents/$ok->{json}{id}/cancel", undef, vault_key => $key->{vault_key}));
is($forwarded->(), $at_stripe + 1, '... and only a POST on one it created reaches Stripe');
my $again = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => 10);
is(remember($proxy->request('POST', '/v1/payment_intents', ProxyHarness::charge_body(amount => 700),
	basic => $again->{vault_key}, idempotency_key => 'scope-again'))->{status}, 200,
	'a key issued again for the period charges too (HTTP basic, as Stripe\'s clients send it)');
is(error_of(remember($proxy->charge($key->{vault_key}, 'scope-over', amount => 50))), '429 spend_cap_exceeded',
	'... and both share one budget: 3 + 7 USD of 10 leave no room for 50 cents');
my $conflict = remember($proxy->request_key(billing_period => '2026-08', period_usd_cap => 20));
is($conflict->{status}, 409, 'asking another cap for the period is 409');
is(($conflict->{json}{error}{code} // '') . ' ' . ($conflict->{json}{error}{cap_cents} // ''), 'budget_cap_differs 1000',
	'... naming the budget\'s cap in cents, so an issuer can join it');
is($proxy->key_status($key->{key_id})->{cap_cents}, 1000, '... and the cap is unchanged');
is($proxy->request('POST', "/keys/$key->{key_id}", '{"period_usd_cap": 20}', token => $proxy->issuer_token,
	content_type => 'application/json')->{status}, 403, 'the issuer token cannot raise a cap');
is($proxy->request('POST', "/keys/$key->{key_id}", '{"period_usd_cap": 20}', token => 'x' x 40,
	content_type => 'application/json')->{status}, 401, 'nor can an unknown token');
my $raised = $proxy->request('POST', "/keys/$key->{key_id}", '{"period_usd_cap": 10.5}', token => $proxy->admin_token,
	content_type => 'application/json');
is($raised->{json}{cap_cents}, 1050, 'the admin raises the cap');
is(remember($proxy->charge($key->{vault_key}, 'scope-over', amount => 50))->{status}, 200, '... and the next charge passes');
is($node->q1(q{SELECT count(*) FROM billguard.vault_audit WHERE decision = 'cap_raised'}), '1', 'the raise is audited');

is($proxy->request('GET', "/v1/payment_intents/search?query=customer%3A%27cus_proxy%27", undef,
	vault_key => $key->{vault_key})->{status}, 200, 'a read of an allowed endpoint passes');
is($proxy->key_status($key->{key_id})->{settled_cents}, 1050, '... and is not counted');

is($proxy->request('DELETE', "/keys/$key->{key_id}", undef, token => $proxy->admin_token)->{json}{revoked}, JSON::PP::true,
	'the admin revokes the key');
is(error_of(remember($proxy->charge($key->{vault_key}, 'scope-6', amount => 50))), '401 vault_key_revoked',
	'a revoked key is 401 on the very next request');
is($proxy->request('GET', "/keys/$key->{key_id}", undef, token => $proxy->issuer_token)->{status}, 403,
	'the issuer token cannot read keys');

# ---- the issuer token: the dispatcher's key, within the operator's ceiling ---------------------------

my $ledger_rows = sub {
	$node->q1(q{SELECT (SELECT count(*) FROM billguard.vault_budgets) || '/' || (SELECT count(*) FROM billguard.vault_keys)
		|| '/' || (SELECT count(*) FROM billguard.journal WHERE event_type = 'VaultKeyIssued')});
};
my $rows_before = $ledger_rows->();
my $forwarded_before = $forwarded->();
my @refused = (
	[ 'another vendor name with any cap and payouts (the review\'s request)', vendor => 'stripe_b', billing_period => '2026-08',
	  period_usd_cap => 10000000000, allowed_endpoints => [ '/v1/payouts', '/v1/transfers' ] ],
	[ 'another vendor name within the ceiling', vendor => 'stripe_b', billing_period => '2026-11', period_usd_cap => 10 ],
	[ 'endpoints beyond the charge endpoints', billing_period => '2026-11', period_usd_cap => 10,
	  allowed_endpoints => [ '/v1/payment_intents', '/v1/payouts' ] ],
	[ 'joining the existing budget at its cap with payouts', billing_period => '2026-08', period_usd_cap => 10.5,
	  allowed_endpoints => [ '/v1/transfers' ] ],
	[ 'a new budget past the ceiling', billing_period => '2026-11', period_usd_cap => 100.01 ],
	[ 'a new budget far past the ceiling', billing_period => '2026-11', period_usd_cap => 10000000000,
	  allowed_endpoints => [ '/v1/charges' ] ],
);
for my $case (@refused) {
	my ($what, %fields) = @$case;
	my $answer = remember($proxy->request_key(%fields));
	is(error_of($answer), '403 issuer_not_allowed', "issuer token, $what: 403");
	is($answer->{json}{error}{type}, 'invalid_request_error', '... Stripe-shaped');
}
like(remember($proxy->request_key(vendor => 'stripe_b', period_usd_cap => 10))->{json}{error}{message},
	qr/the issuer token may ask for vendor stripe only, not 'stripe_b'/, 'the refusal of a vendor names the one allowed');
like(remember($proxy->request_key(allowed_endpoints => [ '/v1/payouts' ]))->{json}{error}{message},
	qr{may ask for /v1/payment_intents, /v1/charges and their /search only, not /v1/payouts},
	'the refusal of endpoints names the allowed ones');
like(remember($proxy->request_key(billing_period => '2026-11', period_usd_cap => 100.01))->{json}{error}{message},
	qr/may create a budget of at most 100\.00 USD \(--issuer-max-period-usd\), not 100\.01 USD for billing_period 2026-11/,
	'the refusal of a cap names the ceiling');
is($ledger_rows->(), $rows_before, '... and none created a budget, a key or a VaultKeyIssued event');
is($proxy->key_status($key->{key_id})->{cap_cents}, 1050, "the existing budget's cap is unchanged");
my $metrics_now = $proxy->request('GET', '/metrics', undef)->{content};
unlike($metrics_now, qr/stripe_b|2026-11/, 'and /metrics shows no new budget');
like($metrics_now, qr/billguard_proxy_requests_total\{decision="keys",status="403"\} 11\n/,
	'... but counts the 9 refusals, and the 2 of /keys/{key_id} above');
is($forwarded->(), $forwarded_before, 'nothing reached the emulator');

# What the dispatcher asks (vault_key_request, both charge endpoints) passes, up to the ceiling.
my $dispatcher_body = $node->q1(q{SELECT (body || jsonb_build_object('allowed_endpoints',
	'["/v1/charges", "/v1/charges/search", "/v1/payment_intents", "/v1/payment_intents/search"]'::jsonb))::text
	FROM billguard.vault_key_request('2026-11', '/v1/payment_intents', 1.1)});
my $dispatcher_key = remember($proxy->request('POST', '/keys', $dispatcher_body, token => $proxy->issuer_token,
	content_type => 'application/json'));
is($dispatcher_key->{status}, 200, "the dispatcher's own request passes with the issuer token");
is($dispatcher_key->{json}{vendor}, 'stripe', '... for vendor stripe');
is($proxy->issue_key(billing_period => '2026-12', period_usd_cap => 100)->{cap_usd}, 100,
	'a new budget at the ceiling passes');
# An admin's budget larger than the ceiling: the issuer joins it at its cap (409 first, as the dispatcher does).
my $big = $proxy->issue_key(as => 'admin', billing_period => '2027-01', period_usd_cap => 500);
my $asked = remember($proxy->request_key(billing_period => '2027-01', period_usd_cap => 300));
is(error_of($asked), '409 budget_cap_differs', "the issuer asking its own cap of an admin's larger budget: 409");
is($asked->{json}{error}{cap_cents}, 50000, "... naming the budget's cap");
is($proxy->issue_key(billing_period => '2027-01', period_usd_cap => 500)->{cap_usd}, 500,
	"... and it joins the budget at that cap, past the ceiling, raising nothing");

# The admin token keeps full power.
for my $i (0 .. $#refused) {
	my ($what, %fields) = @{ $refused[$i] };
	$fields{billing_period} = sprintf('2028-%02d', $i + 1) if $fields{billing_period} eq '2026-11';
	is(remember($proxy->request_key(as => 'admin', %fields))->{status}, 200, "admin token, $what: 200");
}

# ---- bad input ---------------------------------------------------------------------------

my $live = $proxy->issue_key(billing_period => '2026-10', period_usd_cap => 10);
my $count_before = $forwarded->();
my %bad = (
	'no Authorization' => [ 'POST', '/v1/payment_intents', ProxyHarness::charge_body(), idempotency_key => 'b1' ],
	'a malformed Authorization' => [ 'POST', '/v1/payment_intents', ProxyHarness::charge_body(),
		headers => { Authorization => 'Token abc' }, idempotency_key => 'b2' ],
	'a JSON body' => [ 'POST', '/v1/payment_intents', '{"amount": 50}', content_type => 'application/json',
		vault_key => $live->{vault_key}, idempotency_key => 'b3' ],
	'a body with bytes form encoding never has' => [ 'POST', '/v1/payment_intents', "amount=50&currency=usd&x=<a b>",
		vault_key => $live->{vault_key}, idempotency_key => 'b4' ],
	'an amount that is not an integer' => [ 'POST', '/v1/payment_intents', ProxyHarness::charge_body(amount => '5e1'),
		vault_key => $live->{vault_key}, idempotency_key => 'b5' ],
	'a negative amount' => [ 'POST', '/v1/payment_intents', ProxyHarness::charge_body(amount => '-50'),
		vault_key => $live->{vault_key}, idempotency_key => 'b6' ],
	'an amount of zero' => [ 'POST', '/v1/payment_intents', ProxyHarness::charge_body(amount => '0'),
		vault_key => $live->{vault_key}, idempotency_key => 'b7' ],
	'an amount with a leading zero' => [ 'POST', '/v1/payment_intents', ProxyHarness::charge_body(amount => '0050'),
		vault_key => $live->{vault_key}, idempotency_key => 'b14' ],
	# Names another parser may read as amount, which the cap would not have counted.
	'an amount named [amount]' => [ 'POST', '/v1/payment_intents', '[amount]=5000&currency=usd',
		vault_key => $live->{vault_key}, idempotency_key => 'b15' ],
	'an amount named amount]' => [ 'POST', '/v1/payment_intents', 'amount]=5000&currency=usd',
		vault_key => $live->{vault_key} ],
	'an amount as a list' => [ 'POST', '/v1/payment_intents', 'amount%5B%5D=5000&currency=usd',
		vault_key => $live->{vault_key}, idempotency_key => 'b16' ],
	'a name with a NUL' => [ 'POST', '/v1/payment_intents', 'amount%00=5000&currency=usd',
		vault_key => $live->{vault_key}, idempotency_key => 'b17' ],
	'a name with a space' => [ 'POST', '/v1/payment_intents', 'amount+=5000&currency=usd',
		vault_key => $live->{vault_key}, idempotency_key => 'b18' ],
	'two amounts' => [ 'POST', '/v1/payment_intents', 'amount=50&amount=5000&currency=usd',
		vault_key => $live->{vault_key}, idempotency_key => 'b8' ],
	'an amount in the query string' => [ 'POST', '/v1/payment_intents?amount=5000', ProxyHarness::charge_body(),
		vault_key => $live->{vault_key}, idempotency_key => 'b9' ],
	'no Idempotency-Key' => [ 'POST', '/v1/payment_intents', ProxyHarness::charge_body(), vault_key => $live->{vault_key} ],
	'an oversized body' => [ 'POST', '/v1/payment_intents', ProxyHarness::charge_body(description => 'x' x 70000),
		vault_key => $live->{vault_key}, idempotency_key => 'b10' ],
	'an oversized header' => [ 'POST', '/v1/payment_intents', ProxyHarness::charge_body(),
		vault_key => $live->{vault_key}, idempotency_key => 'b11', headers => { 'X-Padding' => 'p' x 10000 } ],
	'a path outside the API' => [ 'POST', '/v2/payment_intents', ProxyHarness::charge_body(),
		vault_key => $live->{vault_key}, idempotency_key => 'b12' ],
	'a path climbing out of an endpoint' => [ 'POST', '/v1/payment_intents/%2e%2e/charges', ProxyHarness::charge_body(),
		vault_key => $live->{vault_key}, idempotency_key => 'b13' ],
);
for my $case (sort keys %bad) {
	my ($method, $path, $body, %options) = @{ $bad{$case} };
	my $answer = remember($proxy->request($method, $path, $body, %options));
	ok(($answer->{status} // 0) >= 400 && $answer->{status} < 500
		&& ($answer->{json}{error}{type} // '') eq 'invalid_request_error' && length($answer->{json}{error}{message} // ''),
		"$case: a 4xx with a Stripe-shaped body (got $answer->{status})");
}
is($forwarded->(), $count_before, 'no bad request reached the emulator');
my $status = $proxy->key_status($live->{key_id});
is("$status->{settled_cents}/$status->{reserved_cents}", '0/0', 'and none was counted');

# ---- metrics, and no secret anywhere ---------------------------------------------------------

my $metrics = $proxy->request('GET', '/metrics', undef);
is($metrics->{status}, 200, '/metrics answers');
like($metrics->{content}, qr/billguard_proxy_budget_settled_cents\{vendor="stripe",billing_period="2026-08",currency="usd"\} 1050/,
	'/metrics shows the settled spend of the budget');
like($metrics->{content}, qr/billguard_proxy_requests_total\{decision="refused",status="429"\} 1/,
	'/metrics counts requests by decision and status');
my $file = $node->basedir . '/metrics.txt';
open my $fh, '>', $file or die;
print $fh $metrics->{content};
close $fh;
my ($out) = run_command([ 'sh', '-c', "promtool check metrics < $file 2>&1; echo exit=\$?" ]);
is($out, "exit=0", 'promtool check metrics finds nothing wrong');
is($proxy->request('GET', '/healthz', undef)->{content}, '{"status":"ok"}', '/healthz checks the database');

my @secrets = ($StripeEmulatorHarness::DEFAULT_API_KEY, $proxy->admin_token, $proxy->issuer_token);
my $everything = join("\n", $metrics->{content}, $proxy->log_text,
	map { join("\n", $_->{content} // '', %{ $_->{headers} // {} }) } @answers);
is(scalar(grep { index($everything, $_) >= 0 } @secrets), 0,
	'neither the real key nor a token is in any answer, the metrics or the proxy\'s log');
is($node->q1("SELECT count(*) FROM billguard.vault_audit a WHERE row_to_json(a)::text ~ 'sk_test_|vk_test_|admin-|issuer-'"), '0',
	'nor in the audit trail');

$proxy->stop;
$emulator->stop;
$node->stop;
done_testing();
