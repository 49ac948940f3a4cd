# Stripe webhook deliveries for the TAP scenarios, signed by an independent
# implementation of Stripe's scheme: OpenSSL's command line computes each
# HMAC-SHA256 of "<t>.<payload>" (openssl dgst -sha256 -hmac SECRET), never
# billguard's code.
package StripeWebhook;

use strict;
use warnings;
use IPC::Run;
use JSON::PP;
use Exporter 'import';

our @EXPORT = qw(webhook_hmac webhook_signature stripe_event);

# The hex HMAC-SHA256 of "$t.$payload" keyed with $secret, by openssl.
sub webhook_hmac {
	my ($secret, $t, $payload) = @_;
	my $out;
	IPC::Run::run([ 'openssl', 'dgst', '-sha256', '-hmac', $secret ], '<', \"$t.$payload", '>', \$out)
	  or die 'openssl dgst failed';
	my ($hex) = $out =~ /= ([0-9a-f]{64})$/m or die "openssl printed: $out";
	return $hex;
}

# The Stripe-Signature header of $payload signed at $t with each of @secrets.
sub webhook_signature {
	my ($payload, $t, @secrets) = @_;
	return join(',', "t=$t", map { 'v1=' . webhook_hmac($_, $t, $payload) } @secrets);
}

# A Stripe event as JSON: id, type and created (default now) around the
# object hash %$object.
sub stripe_event {
	my (%event) = @_;
	my $object = delete $event{object};
	return JSON::PP->new->canonical->encode({ object => 'event', api_version => '2024-06-20',
		livemode => JSON::PP::false, created => time, %event, data => { object => $object } });
}

1;
