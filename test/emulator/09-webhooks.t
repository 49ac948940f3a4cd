# Webhooks: the events the emulator sends about the objects it creates, to a
# listener of this test, signed as Stripe signs them (checked here with
# openssl dgst -sha256 -hmac), delivered at least once, and steered through
# the control API (hold, duplicate, resend), plus refunds.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use IO::Select;
use JSON::PP;
use Test::More;
use StripeEmulatorHarness;

my $secret = 'whsec_emulatorTest0123456789abcdef';
my ($listener, $hook_url) = StripeEmulatorHarness::webhook_listener();
my $emulator = StripeEmulatorHarness->start(args => [ '--webhook-url', $hook_url, '--webhook-secret', $secret ]);
sub intent_params { StripeEmulatorHarness::payment_intent_params(@_) }

sub next_delivery { return StripeEmulatorHarness::next_webhook_delivery($listener, @_) }
sub deliveries { my (@statuses) = @_; return map { next_delivery($_) } @statuses }
sub webhooks_pending { return $emulator->control(GET => '/_emulator/webhooks')->{json}{pending} }
sub types { return join(' ', map { $_ ? $_->{event}{type} : 'none' } @_) }

# The hex HMAC-SHA256 of "$t.$body" by openssl.
sub openssl_hmac {
  my ($t, $body) = @_;
  open my $fh, '-|', 'sh', '-c', 'printf "%s" "$1" | openssl dgst -sha256 -hmac "$2"', 'sh', "$t.$body", $secret
    or die "openssl: $!";
  my $out = do { local $/; <$fh> };
  my ($hex) = $out =~ /= ([0-9a-f]{64})$/m;
  return $hex // '';
}

subtest 'a PaymentIntent that succeeds: created, succeeded, and its charge' => sub {
  my $intent = $emulator->post_form('/v1/payment_intents',
    intent_params('metadata[billguard_key]' => 'k-hooks-1'), idempotency_key => 'hooks-1')->{json};
  my @d = deliveries(200, 200, 200);
  is(types(@d), 'payment_intent.created payment_intent.succeeded charge.succeeded', 'three events, in order');
  is($d[0]{path}, '/hooks/stripe', 'POSTed to the configured path');
  like($d[0]{headers}{'content-type'}, qr{^application/json}, 'as JSON');
  for my $delivery (@d) {
    my ($t, @v1) = $delivery->{headers}{'stripe-signature'} =~ /^t=(\d+),v1=([0-9a-f]{64})$/;
    ok(defined $t, "$delivery->{event}{type}: Stripe-Signature is t=...,v1=...");
    is($v1[0], openssl_hmac($t, $delivery->{body}), "$delivery->{event}{type}: v1 is openssl's HMAC-SHA256 of t.body");
    like($delivery->{event}{id}, qr/^evt_\w{24}$/, "$delivery->{event}{type}: an event id");
    is($delivery->{event}{object}, 'event', "$delivery->{event}{type}: object event");
  }
  my $succeeded = $d[1]{event}{data}{object};
  is($succeeded->{id}, $intent->{id}, 'payment_intent.succeeded is about the PaymentIntent');
  is($succeeded->{status}, 'succeeded', '... as it is now');
  is($d[1]{event}{request}{idempotency_key}, 'hooks-1', '... and names the request\'s Idempotency-Key');
  my $charge = $d[2]{event}{data}{object};
  is($charge->{id}, $intent->{latest_charge}, 'charge.succeeded is about the PaymentIntent\'s latest_charge');
  is($charge->{payment_intent}, $intent->{id}, '... naming the PaymentIntent');
  is_deeply($charge->{metadata}, { billguard_key => 'k-hooks-1' }, '... with its metadata, copied');
  is($charge->{amount}, 2000, '... and its amount');
  my $replay = $emulator->post_form('/v1/payment_intents',
    intent_params('metadata[billguard_key]' => 'k-hooks-1'), idempotency_key => 'hooks-1');
  is($replay->{headers}{'idempotent-replayed'}, 'true', 'a replay creates nothing ...');
  is(webhooks_pending(), 0, '... and sends no event');
};

subtest 'a decline: payment_failed and charge.failed' => sub {
  my $declined = $emulator->post_form('/v1/payment_intents', intent_params(payment_method => 'pm_card_chargeDeclined'));
  is($declined->{status}, 402, 'the PaymentIntent is declined');
  my @d = deliveries(200, 200, 200);
  is(types(@d), 'payment_intent.created payment_intent.payment_failed charge.failed', 'three events');
  is_deeply($d[1]{event}{data}{object}{last_payment_error},
    { type => 'card_error', code => 'card_declined', decline_code => 'generic_decline', message => 'Your card was declined.' },
    'payment_failed carries last_payment_error');
  is($d[2]{event}{data}{object}{failure_code}, 'card_declined', 'charge.failed carries failure_code');
  my $charge = $emulator->post_form('/v1/charges', [amount => 700, currency => 'usd', customer => 'cus_h', source => 'tok_visa']);
  is(types(deliveries(200)), 'charge.succeeded', 'a Charge: charge.succeeded');
};

subtest 'at least once: retried until the endpoint answers 2xx' => sub {
  $emulator->post_form('/v1/charges', [amount => 800, currency => 'usd', customer => 'cus_h', source => 'tok_visa']);
  my @d = deliveries(500, 503, 200);
  is(types(@d), 'charge.succeeded charge.succeeded charge.succeeded', 'the event comes again after a 500 and a 503');
  is(scalar(keys %{ { map { ($_->{event}{id} => 1) } @d } }), 1, 'the same event each time');
  isnt($d[0]{headers}{'stripe-signature'}, undef, 'each delivery signed');
  # The emulator notes the answer once it has read it, just after our
  # endpoint wrote it: wait for the note rather than race it.
  my $entry;
  for (1 .. 100) {
    ($entry) = grep { $_->{event_id} eq $d[0]{event}{id} } @{ $emulator->control(GET => '/_emulator/webhooks')->{json}{deliveries} };
    last if $entry->{delivered};
    select(undef, undef, undef, 0.05);
  }
  is("$entry->{attempts} $entry->{delivered} $entry->{last_status}", '3 1 200', 'the control API shows three attempts, delivered');
};

subtest 'a 500 that created the object still announces it' => sub {
  $emulator->add_fault(kind => 'status', status => 500, count => 1);
  is($emulator->post_form('/v1/payment_intents', intent_params(), idempotency_key => 'hooks-500')->{status}, 500, 'a 500');
  is(types(deliveries(200, 200, 200)), 'payment_intent.created payment_intent.succeeded charge.succeeded',
    'the charge it made is in the webhooks');
};

subtest 'hold, duplicate, resend, delay' => sub {
  my $set = $emulator->control(POST => '/_emulator/webhooks', { hold => JSON::PP::true, duplicate => 1 });
  is($set->{status}, 200, 'hold and duplicate set');
  ok(!exists $set->{json}{secret}, 'the secret is never shown');
  is($set->{json}{secret_set}, JSON::PP::true, '... only that there is one');
  $emulator->post_form('/v1/charges', [amount => 900, currency => 'usd', customer => 'cus_h', source => 'tok_visa']);
  is(webhooks_pending(), 2, 'held: the event waits, twice (duplicate 1)');
  ok(!IO::Select->new($listener)->can_read(1), '... and nothing is sent while held');
  $emulator->control(POST => '/_emulator/webhooks', { hold => JSON::PP::false, duplicate => 0 });
  my @d = deliveries(200, 200);
  is(types(@d), 'charge.succeeded charge.succeeded', 'released: delivered twice');
  is($d[0]{event}{id}, $d[1]{event}{id}, 'the same event id both times');
  is($emulator->control(POST => '/_emulator/webhooks/resend', { event_id => $d[0]{event}{id} })->{status}, 200, 'resend');
  my $again = next_delivery(200);
  is($again->{event}{id}, $d[0]{event}{id}, 'the event comes once more');
  is($again->{body}, $d[0]{body}, 'with the same body, signed anew');
  is($emulator->control(POST => '/_emulator/webhooks/resend', { event_id => 'evt_nope' })->{status}, 404, 'an unknown event: 404');
  $emulator->control(POST => '/_emulator/webhooks', { delay_ms => 60000 });
  $emulator->post_form('/v1/charges', [amount => 950, currency => 'usd', customer => 'cus_h', source => 'tok_visa']);
  ok(!IO::Select->new($listener)->can_read(1), 'delay_ms 60000: the event is not sent within a second');
  is(webhooks_pending(), 1, '... it waits its minute');
  $emulator->reset;
  $emulator->control(POST => '/_emulator/webhooks', { delay_ms => 0 });
};

subtest 'refunds' => sub {
  my $intent = $emulator->post_form('/v1/payment_intents', intent_params(amount => 3000))->{json};
  deliveries(200, 200, 200);
  my $refund = $emulator->control(POST => '/_emulator/refunds', { id => $intent->{id}, amount => 1000 });
  is($refund->{status}, 200, 'a partial refund');
  is("$refund->{json}{amount} $refund->{json}{charge} $refund->{json}{payment_intent}", "1000 $intent->{latest_charge} $intent->{id}",
    'of the PaymentIntent\'s charge');
  my $event = next_delivery(200)->{event};
  is($event->{type}, 'charge.refunded', 'charge.refunded follows');
  is($event->{id}, $refund->{json}{event_id}, 'the event the refund names');
  is("$event->{data}{object}{amount_refunded} " . ($event->{data}{object}{refunded} ? 'full' : 'part'), '1000 part',
    'amount_refunded 1000, not fully refunded');
  $emulator->control(POST => '/_emulator/refunds', { id => $intent->{id} });
  $event = next_delivery(200)->{event};
  is("$event->{data}{object}{amount_refunded} " . ($event->{data}{object}{refunded} ? 'full' : 'part'), '3000 full',
    'the rest: fully refunded');
  is($emulator->control(POST => '/_emulator/refunds', { id => $intent->{id} })->{status}, 400, 'nothing left: 400');
  is($emulator->control(POST => '/_emulator/refunds', { id => 'pi_unknown' })->{status}, 404, 'an unknown object: 404');
  my $declined = $emulator->post_form('/v1/payment_intents', intent_params(payment_method => 'pm_card_chargeDeclined'));
  deliveries(200, 200, 200);
  is($emulator->control(POST => '/_emulator/refunds', { id => $declined->{json}{error}{payment_intent}{id} })->{status}, 400,
    'a declined PaymentIntent: 400');
};

subtest 'control API checks' => sub {
  for my $bad ({ url => 'https://example.com/hook' }, { url => 'http://' }, { retry_ms => 0 }, { duplicate => -1 },
               { hold => 'yes' }, { colour => 'red' }) {
    is($emulator->control(POST => '/_emulator/webhooks', $bad)->{status}, 400,
      'refused: ' . JSON::PP->new->canonical->encode($bad));
  }
  is($emulator->control(POST => '/_emulator/webhooks', { url => $hook_url, secret => '' })->{status}, 400,
    'a URL without a secret: refused');
  $emulator->reset;
  is_deeply($emulator->control(GET => '/_emulator/webhooks')->{json}{deliveries}, [], 'reset forgets deliveries');
  is($emulator->control(GET => '/_emulator/webhooks')->{json}{url}, $hook_url, '... and keeps the configuration');
};

subtest 'command line' => sub {
  my $binary = StripeEmulatorHarness::binary();
  my $err = qx{'$binary' --listen 127.0.0.1:0 --webhook-url $hook_url 2>&1};
  is($? >> 8, 2, '--webhook-url without --webhook-secret: exit 2');
  like($err, qr/--webhook-url and --webhook-secret go together/, '... saying so');
  $err = qx{'$binary' --listen 127.0.0.1:0 --webhook-url https://example.com --webhook-secret whsec_doNotEcho 2>&1};
  is($? >> 8, 2, 'an https:// webhook URL: exit 2');
  unlike($err, qr/whsec_doNotEcho/, 'the secret is never echoed');
};

$emulator->stop;
done_testing();
