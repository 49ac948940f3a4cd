# Stripe's idempotency layer: replay, parameter and endpoint mismatches,
# concurrent use, what is and is not saved, scoping and key pruning.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(sleep);
use StripeEmulatorHarness;

my $emulator = StripeEmulatorHarness->start;
sub intent_params { StripeEmulatorHarness::payment_intent_params(@_) }
sub post_intent {
  my ($key, %overrides) = @_;
  return $emulator->post_form('/v1/payment_intents', intent_params(%overrides), idempotency_key => $key);
}

subtest 'a replay returns the saved response byte for byte and creates nothing' => sub {
  my $first = post_intent('replay-1', 'metadata[b]' => '2', 'metadata[a]' => '1');
  is($first->{status}, 200, 'first: 200');
  is($first->{headers}{'idempotent-replayed'}, 'false', 'first: Idempotent-Replayed: false');
  my $created_before = $emulator->stats->{created};
  # The same parameters in another order are the same request.
  my $reordered = $emulator->post_form('/v1/payment_intents',
    [map { @$_ } reverse pairs(intent_params('metadata[b]' => '2', 'metadata[a]' => '1'))], idempotency_key => 'replay-1');
  is($reordered->{status}, 200, 'same parameters in another order: 200');
  is($reordered->{headers}{'idempotent-replayed'}, 'true', 'Idempotent-Replayed: true');
  is($reordered->{content}, $first->{content}, 'identical body');
  isnt($reordered->{headers}{'request-id'}, $first->{headers}{'request-id'}, 'a new Request-Id');
  my $third = post_intent('replay-1', 'metadata[b]' => '2', 'metadata[a]' => '1');
  is($third->{content}, $first->{content}, 'replayed again');
  is($emulator->stats->{created}, $created_before, 'nothing new created');
  is(scalar(grep { ($_->{idempotency_key} // '') eq 'replay-1' } @{ $emulator->ledger }), 1,
    'one ledger entry for the key');
  cmp_ok($emulator->stats->{replayed}, '>=', 2, 'stats count replays');
};

sub pairs { my @list = @{ $_[0] }; my @pairs; push @pairs, [splice @list, 0, 2] while @list; return @pairs }

subtest 'same key, different parameters or endpoint: idempotency_error, not saved' => sub {
  my $first = post_intent('mismatch-1', amount => 1000);
  is($first->{status}, 200, 'first: 200');
  my $conflicts_before = $emulator->stats->{idempotency_conflicts};

  my $other_amount = post_intent('mismatch-1', amount => 1001);
  is($other_amount->{status}, 400, 'different amount: 400');
  is($other_amount->{json}{error}{type}, 'idempotency_error', 'idempotency_error');
  like($other_amount->{json}{error}{message},
    qr/^Keys for idempotent requests can only be used with the same parameters they were first used with\./,
    'Stripe message');
  like($other_amount->{json}{error}{message}, qr/'mismatch-1'/, 'names the key');

  my $extra_param = post_intent('mismatch-1', amount => 1000, description => 'extra');
  is($extra_param->{status}, 400, 'an extra parameter: 400');

  my $other_endpoint = $emulator->post_form('/v1/charges',
    [amount => 1000, currency => 'usd', customer => 'cus_harness'], idempotency_key => 'mismatch-1');
  is($other_endpoint->{status}, 400, 'different endpoint: 400');
  is($other_endpoint->{json}{error}{type}, 'idempotency_error', 'different endpoint: idempotency_error');
  like($other_endpoint->{json}{error}{message}, qr{POST /v1/payment_intents}, 'names the first endpoint');

  my $original = post_intent('mismatch-1', amount => 1000);
  is($original->{headers}{'idempotent-replayed'}, 'true', 'the original request still replays');
  is($original->{content}, $first->{content}, 'with the original body');
  is($emulator->stats->{idempotency_conflicts} - $conflicts_before, 3, 'stats count the conflicts');
};

subtest 'a validation failure is not saved; fixed parameters then succeed' => sub {
  my $invalid = post_intent('validation-1', amount => 10);
  is($invalid->{status}, 400, 'amount below minimum: 400');
  is($invalid->{json}{error}{type}, 'invalid_request_error', 'invalid_request_error');
  my $again = post_intent('validation-1', amount => 10);
  is($again->{headers}{'idempotent-replayed'}, 'false', 'the 400 is not replayed');
  my $fixed = post_intent('validation-1', amount => 1000);
  is($fixed->{status}, 200, 'fixed parameters with the same key: 200');
  is($fixed->{headers}{'idempotent-replayed'}, 'false', 'executed, not replayed');
  is($fixed->{json}{status}, 'succeeded', 'succeeded');
  is(post_intent('validation-1', amount => 1000)->{content}, $fixed->{content}, 'now saved and replayed');
};

subtest 'a 402 decline is saved and replayed' => sub {
  my $declined = post_intent('decline-1', payment_method => 'pm_card_chargeDeclined');
  is($declined->{status}, 402, 'first: 402');
  my $created = $emulator->stats->{created};
  my $replay = post_intent('decline-1', payment_method => 'pm_card_chargeDeclined');
  is($replay->{status}, 402, 'replay: 402');
  is($replay->{headers}{'idempotent-replayed'}, 'true', 'Idempotent-Replayed: true');
  is($replay->{content}, $declined->{content}, 'identical body');
  is($emulator->stats->{created}, $created, 'nothing new created');
};

subtest 'keys are scoped per API key' => sub {
  my $first = post_intent('scoped-1');
  my $other_account = $emulator->post_form('/v1/payment_intents', intent_params(),
    idempotency_key => 'scoped-1', api_key => 'sk_test_anotherAccountsKey000000');
  is($other_account->{status}, 200, 'another API key: 200');
  is($other_account->{headers}{'idempotent-replayed'}, 'false', 'not a replay');
  isnt($other_account->{json}{id}, $first->{json}{id}, 'a different object');
};

subtest 'keys only matter on POST' => sub {
  my $id = post_intent('get-key-1')->{json}{id};
  my $get = $emulator->get("/v1/payment_intents/$id", undef, idempotency_key => 'get-key-1');
  is($get->{status}, 200, 'GET with a used key: 200');
  ok(!exists $get->{headers}{'idempotent-replayed'}, 'no replay header on GET');
};

subtest 'unusable keys' => sub {
  my $long = post_intent('k' x 256);
  is($long->{status}, 400, 'a 256-character key: 400');
  is(post_intent('k' x 255)->{status}, 200, 'a 255-character key: 200');
};

subtest 'same key while the first request is executing: one 409' => sub {
  $emulator->configure(latency_ms => 600);
  my $in_use_before = $emulator->stats->{in_use_conflicts};
  my $body = StripeEmulatorHarness::form_encode(intent_params());
  my $first_socket = $emulator->connect_raw;
  my $second_socket = $emulator->connect_raw;
  $emulator->send_raw_request($first_socket, POST => '/v1/payment_intents', body => $body,
    idempotency_key => 'concurrent-1');
  sleep 0.2;    # the first is now sleeping in its latency, its key in flight
  $emulator->send_raw_request($second_socket, POST => '/v1/payment_intents', body => $body,
    idempotency_key => 'concurrent-1');
  my $first = StripeEmulatorHarness::read_response($first_socket, 10);
  my $second = StripeEmulatorHarness::read_response($second_socket, 10);
  $emulator->configure(latency_ms => 0);
  is($first->{status}, 200, 'first: 200');
  is($second->{status}, 409, 'concurrent duplicate: 409');
  is($second->{json}{error}{type}, 'idempotency_error', 'idempotency_error');
  is($second->{json}{error}{code}, 'idempotency_key_in_use', 'idempotency_key_in_use');
  is($emulator->stats->{in_use_conflicts} - $in_use_before, 1, 'stats count it');
  my $retry = post_intent('concurrent-1');
  is($retry->{headers}{'idempotent-replayed'}, 'true', 'a later retry replays');
  is($retry->{content}, $first->{body}, 'the first response (the 409 was not saved)');
  is(scalar(grep { ($_->{idempotency_key} // '') eq 'concurrent-1' } @{ $emulator->ledger }), 1,
    'created once');
};

$emulator->stop;

subtest 'pruned keys are new again: a second object (what billguard must prevent)' => sub {
  my $short_lived = StripeEmulatorHarness->start(args => ['--idempotency-ttl', '1']);
  my $params = intent_params();
  my $first = $short_lived->post_form('/v1/payment_intents', $params, idempotency_key => 'ttl-1');
  my $replay = $short_lived->post_form('/v1/payment_intents', $params, idempotency_key => 'ttl-1');
  is($replay->{headers}{'idempotent-replayed'}, 'true', 'within the TTL: replayed');
  sleep 2.2;
  my $after = $short_lived->post_form('/v1/payment_intents', $params, idempotency_key => 'ttl-1');
  is($after->{status}, 200, 'after the TTL: 200');
  is($after->{headers}{'idempotent-replayed'}, 'false', 'not a replay');
  isnt($after->{json}{id}, $first->{json}{id}, 'a second PaymentIntent');
  is(scalar @{ $short_lived->ledger }, 2, 'two charges in the ledger');

  # The TTL can change at run time.
  $short_lived->configure(idempotency_ttl => 3600);
  $short_lived->post_form('/v1/payment_intents', $params, idempotency_key => 'ttl-2');
  sleep 1.5;
  is($short_lived->post_form('/v1/payment_intents', $params, idempotency_key => 'ttl-2')->{headers}{'idempotent-replayed'},
    'true', 'a longer TTL set at run time keeps keys');
  $short_lived->stop;
};

done_testing;
