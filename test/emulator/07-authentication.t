# Bearer authentication, with and without --api-key; keys are never echoed.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use StripeEmulatorHarness;

my $right_key = 'sk_test_RightKeyForTheEmulator1234';
my $wrong_key = 'sk_test_WrongKeyNotAcceptedHere9876';
my $emulator = StripeEmulatorHarness->start(args => ['--api-key', $right_key]);
my $params = StripeEmulatorHarness::payment_intent_params();

subtest 'the configured key is accepted' => sub {
  my $response = $emulator->post_form('/v1/payment_intents', $params, api_key => $right_key);
  is($response->{status}, 200, 'HTTP 200');
};

subtest 'another key: 401 that masks the key' => sub {
  my $response = $emulator->post_form('/v1/payment_intents', $params, api_key => $wrong_key,
    idempotency_key => 'auth-1');
  is($response->{status}, 401, 'HTTP 401');
  is($response->{json}{error}{type}, 'invalid_request_error', 'invalid_request_error');
  is($response->{json}{error}{message}, 'Invalid API Key provided: sk_test_****9876', 'masked: first 8, last 4');
  unlike($response->{content}, qr/\Q$wrong_key\E/, 'the body does not contain the key');
  unlike($response->{content}, qr/WrongKey/, 'nor its middle');
  like($response->{headers}{'request-id'}, qr/^req_/, 'Request-Id on errors too');
  is(scalar @{ $emulator->ledger }, 1, 'nothing created');
  my $right = $emulator->post_form('/v1/payment_intents', $params, api_key => $right_key, idempotency_key => 'auth-1');
  is($right->{headers}{'idempotent-replayed'}, 'false', 'the 401 was not saved for the key');
};

subtest 'a short wrong key is not revealed either' => sub {
  my $response = $emulator->get('/v1/payment_intents', undef, api_key => 'sk_short');
  is($response->{status}, 401, 'HTTP 401');
  unlike($response->{content}, qr/sk_short/, 'the body does not contain the key');
};

subtest 'missing or malformed Authorization: 401' => sub {
  my $missing = $emulator->get('/v1/payment_intents', undef, api_key => undef);
  is($missing->{status}, 401, 'no header: 401');
  like($missing->{json}{error}{message}, qr/You did not provide an API key/, 'explains');
  is($emulator->request(GET => '/v1/payment_intents', undef, api_key => undef,
    headers => {Authorization => 'Bearer '})->{status}, 401, 'empty bearer: 401');
  is($emulator->request(GET => '/v1/payment_intents', undef, api_key => undef,
    headers => {Authorization => "Basic c2tfdGVzdDo="})->{status}, 401, 'Basic auth: 401');
  is($emulator->request(GET => '/v1/payment_intents', undef, api_key => undef,
    headers => {Authorization => "bearer $right_key"})->{status}, 200, 'the scheme is case-insensitive');
};

subtest 'the control API needs no key' => sub {
  is($emulator->control(GET => '/_emulator/stats')->{status}, 200, 'stats: 200');
};

$emulator->stop;

subtest 'without --api-key any non-empty key works' => sub {
  my $open = StripeEmulatorHarness->start;
  is($open->get('/v1/payment_intents', undef, api_key => 'sk_test_anything')->{status}, 200, 'any key: 200');
  is($open->get('/v1/payment_intents', undef, api_key => undef)->{status}, 401, 'no key: 401');
  $open->stop;
};

done_testing;
