# The key API: every refused call reaches /metrics (401 without a token,
# 400 for a body that is not the API's, 403 for the issuer token on the
# admin's calls), and the issuer token's keys are bounded: they expire
# within --issuer-max-key-days (100) and name billing periods at most
# --issuer-period-months (1) from the current one, so neither a key that
# never expires ("infinity") nor a budget of any period the issuer names is
# to be had. The dispatcher's own request (billguard.vault_key_request: 35
# days past the later of the period's end and now) is within the defaults
# for the previous, the current and the next period. The admin token is not
# bounded; the operator widens the issuer's bounds with the flags.
use strict;
use warnings;
use JSON::PP;
use POSIX qw(strftime);
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $node = BillguardNode->preloaded('key_api_bounds');
my $emulator = start_emulator();
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	issuer_bounds => 'default');
sub keys_metric {
	my ($status) = @_;
	my ($count) = ($proxy->request('GET', '/metrics', undef)->{content} // '')
	  =~ /^billguard_proxy_requests_total\{decision="keys",status="$status"\} (\d+)$/m;
	return $count // 0;
}
sub json_request {
	my ($method, $path, $body, %o) = @_;
	return $proxy->request($method, $path, $body, content_type => 'application/json', %o);
}
sub period_from_now {
	my ($months) = @_;
	return $node->q1("SELECT to_char(now() AT TIME ZONE 'UTC' + interval '$months month', 'YYYY-MM')");
}
sub in_days {
	my ($days) = @_;
	return strftime('%Y-%m-%dT%H:%M:%SZ', gmtime(time + $days * 86400));
}

# ---- every refusal of the key API is counted -------------------------------------------------------

my $admin_key = $proxy->issue_key(as => 'admin', billing_period => period_from_now(-24), expires_at => in_days(30));
my @refusals = (
	[ 401, json_request('POST', '/keys', '{}') ],
	[ 401, json_request('POST', '/keys', '{}', token => 'y' x 40) ],
	[ 401, $proxy->request('GET', "/keys/$admin_key->{key_id}", undef) ],
	[ 400, json_request('POST', '/keys', 'not json', token => $proxy->issuer_token) ],
	[ 400, json_request('POST', '/keys', '{"vendor": "stripe"}', token => $proxy->issuer_token) ],
	[ 400, json_request('POST', "/keys/$admin_key->{key_id}", '{"period_usd_cap": "ten"}', token => $proxy->admin_token) ],
	[ 403, $proxy->request('GET', "/keys/$admin_key->{key_id}", undef, token => $proxy->issuer_token) ],
	[ 403, $proxy->request('DELETE', "/keys/$admin_key->{key_id}", undef, token => $proxy->issuer_token) ],
	[ 403, json_request('POST', "/keys/$admin_key->{key_id}", '{"period_usd_cap": 99}', token => $proxy->issuer_token) ]);
is(join(' ', map { $_->[1]{status} } @refusals), join(' ', map { $_->[0] } @refusals),
	'refused key API calls: 401 without a token, 400 for a bad body, 403 for the issuer on the admin\'s calls');
my %expected;
$expected{ $_->[0] }++ for @refusals;
for my $status (sort keys %expected) {
	is(keys_metric($status), $expected{$status},
		"/metrics counts the $expected{$status} refusals with $status (billguard_proxy_requests_total{decision=\"keys\"})");
}

# ---- the issuer token's bounds ----------------------------------------------------------------------

my $rows = sub { $node->q1(q{SELECT (SELECT count(*) FROM billguard.vault_budgets) || '/' || (SELECT count(*) FROM billguard.vault_keys)}) };
my $before = $rows->();
my $current = period_from_now(0);
my @bounded = (
	[ 'a key that never expires', { billing_period => $current, expires_at => 'infinity' },
	  qr/^the issuer token may ask for a key that expires within 100 days \(--issuer-max-key-days\), not at infinity$/ ],
	[ 'a key living 101 days', { billing_period => $current, expires_at => in_days(101) },
	  qr/expires within 100 days/ ],
	[ 'a budget two months ahead', { billing_period => period_from_now(2), expires_at => in_days(30) },
	  qr/^the issuer token may ask for billing periods within 1 month\(s\) of the current one \(\Q$current\E, --issuer-period-months\), not \Q${\ period_from_now(2)}\E$/ ],
	[ 'a budget a year back', { billing_period => period_from_now(-12), expires_at => in_days(30) },
	  qr/within 1 month\(s\) of the current one/ ],
	[ 'joining the admin\'s budget of two years back, at its cap',
	  { billing_period => period_from_now(-24), expires_at => in_days(30) }, qr/within 1 month\(s\) of the current one/ ]);
for my $case (@bounded) {
	my ($what, $fields, $message) = @$case;
	my $answer = $proxy->request_key(%$fields);
	is(($answer->{status} // 0) . ' ' . ($answer->{json}{error}{code} // ''), '403 issuer_not_allowed', "issuer token, $what: 403");
	like($answer->{json}{error}{message} // '', $message, '... saying what is allowed');
}
is($rows->(), $before, '... and none created a budget or a key');

# The dispatcher's own request, as billguard.vault_key_request builds it.
for my $offset (-1, 0, 1) {
	my $period = period_from_now($offset);
	my $body = $node->q1("SELECT body FROM billguard.vault_key_request('$period', '/v1/payment_intents', 1.10)");
	my $answer = json_request('POST', '/keys', $body, token => $proxy->issuer_token);
	is($answer->{status}, 200, "the dispatcher's request for $period (offset $offset) is within the defaults")
	  or diag($answer->{content});
}
is(json_request('POST', '/keys', JSON::PP->new->encode({ vendor => 'stripe', billing_period => period_from_now(-30),
	period_usd_cap => 1, allowed_endpoints => [ '/v1/payment_intents' ], expires_at => 'infinity' }),
	token => $proxy->admin_token)->{status}, 200, 'the admin token is not bounded: any period, a key that never expires');

# The operator widens them.
my $wide = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	issuer_bounds => 'default', args => [ '--issuer-max-key-days', '400', '--issuer-period-months', '3' ]);
is($wide->request_key(billing_period => period_from_now(3), expires_at => in_days(399))->{status}, 200,
	'with --issuer-max-key-days 400 and --issuer-period-months 3: three months ahead, 399 days');
is($wide->request_key(billing_period => period_from_now(4), expires_at => in_days(30))->{status}, 403, '... not four');
is($wide->request_key(billing_period => period_from_now(3), expires_at => in_days(401))->{status}, 403, '... nor 401 days');
my ($status, $stderr) = ProxyHarness->refused_start($wide->command(0), '--issuer-period-months', '-1');
is($status, 2, 'a bound out of range is a usage error (exit 2)');

$wide->stop;
$proxy->stop;
$emulator->stop;
$node->stop;
done_testing();
