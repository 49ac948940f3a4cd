# A real Stripe client talks to the proxy as to Stripe: the official `stripe` package from npm
# (test/stripe-client, installed by `make test` with npm ci), pointed at the
# proxy's host and port with a vault key, creates PaymentIntents, and
# surfaces the proxy's 429 refusal as a Stripe error with its code and
# message. The client writes hash parameters with literal brackets
# (automatic_payment_methods[enabled]=true), which the proxy takes.
use strict;
use warnings;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $client = "$ENV{BILLGUARD_ROOT}/test/stripe-client";
-d "$client/node_modules/stripe" or BAIL_OUT("the stripe package is not installed: npm ci in $client");

my $node = BillguardNode->preloaded('stripe_client');
my $emulator = start_emulator();
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator);
my $key = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => 1.5);

my ($out, $err) = run_command([ 'node', "$client/charge.js", $proxy->port, $key->{vault_key}, 4, 50 ]);
is($err, '', 'the client ran without errors');
my @calls = map { decode_json($_) } split /\n/, $out;
is(scalar(@calls), 4, 'four calls made');
is(join(' ', map { $_->{status} // '' } @calls[0 .. 2]), 'succeeded succeeded succeeded',
	'the client creates PaymentIntents through the proxy, up to the 1.50 USD cap');
like($calls[0]{id} // '', qr/^pi_/, 'each is a PaymentIntent');
is_deeply({ map { ($_ => $calls[3]{$_}) } qw(stripe_error status type code message) },
	{ stripe_error => JSON::PP::true, status => 429, type => 'invalid_request_error', code => 'spend_cap_exceeded',
	  message => 'spend cap exceeded for billing_period 2026-08' },
	'the fourth raises a Stripe error: 429 spend_cap_exceeded, spend cap exceeded for billing_period 2026-08');
is(scalar(@{ succeeded_charges($emulator) }), 3, 'the emulator holds three charges');

$proxy->stop;
$emulator->stop;
$node->stop;
done_testing();
